#!/usr/bin/env bash
# The main job: save, list, load and verify checkpoints on a local directory store.
source "$(dirname "$0")/_venv.sh"
exec python examples/quickstart.py "$@"
