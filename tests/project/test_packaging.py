"""Packaging metadata: the distribution's name, its long description, the license as
old and new metadata readers see it, the classifiers, upper bounds on dependencies, the
supported torch range and the one CI installs, and ``pip install`` hints that name the
distribution. The documentation's examples run as written."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.paths import REPO

ROOT = REPO
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST = "cairn-checkpoint"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_distribution_is_cairn_checkpoint_and_installs_cairn() -> None:
    # PyPI's "cairn" is another project: the distribution has its own name, the import
    # package and the command stay "cairn".
    assert PROJECT["name"] == DIST
    assert PROJECT["scripts"] == {"cairn": "cairn.cli:main"}
    assert PROJECT["optional-dependencies"]["dev"][0] == f"{DIST}[test,metrics,torch]"


def test_the_long_description_speaks_to_someone_who_installed_the_wheel() -> None:
    assert PROJECT["readme"] == "PYPI.md"
    text = (ROOT / "PYPI.md").read_text()
    assert f"pip install {DIST}" in text and "cairn demo" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    assert "scripts/" not in text, "a wheel has no scripts/ folder"


def test_the_license_reads_for_old_and_new_metadata_readers() -> None:
    # A PEP 639 expression (License-Expression) is invisible to `pip show` of pip 23,
    # and PyPI refuses metadata with both fields: the License field plus the classifier.
    assert PROJECT["license"] == {"text": "Apache-2.0"}
    assert PROJECT["license-files"] == ["LICENSE"]
    assert "License :: OSI Approved :: Apache Software License" in PROJECT["classifiers"]
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_classifiers_and_python_versions_agree() -> None:
    classifiers = PROJECT["classifiers"]
    assert PROJECT["requires-python"] == ">=3.11"
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers and (ROOT / "src/cairn/py.typed").exists()
    assert any(c.startswith("Development Status ::") for c in classifiers)


def test_runtime_dependencies_have_upper_bounds() -> None:
    for requirement in PROJECT["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert name is not None
        if name.group(0) == "typing-extensions":
            continue  # a backport that only adds
        assert "<" in requirement, f"{requirement} has no upper bound"
    assert "zstandard>=0.22,<1" in PROJECT["optional-dependencies"]["zstd"]


def test_the_torch_extra_is_a_tested_range_and_ci_installs_one_version_of_it() -> None:
    [torch] = [r for r in PROJECT["optional-dependencies"]["torch"] if r.startswith("torch")]
    assert torch == "torch>=2.9,<2.16"
    pins = [
        line
        for line in (ROOT / "scripts/constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert pins == ["torch==2.13.0"]
    assert "-c scripts/constraints.txt" in (ROOT / "scripts/_venv.sh").read_text()


def test_install_hints_name_the_distribution() -> None:
    hint = re.compile(r"pip install '?([A-Za-z0-9_.-]+)\[")
    files = [
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "examples").glob("*.py"),
        ROOT / "README.md",
        ROOT / "PYPI.md",
        ROOT / "ARCHITECTURE.md",
    ]
    found = {(path.name, m.group(1)) for path in files for m in hint.finditer(path.read_text())}
    assert found, "no install hint found"
    # '.': installing from cairn's own directory (a clone), which needs no published name.
    assert {name for _, name in found} - {"."} == {DIST}, sorted(found)


def python_blocks(path: Path) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == "python"]


BLOCKS = [
    pytest.param(block, id=f"{path.stem}-{i}")
    for path in (ROOT / "PYPI.md", ROOT / "docs/quickstart.md")
    for i, block in enumerate(python_blocks(path))
]


@pytest.mark.parametrize("block", BLOCKS)
def test_the_documented_python_runs_as_written(block: str, tmp_path: Path) -> None:
    if "import torch" in block and importlib.util.find_spec("torch") is None:
        pytest.skip("needs the torch extra")
    proc = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{block}\n{proc.stdout}\n{proc.stderr}"
