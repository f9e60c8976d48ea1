"""What a checkpointer tells about itself while it works: counters scoped to one call.

Invariant: a counter opened for a call (a save) counts what happens in that call and in
every task it starts, and nothing of any other call running beside it; closing it
restores whatever was counting before. (Context variables give exactly that scope:
tasks copy the context they are created in.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["RetryCounter", "counting_retries", "note_retry"]


@dataclass
class RetryCounter:
    """Store calls retried within one call."""

    count: int = 0


_current: ContextVar[RetryCounter | None] = ContextVar("cairn_retry_counter", default=None)


@contextlib.contextmanager
def counting_retries() -> Iterator[RetryCounter]:
    """Count the retries of this call and the tasks it starts, until the block ends."""
    counter = RetryCounter()
    token = _current.set(counter)
    try:
        yield counter
    finally:
        _current.reset(token)


def note_retry() -> None:
    """One store call is being retried (called by :class:`~cairn.retry.RetryPolicy`)."""
    counter = _current.get()
    if counter is not None:
        counter.count += 1
