"""The documentation's pages work as written, as the README does (``test_readme.py``).

* Every ```python block of the pages in :data:`RUN` runs unchanged, as its own process,
  in an empty directory, and leaves its checkpoints where ``cairn`` looks by default
  (torch blocks only where torch is installed).
* Each guide (:data:`GUIDES`) is walked from its start to its end in one fresh
  directory, as a reader follows it: a ```python block after a ``<!-- file: NAME -->``
  line is saved as ``NAME``, any other runs; each line of a ```bash block runs (``python``
  and ``cairn`` as this interpreter runs them) and must end with the exit status its
  comment gives (``exit status N``), else 0; each line of a ```text block after a bash
  block must be printed by that block's commands (a checkpoint id in it stands for any).
* Every page with Python blocks is in exactly one of :data:`RUN`, :data:`GUIDES`,
  :data:`RUN_ELSEWHERE` and :data:`FRAGMENTS` (blocks that need names defined
  elsewhere), so that a new page cannot go untested unnoticed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cairn
from support.paths import REPO

DOCS = REPO / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FILE_MARKER = re.compile(r"^<!-- file: ([\w.-]+) -->$", re.MULTILINE)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
EXIT_STATUS = re.compile(r"exit status (\d+)")

RUN = [
    "PYPI.md",
    "docs/quickstart.md",
    "docs/python.md",
    "docs/signing.md",
    "docs/pytorch.md",
]
"""Pages whose Python blocks each run as written in an empty directory."""

GUIDES = ["docs/guides/streaming-job.md", "docs/guides/many-workers.md"]
"""Pages walked from start to end in one directory."""

FRAGMENTS = [
    "docs/clouds.md",  # stores on an S3 bucket of yours
    "docs/format.md",  # a reader's check of a manifest's checksum, in another program
    "docs/performance.md",  # a setting, on S3, in a training loop's `step`
    "docs/rescaling.md",  # parts of a keyed job: `ckpt`, `states` and `encode` are yours
    "docs/safetensors.md",  # on S3 buckets of yours (tests/dcp/test_export_hf.py runs the calls)
    "docs/ray.md",  # on an S3 bucket of yours (examples/ray_wordcount.py, tested, is this job)
]
"""Pages whose Python blocks are parts of a program, not programs."""

RUN_ELSEWHERE = {
    # each block with the framework it needs (Lightning, transformers), on local and S3
    "docs/training.md": "tests/integrations/test_training_docs.py",
}
"""Pages whose Python blocks another test module runs, and that module."""


def fenced(path: Path) -> list[tuple[str, str]]:
    """The language and body of each fenced block of a page, in order."""
    return FENCE.findall(path.read_text(encoding="utf-8"))


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "AWS_"))}


def needs_missing_torch(block: str) -> bool:
    return "import torch" in block and importlib.util.find_spec("torch") is None


def test_every_page_with_python_is_run_walked_or_a_fragment() -> None:
    pages = [*sorted(DOCS.rglob("*.md")), REPO / "PYPI.md"]
    with_python = {
        str(page.relative_to(REPO))
        for page in pages
        if any(language == "python" for language, _ in fenced(page))
    }
    listed = [*RUN, *GUIDES, *FRAGMENTS, *RUN_ELSEWHERE]
    assert len(listed) == len(set(listed)), "a page is listed twice"
    for page, module in RUN_ELSEWHERE.items():
        assert page in (REPO / module).read_text(encoding="utf-8"), (page, module)
    assert with_python == set(listed)


BLOCKS = [
    pytest.param(body, id=f"{Path(page).stem}-{i}")
    for page in RUN
    for i, body in enumerate(b for lang, b in fenced(REPO / page) if lang == "python")
]


@pytest.mark.parametrize("block", BLOCKS)
def test_every_python_block_runs_as_written(block: str, tmp_path: Path) -> None:
    if needs_missing_torch(block):
        pytest.skip("needs the torch extra")
    run_python(block, tmp_path)
    listed = cairn("list", "--json", cwd=tmp_path)
    assert listed.code == 0 and listed.json()["count"] >= 1, listed.explain()


def steps(page: Path) -> list[tuple[str, str, str | None]]:
    """The guide's blocks in order: ``(language, body, file name or None)``."""
    text = page.read_text(encoding="utf-8")
    markers = [(m.end(), m.group(1)) for m in FILE_MARKER.finditer(text)]
    found = []
    for match in FENCE.finditer(text):
        language, body = match.group(1), match.group(2)
        name = None
        if language == "python":
            before = [m for m in markers if m[0] <= match.start()]
            if before and not FENCE.search(text, before[-1][0], match.start()):
                name = before[-1][1]
        found.append((language, body, name))
    return found


def command(line: str) -> tuple[list[str], int]:
    """A shell line of a guide as this interpreter runs it, and its exit status."""
    words = shlex.split(line, comments=True)
    comment = line.partition("#")[2]
    status = EXIT_STATUS.search(comment)
    if words[0] == "python":
        words = [sys.executable, *words[1:]]
    elif words[0] == "cairn":
        words = [sys.executable, "-m", "cairn.cli", *words[1:]]
    else:
        raise AssertionError(f"a guide runs python and cairn only: {line!r}")
    return words, int(status.group(1)) if status else 0


def run_line(line: str, cwd: Path) -> str:
    args, expected = command(line)
    proc = subprocess.run(
        args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=300, check=False
    )
    status = 128 - proc.returncode if proc.returncode < 0 else proc.returncode
    assert status == expected, f"{line}\n-> {status}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("guide", GUIDES)
def test_every_guide_works_from_start_to_end(guide: str, tmp_path: Path) -> None:
    blocks = steps(REPO / guide)
    assert any(name for _, _, name in blocks), "the guide's program is not marked as a file"
    assert any(language == "bash" for language, _, _ in blocks), "nothing of the guide runs"
    printed: str | None = None
    for language, body, name in blocks:
        if language == "python" and name is not None:
            (tmp_path / name).write_text(body, encoding="utf-8")
        elif language == "python":
            printed = run_python(body, tmp_path)
        elif language == "bash":
            lines = [line for line in body.splitlines() if shlex.split(line, comments=True)]
            printed = "".join(run_line(line, tmp_path) for line in lines)
        elif language == "text":
            assert printed is not None, "a text block before anything ran"
            for expected in body.splitlines():
                pattern = UUID.sub("[0-9a-f-]{36}", re.escape(expected).replace(r"\-", "-"))
                assert re.search(pattern, printed), f"{expected!r} not in\n{printed}"


def run_python(block: str, cwd: Path) -> str:
    """Run ``block`` in a fresh interpreter in ``cwd``; what it printed (it must succeed)."""
    proc = subprocess.run(
        [sys.executable, "-c", block],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{block}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout
