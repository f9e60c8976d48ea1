"""The set-up scripts install what their job needs, say so, and only once.

``scripts/demo.sh`` installs cairn and its runtime dependencies only (no test or lint
tools, no npm); ``scripts/test.sh`` and ``scripts/lint.sh`` install the development
extra; each installs again only when ``pyproject.toml`` changes, and a development
install satisfies the demo. The scripts run for real, in a copy of the repository's
scripts, with ``python``, ``pip``, ``npm`` and ``cairn`` replaced by stubs that record
how they were called (no network, no install).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from support.paths import REPO

ROOT = REPO

STUB_PYTHON = """#!/usr/bin/env bash
# A python that makes stub virtualenvs: its own bin/python logs every call.
echo "python $*" >> "$STUB_LOG"
if [ "$1 $2" = "-m pip" ]; then echo "Collecting something (pip's progress, on stdout)"; fi
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  cp "$0" "$3/bin/python"
  for tool in cairn ruff mypy mkdocs; do
    printf '#!/usr/bin/env bash\\necho "%s $*" >> "$STUB_LOG"\\n' "$tool" > "$3/bin/$tool"
    chmod +x "$3/bin/$tool"
  done
fi
"""


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    for name in ("pyproject.toml", "package-lock.json"):
        shutil.copy(ROOT / name, repo / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("python3", STUB_PYTHON),
        ("npm", '#!/usr/bin/env bash\necho "npm $*" >> "$STUB_LOG"\nmkdir -p node_modules\n'),
    ):
        path = bin_dir / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return repo


def run(repo: Path, script: str, *args: str) -> tuple[str, list[str]]:
    log = repo.parent / "calls.log"
    log.write_text("")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "VIRTUAL_ENV"))},
        "PATH": f"{repo.parent / 'bin'}:/usr/bin:/bin",
        "STUB_LOG": str(log),
    }
    env.pop("PYTHON", None)
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "", "only the command's own output goes to stdout (--json)"
    return proc.stderr, log.read_text().splitlines()


def installs(calls: list[str]) -> list[str]:
    return [c for c in calls if " -m pip " in f" {c} " and " install " in f" {c} "]


def test_the_demo_installs_only_what_it_needs_and_says_so(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    said, calls = run(repo, "demo.sh", "--events", "5")
    [install] = installs(calls)
    assert install.endswith("install --progress-bar on -c scripts/constraints.txt -e ."), install
    assert not any("npm" in c for c in calls)
    assert calls[-1] == "cairn demo --events 5"
    assert "cairn: creating" in said and "runtime dependencies" in said and "ready in" in said
    assert "Collecting something" in said, "pip's progress is shown, on stderr"
    assert (repo / ".venv" / ".cairn-runtime-installed").is_file()
    assert not (repo / ".venv" / ".cairn-installed").exists()

    said, calls = run(repo, "demo.sh")
    assert installs(calls) == [] and said == "", "installed twice"

    said, calls = run(repo, "test.sh", "-q")
    assert any(c.endswith("on -c scripts/constraints.txt -e .[dev]") for c in installs(calls))
    assert "npm ci --no-audit --no-fund --loglevel=error" in calls
    assert calls[-1] == "python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q"
    said, calls = run(repo, "demo.sh")
    assert installs(calls) == [], "a development install serves the demo"

    with (repo / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n# changed\n")
    said, calls = run(repo, "demo.sh")
    [again] = [c.split("install ", 1)[1] for c in installs(calls)]
    assert again == "--progress-bar on -c scripts/constraints.txt -e ."
    said, calls = run(repo, "lint.sh")
    assert any(c.endswith("-e .[dev]") for c in installs(calls)), "lint needs the dev tools"
    assert calls[-3:] == ["ruff check .", "ruff format --check src", "mypy "]


def test_the_docs_build_installs_the_docs_extra_once_and_fails_on_warnings(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path)
    said, calls = run(repo, "docs.sh")
    assert [c.split("install ", 1)[1] for c in installs(calls)] == [
        "--progress-bar on -c scripts/constraints.txt -e .",
        "--quiet -c scripts/constraints.txt -e .[docs]",
    ]
    assert calls[-1] == "mkdocs build --strict"
    assert "documentation tools" in said
    said, calls = run(repo, "docs.sh", "--site-dir", "out")
    assert installs(calls) == [], "installed twice"
    assert calls[-1] == "mkdocs build --strict --site-dir out"


def test_ci_builds_the_docs_after_the_static_checks() -> None:
    lines = (ROOT / ".ci/run").read_text().splitlines()
    steps = [line for line in lines if line.startswith("bash ")]
    assert steps == [
        "bash scripts/test.sh -p no:cacheprovider",
        "bash scripts/lint.sh",
        "bash scripts/docs.sh",
    ]
