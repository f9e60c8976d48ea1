"""Where the repository and the tests' stored data are, for tests in any directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root."""

DATA = REPO / "tests" / "data"
"""Stores written by earlier versions, and other fixed inputs of the tests."""


def run_demo(example: Path, timeout: float = 300) -> tuple[int, str, str]:
    """Run ``python example --demo`` to its end: its exit code, its standard output, and
    both outputs together (what an assertion shows when it fails)."""
    proc = subprocess.run(
        [sys.executable, str(example), "--demo"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout, f"{proc.stdout}\n{proc.stderr}"
