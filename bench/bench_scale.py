"""Scale: list_checkpoints and a GC plan over 1,000 checkpoints of 50 artifacts each.

Run: ``python bench/bench_scale.py [--checkpoints 1000] [--artifacts 50]``. Saves the
checkpoints to a MemoryStore through a wrapper that counts store calls, then measures
``list_checkpoints`` and ``gc(dry_run=True)``: their time, and how many listing calls and
other calls each made. The claim checked: both cost O(checkpoints) calls, and listing
calls do not grow with the number of artifacts. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from obstore.store import MemoryStore

from cairn import CheckpointData, ObjectStoreCheckpointer, RetentionPolicy
from cairn.stores import ForwardingStore, ObstoreStore, PutMode, Store, StoreMethod

T = TypeVar("T")


class CountingStore(ForwardingStore):
    """A Store that counts calls per operation (by Store method name)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: collections.Counter[str] = collections.Counter()

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        self.calls[operation] += 1
        return await call()


async def measure(
    store: CountingStore, action: Callable[[], Awaitable[object]]
) -> dict[str, object]:
    store.calls.clear()
    started = time.perf_counter()
    await action()
    seconds = time.perf_counter() - started
    calls = dict(store.calls)
    listing = calls.get("list", 0) + calls.get("list_dir", 0)
    return {"seconds": round(seconds, 3), "listing_calls": listing, "calls": calls}


async def main(checkpoints: int, artifacts: int) -> dict[str, object]:
    store = CountingStore(ObstoreStore(MemoryStore()))
    ckpt = ObjectStoreCheckpointer(store, max_concurrent_uploads=16)
    payload = b"x" * 256
    started = time.perf_counter()
    for epoch in range(checkpoints):
        await ckpt.save(
            CheckpointData(epoch=epoch, snapshots={("op", p): payload for p in range(artifacts)})
        )
    save_seconds = time.perf_counter() - started
    listed = await measure(store, ckpt.list_checkpoints)
    plan = await measure(
        store,
        lambda: ckpt.gc(RetentionPolicy(keep_last=10), dry_run=True, min_age=dt.timedelta(0)),
    )
    return {
        "checkpoints": checkpoints,
        "artifacts_per_checkpoint": artifacts,
        "objects": checkpoints * (artifacts + 1) + 1,
        "save_all_seconds": round(save_seconds, 2),
        "list_checkpoints": listed,
        "gc_plan_dry_run": plan,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--artifacts", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.checkpoints, args.artifacts)), indent=2))
