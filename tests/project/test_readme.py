"""The README works as written: its Python blocks run, its ``cairn`` commands succeed.

Every ```python block runs unchanged, as its own process, in an empty directory (the
README says so). Every ``cairn`` line of the ```bash blocks runs, in README order, in one
temporary directory, as a real process: each must exit 0. ``ID`` is the one placeholder
allowed; it stands for the newest checkpoint's id. The other shell lines (the set-up
scripts, activating the virtualenv) are listed here, so a new command cannot be skipped
silently. Every link of the README leads to a file of the repository, and to a heading
of it where it names one. The pages the README's longer sections moved to are run the
same way by ``test_doc_pages.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cairn
from support.paths import REPO

ROOT = REPO
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
NOT_CAIRN = {
    "bash scripts/demo.sh",
    "bash scripts/test.sh",
    "source .venv/bin/activate",
}


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README) if lang == language]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "AWS_"))}


PYTHON = blocks("python")


def test_the_readme_has_its_blocks() -> None:
    assert len(PYTHON) >= 3, "the Python examples are gone"
    [setup, *_] = blocks("bash")
    commands = [shlex.split(line, comments=True) for line in setup.splitlines()]
    assert [" ".join(c) for c in commands if c] == ["bash scripts/demo.sh", "bash scripts/test.sh"]


@pytest.mark.parametrize("block", PYTHON, ids=[f"python-{i}" for i in range(len(PYTHON))])
def test_every_python_block_runs_as_written(block: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{block}\n{proc.stdout}\n{proc.stderr}"
    # The examples keep their checkpoints where `cairn` looks by default.
    listed = cairn("list", "--json", cwd=tmp_path)
    assert listed.code == 0 and listed.json()["count"] >= 1, listed.explain()


def test_every_cairn_command_of_the_readme_runs(tmp_path: Path) -> None:
    lines = [
        " ".join(words)
        for block in blocks("bash")
        for line in block.splitlines()
        if (words := shlex.split(line, comments=True))
    ]
    assert {line for line in lines if not line.startswith("cairn ")} == NOT_CAIRN
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("cairn ")]
    assert {c[0] for c in commands} >= {
        "demo",
        "list",
        "show",
        "verify",
        "restore",
        "copy",
        "gc",
        "delete",
    }
    for args in commands:
        if "ID" in args:
            latest = cairn("list", "--json", cwd=tmp_path).json()["latest"]
            args = [latest if a == "ID" else a for a in args]
        run = cairn(*args, cwd=tmp_path)
        assert run.code == 0, run.explain()
    assert (tmp_path / "restored").is_dir() and (tmp_path / "backup").is_dir()
    backup = cairn("verify", "--all", "--store", "backup", "--json", cwd=tmp_path)
    assert backup.code == 0 and backup.json()["ok"] is True, backup.explain()


def test_load_documents_what_artifacts_are() -> None:
    page = (ROOT / "docs" / "python.md").read_text()
    where = page.index("## Save and load")
    section = page[where : page.index("## Incremental checkpoints")]
    for needle in ("obstore's `Bytes`", "not a copy", "buffer protocol", "`bytes(x)`"):
        assert needle in section, needle


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub and the documentation site make it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)}


def test_every_link_of_the_readme_leads_somewhere() -> None:
    links = [link for link in LINK.findall(README) if not link.startswith("https://")]
    assert len(links) >= 20, "the README links to the documentation"
    for link in links:
        target, _, anchor = link.partition("#")
        path = ROOT / target if target else ROOT / "README.md"
        assert path.is_file(), f"{link}: no such file"
        if anchor:
            assert anchor in anchors(path), f"{link}: no such heading"
