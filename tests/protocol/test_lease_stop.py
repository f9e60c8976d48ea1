"""A stopped lease writes its intent no more: a renewal in flight is awaited, not dropped.

A store request that is cancelled may still be carried out (the HTTP request was sent; a
worker thread runs on). If stopping a lease only cancelled its renewal, the renewal
could land after the save deleted its intent and write the intent back, so a committed
or abandoned directory would look busy to GC for one more lease.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import TypeVar

from obstore.store import MemoryStore
from support.gates import GatedStore

from cairn.errors import CheckpointNotFoundError
from cairn.protocol._lease import Lease
from cairn.stores import ObstoreStore, PutMode, StoreMethod

T = TypeVar("T")
INTENT = "checkpoints/x/intent.json"


class SentRenewals(GatedStore):
    """Holds the second put of the intent (its first renewal) until :meth:`release`, and
    carries every call out even when its caller is cancelled, as a request already sent
    is; ``puts`` counts the puts of the intent."""

    def __init__(self) -> None:
        super().__init__(ObstoreStore(MemoryStore()), self._first_renewal)
        self.puts = 0

    def _first_renewal(self, operation: StoreMethod, path: str, mode: PutMode | None) -> bool:
        return operation == "put" and path == INTENT and self.puts == 2

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if operation == "put" and path == INTENT:
            self.puts += 1
        sent = asyncio.ensure_future(super()._around(operation, path, call, mode=mode))
        return await asyncio.shield(sent)


async def test_stop_waits_for_a_renewal_in_flight_so_a_deleted_intent_stays_deleted() -> None:
    store = SentRenewals()
    lease = await Lease.start(store, INTENT, None, dt.timedelta(milliseconds=60))
    await asyncio.wait_for(store.reached.wait(), 5)
    stopping = asyncio.ensure_future(lease.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done(), "stop returned while a renewal was still on its way"
    store.release()
    await asyncio.wait_for(stopping, 5)
    await store.delete([INTENT])
    await asyncio.sleep(0.2)  # three lease periods: no renewal may follow the stop
    try:
        await store.head(INTENT)
    except CheckpointNotFoundError:
        pass
    else:
        raise AssertionError("the intent came back after the lease was stopped")
    assert store.puts == 2


async def test_a_caller_cancelled_in_stop_is_cancelled_and_the_renewal_still_ends() -> None:
    store = SentRenewals()
    lease = await Lease.start(store, INTENT, None, dt.timedelta(milliseconds=60))
    await asyncio.wait_for(store.reached.wait(), 5)
    stopping = asyncio.ensure_future(lease.stop())
    await asyncio.sleep(0.02)
    stopping.cancel()
    try:
        await stopping
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("stop swallowed its caller's cancellation")
    store.release()
    await asyncio.sleep(0.2)
    assert store.puts == 2  # the sent renewal landed, and none came after it
    await lease.stop()  # idempotent, and returns at once now
