"""Dispatch to observers, scoped to one call: who is watching, and which operation runs.

Invariants: what is set for a call (its observers, its operation, its retry and request
counters) reaches that call and every task it starts, and nothing of any other call
running beside it (context variables: tasks copy the context they are created in);
closing a scope restores what was there before; an observer that raises is logged, never
propagated. Every store request of a checkpointer passes
:class:`~cairn.stores._observed.ObservedStore`, beneath its retries, once per attempt:
that is where requests are counted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from cairn.errors import (
    FencedError,
    TransientStoreError,
)
from cairn.observe import Observer, Operation, StoreCall

if TYPE_CHECKING:
    from cairn.stores import StoreMethod

__all__ = [
    "REQUEST_KINDS",
    "RequestCounter",
    "RetryCounter",
    "counting_requests",
    "counting_retries",
    "fell_back",
    "note_request",
    "note_retry",
    "observed",
    "store_call",
    "watching",
]

log = logging.getLogger("cairn")
T = TypeVar("T")


@dataclass
class RetryCounter:
    """Store calls retried within one call."""

    count: int = 0


REQUEST_KINDS: dict[StoreMethod, str] = {
    "put": "put",
    "put_stream": "put",
    "get": "get",
    "get_range": "get",
    "head": "head",
    "stat": "head",
    "list": "list",
    "list_dir": "list",
    "delete": "delete",
    "delete_prefix": "delete",
}
"""The kind of request each store method makes, as :class:`RequestCounter` counts it."""


@dataclass
class RequestCounter:
    """Store requests made within one call, by kind (:data:`REQUEST_KINDS`).

    Each attempt the store saw counts, a retried one as often as it was tried. A call
    counts as one request of its kind, whatever the backend does beneath it: a
    multipart ``put_stream`` is one ``put``, a ``delete`` of many paths (a batch) and a
    ``delete_prefix`` one ``delete``, and the HTTP retries obstore makes inside one call
    are not seen.
    """

    put: int = 0
    get: int = 0
    head: int = 0
    list: int = 0
    delete: int = 0

    def add(self, other: RequestCounter) -> None:
        """Count ``other``'s requests here too."""
        self.put += other.put
        self.get += other.get
        self.head += other.head
        self.list += other.list
        self.delete += other.delete


_retries: ContextVar[RetryCounter | None] = ContextVar("cairn_retry_counter", default=None)
_requests: ContextVar[tuple[RequestCounter, ...]] = ContextVar("cairn_requests", default=())
_observers: ContextVar[tuple[Observer, ...]] = ContextVar("cairn_observers", default=())
_operation: ContextVar[Operation | None] = ContextVar("cairn_operation", default=None)


@contextlib.contextmanager
def counting_retries(counter: RetryCounter | None = None) -> Iterator[RetryCounter]:
    """Count the retries of this call and the tasks it starts, until the block ends,
    into ``counter`` (a new one by default: several blocks may add to one)."""
    counter = counter if counter is not None else RetryCounter()
    token = _retries.set(counter)
    try:
        yield counter
    finally:
        _retries.reset(token)


@contextlib.contextmanager
def counting_requests(counter: RequestCounter | None = None) -> Iterator[RequestCounter]:
    """Count the store requests of this call and the tasks it starts into ``counter`` (a
    new one by default: several blocks may add to one). A task started in the block
    (a lease's renewals) goes on counting into it after the block ends. Blocks nest:
    a request counts in every one open around it."""
    counter = counter if counter is not None else RequestCounter()
    open_ones = _requests.get()
    if any(each is counter for each in open_ones):  # one counter counts a request once
        yield counter
        return
    token = _requests.set((*open_ones, counter))
    try:
        yield counter
    finally:
        _requests.reset(token)


def note_request(method: StoreMethod) -> None:
    """One attempt of a store call is being made (called by
    :class:`~cairn.stores._observed.ObservedStore`)."""
    counters = _requests.get()
    if counters:
        kind = REQUEST_KINDS[method]
        for counter in counters:
            setattr(counter, kind, getattr(counter, kind) + 1)


def _notify(observers: Sequence[Observer], call: Callable[[Observer], None]) -> None:
    for observer in observers:
        try:
            call(observer)
        except Exception:
            log.exception("observer %r failed", observer)


def note_retry(error: TransientStoreError) -> None:
    """One store call is being retried after ``error`` (called by the retry policy)."""
    counter = _retries.get()
    if counter is not None:
        counter.count += 1
    observers = _observers.get()
    if observers:
        reason = f"status_{error.status}" if error.status is not None else "network"
        op = _operation.get()
        _notify(observers, lambda o: o.retried(op, error.operation, reason))


def fell_back(checkpoint_id: Any, error: BaseException) -> None:
    """``load_latest`` skipped ``checkpoint_id``."""
    observers = _observers.get()
    if observers:
        op = _operation.get()
        _notify(observers, lambda o: o.fell_back(op, checkpoint_id, error))


def store_call(
    observers: Sequence[Observer],
    operation: str,
    path: str,
    outcome: str,
    seconds: float,
    sent_bytes: int = 0,
) -> None:
    """One store request ended (called by the observing store wrapper)."""
    call = StoreCall(operation, path, outcome, seconds, sent_bytes)
    op = _operation.get()
    for observer in observers:  # the hottest hook: no closure per call
        try:
            observer.store_call(op, call)
        except Exception:
            log.exception("observer %r failed", observer)


def saves_in_flight(observers: Sequence[Observer], count: int) -> None:
    """The number of background saves in flight changed."""
    _notify(observers, lambda o: o.saves_in_flight(count))


@contextlib.contextmanager
def watching(observers: Sequence[Observer]) -> Iterator[None]:
    """Make ``observers`` those of every operation opened in this block (and its tasks)."""
    token = _observers.set(tuple(observers))
    try:
        yield
    finally:
        _observers.reset(token)


@contextlib.asynccontextmanager
async def observed(
    observers: Sequence[Observer] | None, name: str, **attributes: Any
) -> AsyncIterator[Operation]:
    """Run the block as operation ``name``, started and ended for ``observers``.

    ``observers`` None means those of the enclosing operation (a ``commit`` inside a
    ``save``). The operation's outcome comes from how the block ends; the block may set
    ``manifest``, ``gc`` and attributes on the yielded :class:`Operation`.
    """
    chosen = tuple(observers) if observers is not None else _observers.get()
    op = Operation(name, parent=_operation.get(), attributes={})
    if not chosen:
        yield op
        return
    for key, value in attributes.items():
        if key == "checkpoint_id":
            op.describe(value)
        else:
            op.describe(**{key: value})
    observers_token, operation_token = _observers.set(chosen), _operation.set(op)
    _notify(chosen, lambda o: o.started(op))
    try:
        yield op
    except BaseException as exc:
        op.error = exc
        op.outcome = "fenced" if isinstance(exc, FencedError) else "failed"
        raise
    else:
        if name in ("save", "commit"):
            op.outcome = "committed"
    finally:
        op.duration = time.perf_counter() - op.started
        if op.manifest is not None:
            op.describe(op.manifest.checkpoint_id, epoch=op.manifest.epoch)
            if "cairn.bytes" not in op.attributes:
                stats = op.manifest.stats
                op.describe(bytes=stats.uploaded_bytes if stats else op.manifest.total_size_bytes)
        _operation.reset(operation_token)
        _observers.reset(observers_token)
        _notify(chosen, lambda o: o.ended(op))
