"""Packaging metadata: the license file matches the declared license, the classifiers
say what cairn runs on, and every runtime dependency whose next major release (or, before
1.0, next minor) may break cairn has an upper bound."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_file_is_the_declared_license() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # PEP 639: with a license expression, no License :: classifier may be given.
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


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
