"""Files and directories that not even root may change: ``chattr +i``, for tests.

The tests run as root, whom file modes do not stop; an immutable file cannot be deleted
or written, and an immutable directory gains and loses no entry, whoever asks. A test
that needs one is skipped where ``chattr`` is missing or the file system has no such
attribute.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` made immutable for the block (then mutable again, so it can be removed)."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr here")
    made = subprocess.run([chattr, "+i", str(path)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {made.stderr!r}")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)
