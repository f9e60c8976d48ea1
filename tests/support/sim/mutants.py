"""Historical bugs, brought back on purpose: evidence that the simulator can fail.

Each mutant is a context manager that patches cairn's real code back to the way a hole
once was, for one run. A simulator that finds none of them proves nothing; the tests
(``tests/protocol/test_simulation.py``) state within how many schedules each is found.

* ``gc-ignores-leases``: GC sweeps an uncommitted directory by ``min_age`` alone, as it
  did before leases and claims: it neither honours a save's lease nor claims the id
  with a tombstone before sweeping, so a save slower than ``min_age`` loses its uploads
  and may commit over them;
* ``fixed-attempt-names``: every save attempt writes the same artifact names (the
  reference's fixed names), so a second writer of an explicit id replaces, or discards,
  what the first one committed;
* ``gc-local-clock``: GC judges leases, ``min_age`` and tombstone expiry by its own
  clock instead of the store's, so a GC whose clock runs days ahead expires a tombstone
  at once and lets a stalled save commit over the directory it swept.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

from cairn.protocol import _commit, _gcclaims, _gcplan, _save, retention

__all__ = ["MUTANTS", "mutated"]


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


@contextlib.contextmanager
def gc_ignores_leases() -> Iterator[None]:
    async def claim_nothing(store: Any, manifest_path: str) -> bool:
        return True

    with (
        _patched(_gcplan, "is_live", lambda info, intent, now: False),
        _patched(_gcclaims, "claim", claim_nothing),
    ):
        yield


@contextlib.contextmanager
def fixed_attempt_names() -> Iterator[None]:
    def fixed() -> str:
        return "0" * 12

    # Every name a save attempt writes: its artifacts (_save), and its commit's intent.
    with _patched(_save, "new_attempt", fixed), _patched(_commit, "new_attempt", fixed):
        yield


@contextlib.contextmanager
def gc_local_clock() -> Iterator[None]:
    async def local_now(store: Any, paths: Any) -> dt.datetime:
        return dt.datetime.fromtimestamp(time.time_ns() / 1e9, dt.UTC)

    with _patched(retention, "store_now", local_now), _patched(_gcclaims, "store_now", local_now):
        yield


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "gc-ignores-leases": gc_ignores_leases,
    "fixed-attempt-names": fixed_attempt_names,
    "gc-local-clock": gc_local_clock,
}


def mutated(name: str | None) -> contextlib.AbstractContextManager[None]:
    """The patch of mutant ``name`` (None: the code as it is)."""
    if name is None:
        return contextlib.nullcontext()
    return MUTANTS[name]()
