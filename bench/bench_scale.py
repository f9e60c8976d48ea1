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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from obstore.store import MemoryStore

from cairn import CheckpointData, ObjectStoreCheckpointer, RetentionPolicy
from cairn._buffer import Buffer
from cairn.stores import Blob, ListDirResult, ObjectInfo, ObstoreStore, PutMode, Store

T = TypeVar("T")


class CountingStore:
    """A Store that counts calls per operation."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()

    async def _count(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        self.calls[op] += 1
        return await call()

    async def get(self, path: str) -> Blob:
        return await self._count("get", lambda: self.inner.get(path))

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        return await self._count("get_range", lambda: self.inner.get_range(path, start, end))

    async def head(self, path: str) -> ObjectInfo:
        return await self._count("head", lambda: self.inner.head(path))

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        return await self._count(
            "put", lambda: self.inner.put(path, data, mode=mode, metadata=metadata)
        )

    async def put_stream(
        self,
        path: str,
        open_chunks: Callable[[], AsyncIterator[bytes]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        await self._count(
            "put", lambda: self.inner.put_stream(path, open_chunks, metadata=metadata)
        )

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        return await self._count("head", lambda: self.inner.stat(path))

    async def list_dir(self, prefix: str) -> ListDirResult:
        return await self._count("list_dir", lambda: self.inner.list_dir(prefix))

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await self._count("list", lambda: self.inner.list(prefix))

    async def delete(self, paths: Sequence[str]) -> None:
        await self._count("delete", lambda: self.inner.delete(paths))

    async def delete_prefix(self, prefix: str) -> None:
        await self._count("delete", lambda: self.inner.delete_prefix(prefix))


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
