#!/usr/bin/env bash
# The main job: `cairn demo`, a streaming job killed mid-run and recovered exactly-once,
# on a local directory store (./checkpoints unless --store says otherwise). Installs only
# what the demo needs (cairn and its runtime dependencies) on first use.
CAIRN_VENV=runtime
source "$(dirname "$0")/_venv.sh"
exec cairn demo "$@"
