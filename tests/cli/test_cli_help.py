"""``cairn --help`` as a newcomer reads it, from real subprocesses.

Flags show no value placeholder (typer 0.29 prints ``--json <bool>`` unless told
otherwise), options name what they take, usage lines name each argument once, command
descriptions have no stray line breaks, and ``cairn --help`` lists every exit code. The
typer version must be inside the range ``pyproject.toml`` pins, the range these checks
were made on.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

from support.cli import Run, cairn_many
from support.paths import REPO

from cairn.cli.errors import ExitCode

ROOT = REPO
COMMANDS = (
    "list",
    "history",
    "show",
    "verify",
    "restore",
    "delete",
    "gc",
    "copy",
    "demo",
    "export-dcp",
    "import-dcp",
    "export-hf",
    "import-hf",
)
WIDE = {"COLUMNS": "200"}


def helps() -> dict[str, Run]:
    runs = cairn_many([["--help"], *[[c, "--help"] for c in COMMANDS]], env=WIDE)
    for run in runs:
        assert run.code == 0 and run.stderr == "", run.explain()
    return dict(zip(("cairn", *COMMANDS), runs, strict=True))


def test_help_shows_flags_and_arguments_plainly() -> None:
    pages = helps()
    for name, run in pages.items():
        # No Python type in angle brackets: not for flags, options or arguments.
        assert not re.search(r"<(bool|str|int|float|list\[str\]|path)[^>]*>", run.stdout), (
            name,
            run.stdout,
        )
        flags = ["--help"] if name == "cairn" else ["--json", "--debug", "--help"]
        flags += {
            "verify": ["--all"],
            "copy": ["--all"],
            "show": ["--partitions"],
            "history": ["--cost"],
            "restore": ["--overwrite"],
            "delete": ["--force"],
            "gc": ["--dry-run"],
        }.get(name, [])
        for flag in flags:
            line = next(
                (ln for ln in run.stdout.splitlines() if re.match(rf"│\s+{flag}\s", ln)), ""
            )
            assert re.match(rf"│\s+{flag}\s+(-h\s+)?[A-Z][a-z]", line), (name, flag, run.stdout)
    usage = {
        name: run.stdout.split("Usage: ", 1)[1].splitlines()[0].strip()
        for name, run in pages.items()
    }
    assert usage["verify"] == "cairn verify [OPTIONS] [ID|latest]..."
    assert usage["copy"] == "cairn copy [OPTIONS] [ID|latest]..."
    assert usage["show"] == "cairn show [OPTIONS] ID|latest"
    assert usage["restore"] == "cairn restore [OPTIONS] ID|latest"
    assert usage["export-dcp"] == "cairn export-dcp [OPTIONS] ID|latest|NAME"
    assert usage["import-dcp"] == "cairn import-dcp [OPTIONS] DIR"
    assert usage["export-hf"] == "cairn export-hf [OPTIONS] ID|latest|NAME"
    assert usage["import-hf"] == "cairn import-hf [OPTIONS] DIR_OR_URL"
    assert usage["delete"] == "cairn delete [OPTIONS] ID|latest"
    assert usage["list"] == "cairn list [OPTIONS]"
    assert re.search(r"--store\s+URL\s", pages["list"].stdout)
    assert re.search(r"--prefix\s+PREFIX\s", pages["list"].stdout)
    assert re.search(r"--keep-last\s+N\s", pages["gc"].stdout)
    assert re.search(r"--price\s+KEY=USD,\.\.\.\s", pages["history"].stdout)
    assert "USD per 1,000 requests" in pages["history"].stdout
    assert "[default: ./checkpoints]" in pages["list"].stdout  # not eaten as markup
    assert "[default: 1h]" in pages["gc"].stdout


def test_descriptions_have_no_stray_line_breaks_and_exit_codes_are_listed() -> None:
    pages = helps()
    root = pages["cairn"].stdout
    for command in COMMANDS:
        rows = [ln for ln in root.splitlines() if re.match(rf"^│ {command}\s", ln)]
        assert len(rows) == 1, (command, root)
        following = root.splitlines()[root.splitlines().index(rows[0]) + 1]
        assert not re.match(r"^│\s{5,}\S", following), f"{command}'s description wraps: {root}"
    demo = pages["demo"].stdout
    assert "restart it, prove exactly-once" in demo and "fresh prefix of the store" in demo
    codes = root[root.index("Exit codes:") :]
    for code in ExitCode:
        assert re.search(rf"^\s*{int(code)}\s+\S", codes, re.MULTILINE), (code, root)
    assert "130  interrupted (Ctrl-C)" in codes


def test_typer_is_inside_the_pinned_range() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [spec] = [d for d in pyproject["project"]["dependencies"] if d.startswith("typer")]
    assert ">=0.29" in spec and "<0.30" in spec, spec
    version = importlib.metadata.version("typer")
    assert version.startswith("0.29."), f"typer {version} is outside {spec}"
