"""Retention after each commit: ``ObjectStoreCheckpointer(..., retention=policy)`` runs
GC in the background after every commit, never delaying the save, one at a time,
failures logged and kept rather than raised, waited for on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from obstore.store import MemoryStore
from support.gates import GatedStore

from cairn import (
    CheckpointData,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    StoreError,
    SyncCheckpointer,
)
from cairn.stores import ForwardingStore, PutMode, Store, StoreMethod, as_store

T = TypeVar("T")

KEEP_TWO = RetentionPolicy(keep_last=2)


def data(epoch: int) -> CheckpointData:
    return CheckpointData(epoch=epoch, snapshots={("op", 0): f"state {epoch}".encode()})


def memory() -> Store:
    return as_store(MemoryStore())


def gc_clock(operation: StoreMethod, path: str, mode: PutMode | None) -> bool:
    """GC's first write (it reads the store's time from ``_clock``); no save writes it."""
    del mode
    return operation == "put" and path.endswith("_clock")


def gc_listing(operation: StoreMethod, path: str, mode: PutMode | None) -> bool:
    """GC's listing of the whole store, with which every run begins; no save makes it."""
    del mode
    return operation == "list" and path == ""


class GcFails(ForwardingStore):
    """Every GC fails at its first write; saves go through."""

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if gc_clock(operation, path, mode):
            raise StoreError(operation, path, "refused by the test")
        return await call()


async def test_keep_last_two_leaves_two_after_five_saves() -> None:
    ckpt = ObjectStoreCheckpointer(memory(), retention=KEEP_TWO)
    saved = [await ckpt.save(data(epoch)) for epoch in range(5)]
    await ckpt.close()
    assert await ckpt.list_checkpoints() == [m.checkpoint_id for m in saved[-2:]]
    assert ckpt.background_gc.runs >= 1 and ckpt.background_gc.last_error is None
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.manifest.epoch == 4


async def test_background_saves_are_collected_too() -> None:
    ckpt = ObjectStoreCheckpointer(memory(), retention=KEEP_TWO, max_saves_in_flight=2)
    tasks = [await ckpt.save_async(data(epoch)) for epoch in range(5)]
    await ckpt.close()
    assert all(task.done() for task in tasks)
    assert await ckpt.list_checkpoints() == [(await t).checkpoint_id for t in tasks[-2:]]


async def test_a_slow_gc_does_not_delay_saves_and_coalesces() -> None:
    gate = GatedStore(memory(), gc_listing)
    ckpt = ObjectStoreCheckpointer(gate, retention=RetentionPolicy(keep_last=1))
    await asyncio.wait_for(ckpt.save(data(0)), 10)
    await asyncio.wait_for(gate.reached.wait(), 10)  # the first GC is held at its start
    # Saves return while it is held; the requests they make coalesce into one more run.
    later = [await asyncio.wait_for(ckpt.save(data(epoch)), 10) for epoch in (1, 2, 3)]
    assert ckpt.background_gc.running and ckpt.background_gc.runs == 0
    assert len(await ckpt.list_checkpoints()) == 4
    closing = asyncio.create_task(ckpt.close())
    await asyncio.sleep(0.05)
    assert not closing.done(), "close waits for the GC in flight"
    gate.release()
    await asyncio.wait_for(closing, 10)
    assert ckpt.background_gc.runs == 2  # the held one, then one for the three commits
    assert await ckpt.list_checkpoints() == [later[-1].checkpoint_id]


async def test_a_failed_gc_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    ckpt = ObjectStoreCheckpointer(GcFails(memory()), retention=KEEP_TWO)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        for epoch in range(3):
            await ckpt.save(data(epoch))
        await ckpt.close()  # nothing raised
    assert isinstance(ckpt.background_gc.last_error, StoreError)
    assert "retention GC after a commit failed" in caplog.text
    assert len(await ckpt.list_checkpoints()) == 3  # nothing deleted, nothing broken


def test_the_blocking_checkpointer_collects_after_each_commit() -> None:
    with SyncCheckpointer(memory(), retention=KEEP_TWO) as ckpt:
        saved = [ckpt.save(data(epoch)) for epoch in range(5)]
    assert ckpt.list_checkpoints() == [m.checkpoint_id for m in saved[-2:]]


def test_without_a_policy_nothing_is_collected() -> None:
    with SyncCheckpointer(memory()) as ckpt:
        for epoch in range(3):
            ckpt.save(data(epoch))
    assert len(ckpt.list_checkpoints()) == 3 and ckpt.async_checkpointer.background_gc.runs == 0


def test_retention_must_be_a_policy() -> None:
    with pytest.raises(InvalidInputError, match="retention must be a RetentionPolicy"):
        ObjectStoreCheckpointer(memory(), retention=2)  # type: ignore[arg-type]
