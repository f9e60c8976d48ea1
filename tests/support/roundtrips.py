"""Counting the sequential round trips of an operation, exactly, on any store.

What bounds a small checkpoint on an object store is the number of round trips it
waits for one after another. Measuring that with real delays gives a number that moves
with the machine's load; this module counts it exactly instead:

* the operation runs on a :class:`~support.sim.loop.SimLoop`, whose clock is virtual
  and moves only when every task waits (work sent to a thread runs inline, in no time);
* every call to the store goes through :class:`RoundTripStore`, which makes the real
  call on the wrapped store (memory, local, S3, GCS: each on a real event loop of its
  own, in another thread, while the simulated one waits), then lets :data:`LATENCY` of
  virtual time pass before its caller hears back.

So calls made concurrently overlap in virtual time, and calls made one after another
add up: the virtual time an operation takes, divided by :data:`LATENCY`, is the length
of its longest chain of store calls, each waiting for the one before. The count does
not depend on timing, on the machine or on the backend's speed. Each call is applied
to the wrapped store when it is made, in the order made, so the backend sees the
operation's calls in an order it could see them in for real.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cairn.format._buffer import Buffer
from cairn.stores import ForwardingStore, PutMode, Store
from cairn.stores._types import Metadata, OpenChunks, StoreCall, StoreMethod

from .sim.loop import Deadlock, SimLoop

__all__ = ["LATENCY", "Counted", "RoundTripStore", "simulate"]

T = TypeVar("T")

LATENCY = 1.0
"""Virtual seconds each store call takes."""

KIND = {
    "get": "get",
    "get_range": "get",
    "head": "head",
    "stat": "head",
    "put": "put",
    "put_stream": "put",
    "list": "list",
    "list_dir": "list",
    "delete": "delete",
    "delete_prefix": "delete",
}
"""The kind of request (as a store bills it) each store method makes."""


class _RealLoop:
    """A real event loop in a daemon thread, where the wrapped store's calls run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass
class Call:
    """One store call: when it was made (in round trips from the start), what it did."""

    at: float
    operation: StoreMethod
    path: str


@dataclass
class Counted:
    """What an operation made of the store: its calls, and how many rounds it waited."""

    calls: list[Call] = field(default_factory=list)
    round_trips: float = 0.0

    def requests(self) -> dict[str, int]:
        """The calls by kind of request (``put``, ``get``, ``head``, ``list``, ``delete``)."""
        return dict(collections.Counter(KIND[call.operation] for call in self.calls))

    def trace(self) -> str:
        """The calls, one a line, each with the round it was made in (for messages)."""
        return "\n".join(f"{c.at:4.1f} {c.operation} {c.path}" for c in self.calls)


class RoundTripStore(ForwardingStore):
    """Makes each call on ``inner`` at once, answers it :data:`LATENCY` later (virtual).

    Use it inside :func:`simulate`, which runs the simulated loop and the real one
    ``inner`` needs; :meth:`measure` counts what one operation does.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._real: _RealLoop | None = None
        self._loop: SimLoop | None = None
        self._open: list[tuple[float, Counted]] = []

    @contextlib.contextmanager
    def measure(self) -> Iterator[Counted]:
        """Count the calls made, and the round trips that pass, inside the block."""
        assert self._loop is not None, "measure inside simulate()"
        counted = Counted()
        started = (self._loop.time(), counted)
        self._open.append(started)
        try:
            yield counted
        finally:
            self._open.remove(started)
            counted.round_trips = (self._loop.time() - started[0]) / LATENCY

    async def _around(
        self, operation: StoreMethod, path: str, call: StoreCall[T], *, mode: PutMode | None = None
    ) -> T:
        assert self._real is not None and self._loop is not None, "call inside simulate()"
        now = self._loop.time()
        for since, counted in self._open:
            counted.calls.append(Call((now - since) / LATENCY, operation, path))
        outcome: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            outcome.set_result(self._real.run(_awaited(call)))
        except BaseException as exc:  # handed to the caller below, after the latency
            outcome.set_exception(exc)
        await asyncio.sleep(LATENCY)
        return outcome.result()

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
    ) -> None:
        # The chunks come from the simulated loop: read them there, send them as one.
        chunks = [bytes(chunk) async for chunk in open_chunks()]

        def reopen() -> AsyncIterator[Buffer]:
            return _iterate(chunks)

        await self._around(
            "put_stream",
            path,
            lambda: self.inner.put_stream(path, reopen, metadata=metadata),
            mode="overwrite",
        )


async def _awaited(call: Callable[[], Awaitable[T]]) -> T:
    return await call()


async def _iterate(chunks: list[bytes]) -> AsyncIterator[Buffer]:
    for chunk in chunks:
        yield chunk


def simulate(store: RoundTripStore, scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario()`` on a simulated loop, its store calls going through ``store``.

    Everything the scenario does with cairn (its checkpointers included) must happen
    inside it: asyncio objects belong to one loop. Tasks still running when it returns
    are cancelled.
    """
    loop: SimLoop

    def idle(timeout: float | None) -> None:
        if timeout is None:
            raise Deadlock("every task waits and nothing can wake one")
        loop.advance(timeout)

    loop = SimLoop(idle)
    real = _RealLoop()
    store._real, store._loop = real, loop
    try:
        result = loop.run_until_complete(scenario())
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        return result
    finally:
        store._real = store._loop = None
        loop.close()
        real.close()
