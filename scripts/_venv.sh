# Sourced by the other scripts: makes .venv with cairn and its test tools, once per
# change of pyproject.toml, and Azurite (npm) when asked with CAIRN_NEED_NODE=1.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
venv="$root/.venv"
stamp="$venv/.cairn-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setting up $venv ..." >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
  echo "$want" > "$stamp"
fi
if [ "${CAIRN_NEED_NODE:-0}" = 1 ]; then
  node_want=$(sha256sum package-lock.json | cut -d' ' -f1)
  if [ "$(cat node_modules/.cairn-installed 2>/dev/null)" != "$node_want" ]; then
    echo "installing Azurite (npm ci) ..." >&2
    npm ci --no-audit --no-fund --loglevel=error
    echo "$node_want" > node_modules/.cairn-installed
  fi
fi
export PATH="$venv/bin:$PATH"
