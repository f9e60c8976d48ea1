"""Where the repository and the tests' stored data are, for tests in any directory."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root."""

DATA = REPO / "tests" / "data"
"""Stores written by earlier versions, and other fixed inputs of the tests."""
