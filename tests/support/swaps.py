"""A symbolic link swapped in where a local write is about to land."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def link_before_rename(monkeypatch: pytest.MonkeyPatch, dest: Path, target: Path) -> None:
    """Make ``dest`` a link to directory ``target`` at the next ``os.rename``, just before
    it runs: after every check the code under test made of ``dest``."""
    real_rename = os.rename

    def swap_then_rename(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(os, "rename", real_rename)
        dest.symlink_to(target, target_is_directory=True)
        real_rename(*args, **kwargs)

    monkeypatch.setattr(os, "rename", swap_then_rename)
