#!/usr/bin/env bash
# Static checks: ruff (lint and format) and mypy --strict.
CAIRN_VENV=dev
source "$(dirname "$0")/_venv.sh"
ruff check .
ruff format --check src
mypy
