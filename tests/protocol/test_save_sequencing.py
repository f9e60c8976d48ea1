"""A save's steps run at once where nothing orders them; where something does, it holds.

The intent is written beside the uploads and the parent's manifest is read beside them,
so the parent may be deleted before the intent can protect it. The check before the
create lists the parent's manifest after the intent is written: a deletion that came
first is caught there, before anything commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.gates import GatedStore, Match

from cairn import BrokenChainError, CheckpointData, CheckpointPaths
from cairn.stores import ObstoreStore, PutMode, Store, StoreMethod

T = TypeVar("T")


class WatchedGate(GatedStore):
    """A :class:`GatedStore` that also says when a read of ``watched`` has returned."""

    def __init__(self, inner: Store, match: Match, watched: str) -> None:
        super().__init__(inner, match)
        self.watched = watched
        self.read = asyncio.Event()

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        result = await super()._around(operation, path, call, mode=mode)
        if operation == "get" and path == self.watched:
            self.read.set()
        return result


async def test_a_parent_deleted_before_the_intent_landed_stops_the_save_before_its_create() -> None:
    inner = ObstoreStore(MemoryStore())
    paths = CheckpointPaths("")
    base = await make_checkpointer(inner, paths).save(
        CheckpointData(epoch=1, snapshots={("op", 0): b"b0", ("op", 1): b"b1"})
    )
    saver_store = WatchedGate(
        inner,
        lambda operation, path, _: operation == "put" and "/intent." in path,
        paths.manifest(base.checkpoint_id),
    )
    deleter_store = GatedStore(
        inner, lambda operation, path, _: operation == "delete" and "/packs/" in path
    )
    saver = make_checkpointer(saver_store, paths)
    deleter = make_checkpointer(deleter_store, paths)
    data = CheckpointData(epoch=2, parent_id=base.checkpoint_id, deltas={("op", 0): b"+d"})

    saving = asyncio.create_task(saver.save(data))
    await saver_store.reached.wait()  # its intent is held: not in the store yet
    await saver_store.read.wait()  # it has read the parent's manifest
    deleting = asyncio.create_task(deleter.delete_checkpoint(base.checkpoint_id))
    # The deletion removed the parent's manifest, found no save building on it, and is
    # about to delete its artifacts, which are all still there.
    await deleter_store.reached.wait()
    saver_store.release()  # the intent lands; the save checks what it builds on
    outcome = await asyncio.gather(saving, return_exceptions=True)
    deleter_store.release()
    await deleting

    [error] = outcome
    assert isinstance(error, BrokenChainError), error
    assert error.link == paths.manifest(base.checkpoint_id)
    assert await make_checkpointer(inner, paths).list_checkpoints() == []
