#!/usr/bin/env bash
# The main job: `cairn demo`, a streaming job killed mid-run and recovered exactly-once,
# on a local directory store (./checkpoints unless --store says otherwise).
source "$(dirname "$0")/_venv.sh"
exec cairn demo "$@"
