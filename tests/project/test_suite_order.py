"""The modules the suite starts first (``RUN_FIRST`` in ``tests/conftest.py``) exist: a
renamed one would quietly go back to its place in the collection order."""

from __future__ import annotations

from conftest import RUN_FIRST
from support.paths import REPO


def test_every_module_run_first_exists() -> None:
    missing = [module for module in RUN_FIRST if not (REPO / "tests" / module).is_file()]
    assert not missing, f"RUN_FIRST names modules that are not there: {missing}"
