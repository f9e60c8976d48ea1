"""docs/training.md works as written: each ```python block runs, in an empty directory.

Each block runs unchanged as its own process; the store it names (a local directory)
must then hold committed checkpoints under the names the framework gave, as ``cairn
list`` shows them. A block whose framework is not installed is skipped, saying which.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import cairn
from support.paths import REPO

PAGE = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PYTHON = [body for lang, body in FENCE.findall(PAGE) if lang == "python"]

pytestmark = [
    pytest.mark.torch,
    pytest.mark.frameworks,
    pytest.mark.slow,
    pytest.mark.subprocess,
]

EXPECTED: dict[str, Callable[[list[str]], bool]] = {
    # the block's store, and what `cairn list` must show there (names, or a count)
    "lightning-run": lambda names: (
        "last.ckpt" in names and sum(n.startswith("epoch=") for n in names) == 2
    ),
    "async-run": lambda names: len(names) == 2 and "last.ckpt" in names,
    "hf-run": lambda names: names == ["checkpoint-4", "checkpoint-6"],
    "titan-run": lambda names: names == ["checkpoint/step-10"],
}


def _store_of(block: str) -> str:
    [store] = [s for s in EXPECTED if f'"{s}"' in block]
    return store


def _needs(block: str) -> list[str]:
    modules = ["torch"]
    if "lightning" in block:
        modules.append("lightning")
    if "transformers" in block:
        modules += ["transformers", "accelerate"]
    return modules


def test_the_page_has_a_block_per_framework() -> None:
    assert sorted(_store_of(block) for block in PYTHON) == sorted(EXPECTED)


@pytest.mark.parametrize("block", PYTHON, ids=[_store_of(b) for b in PYTHON])
def test_every_python_block_runs_as_written(block: str, tmp_path: Path) -> None:
    for module in _needs(block):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (its extra is not)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "AWS_"))}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, f"{block}\n{proc.stdout}\n{proc.stderr}"
    store = _store_of(block)
    listed = cairn("list", "--store", store, "--json", cwd=tmp_path)
    assert listed.code == 0, listed.explain()
    names = sorted(c["name"] for c in listed.json()["checkpoints"])
    assert EXPECTED[store](names), (store, names)
