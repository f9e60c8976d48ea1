# Sourced by the other scripts: makes .venv with what the caller needs, once per change of
# pyproject.toml, showing what it does. CAIRN_VENV=runtime (scripts/demo.sh) installs cairn
# and its runtime dependencies only; CAIRN_VENV=dev (the default: tests, lint) adds the
# test and lint tools. CAIRN_NEED_NODE=1 also installs Azurite (npm), for the tests;
# CAIRN_NEED_DOCS=1 the documentation tools (the docs extra), for scripts/docs.sh. Where
# pyproject.toml allows a range (torch), scripts/constraints.txt names the version installed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
venv="$root/.venv"
level=${CAIRN_VENV:-dev}
want=$(cat pyproject.toml scripts/constraints.txt | sha256sum | cut -d' ' -f1)
dev_stamp="$venv/.cairn-installed"        # the dev tools are installed (implies runtime)
runtime_stamp="$venv/.cairn-runtime-installed"
docs_stamp="$venv/.cairn-docs-installed"

say() { echo "cairn: $*" >&2; }
current() { [ -x "$venv/bin/python" ] && [ "$(cat "$1" 2>/dev/null)" = "$want" ]; }

case "$level" in
  runtime) ready() { current "$dev_stamp" || current "$runtime_stamp"; } ;;
  dev) ready() { current "$dev_stamp"; } ;;
  *) say "CAIRN_VENV must be runtime or dev, not '$level'"; exit 2 ;;
esac

if ! ready; then
  started=$SECONDS
  if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv (first run only) ..."
    "$python" -m venv "$venv"
  fi
  # pip reports its progress on stdout: sent to stderr, so `demo.sh --json` stays JSON.
  pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
  constraints=(-c scripts/constraints.txt)
  if [ "$level" = dev ]; then
    say "installing cairn with its test and lint tools into .venv ..."
    "${pip[@]}" install --quiet --upgrade pip >&2
    "${pip[@]}" install --progress-bar on "${constraints[@]}" -e ".[dev]" >&2
    echo "$want" > "$dev_stamp"
  else
    say "installing cairn and its runtime dependencies into .venv (the tests' tools come with scripts/test.sh) ..."
    "${pip[@]}" install --progress-bar on "${constraints[@]}" -e . >&2
  fi
  echo "$want" > "$runtime_stamp"
  say ".venv ready in $((SECONDS - started)) s"
fi
if [ "${CAIRN_NEED_DOCS:-0}" = 1 ] && ! current "$docs_stamp"; then
  say "installing the documentation tools (mkdocs-material, mkdocstrings) into .venv ..."
  "$venv/bin/python" -m pip --disable-pip-version-check --no-input install --quiet \
    -c scripts/constraints.txt -e ".[docs]" >&2
  echo "$want" > "$docs_stamp"
fi
if [ "${CAIRN_NEED_NODE:-0}" = 1 ]; then
  node_want=$(sha256sum package-lock.json | cut -d' ' -f1)
  if [ "$(cat node_modules/.cairn-installed 2>/dev/null)" != "$node_want" ]; then
    say "installing Azurite (npm ci) ..."
    npm ci --no-audit --no-fund --loglevel=error >&2
    echo "$node_want" > node_modules/.cairn-installed
  fi
fi
# An editable install leaves cairn's sources uncompiled, and where the environment sets
# PYTHONDONTWRITEBYTECODE every process would compile them again (about 0.25 s per
# `cairn` command): compile them once here. Only changed files are compiled again.
"$venv/bin/python" -m compileall -q src tests bench examples >&2
export PATH="$venv/bin:$PATH"
