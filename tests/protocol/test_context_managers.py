"""``async with ObjectStoreCheckpointer(...)`` and ``with SyncCheckpointer(...)``:
leaving the block waits for the saves in flight (never cancels them), also when the
block raised; a save failure is raised after a clean block and, after a failed block,
logged and noted on the block's exception: never lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TypeVar

import pytest
from obstore.store import MemoryStore
from support.gates import GatedStore

from cairn import (
    CheckpointData,
    CheckpointManifest,
    ObjectStoreCheckpointer,
    StoreError,
    SyncCheckpointer,
)
from cairn.stores import ForwardingStore, PutMode, Store, StoreMethod, as_store

T = TypeVar("T")

DATA = CheckpointData(epoch=1, snapshots={("op", 0): b"state"})


class Boom(Exception):
    """What the block raises."""


def memory() -> Store:
    return as_store(MemoryStore())


def artifact_put(operation: StoreMethod, path: str, mode: PutMode | None) -> bool:
    del mode
    return operation in ("put", "put_stream") and "/operators/" in path


class ManifestRefused(ForwardingStore):
    """Every manifest write fails: every save fails before its commit point."""

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if operation == "put" and path.endswith("manifest.json"):
            raise StoreError(operation, path, "refused by the test")
        return await call()


async def test_leaving_the_block_waits_for_saves_in_flight() -> None:
    gate = GatedStore(memory(), artifact_put)
    async with ObjectStoreCheckpointer(gate) as ckpt:
        task = await ckpt.save_async(DATA)
        await gate.reached.wait()
        asyncio.get_running_loop().call_later(0.05, gate.release)
    assert task.done() and not task.cancelled()
    assert await ckpt.exists((await task).checkpoint_id)


async def test_a_block_that_raises_still_waits_and_its_error_goes_on() -> None:
    gate = GatedStore(memory(), artifact_put)
    ckpt = ObjectStoreCheckpointer(gate)
    tasks: list[asyncio.Task[CheckpointManifest]] = []

    async def block() -> None:
        async with ckpt:
            tasks.append(await ckpt.save_async(DATA))
            await gate.reached.wait()
            asyncio.get_running_loop().call_later(0.05, gate.release)
            raise Boom

    with pytest.raises(Boom):
        await block()
    [task] = tasks
    assert task.done() and not task.cancelled()
    assert await ckpt.exists((await task).checkpoint_id), "the save was not dropped"


async def test_a_failed_save_is_raised_after_a_clean_block() -> None:
    with pytest.raises(StoreError, match="refused by the test"):
        async with ObjectStoreCheckpointer(ManifestRefused(memory())) as ckpt:
            await ckpt.save_async(DATA)


async def test_a_failed_save_is_noted_on_the_blocks_error(
    caplog: pytest.LogCaptureFixture,
) -> None:

    async def block() -> None:
        async with ObjectStoreCheckpointer(ManifestRefused(memory())) as ckpt:
            await ckpt.save_async(DATA)
            raise Boom

    with caplog.at_level(logging.ERROR, logger="cairn"), pytest.raises(Boom) as info:
        await block()
    notes = getattr(info.value, "__notes__", [])
    assert any("a background save failed" in note and "refused by" in note for note in notes)
    assert "a background save failed while the checkpointer closed" in caplog.text


def test_the_blocking_checkpointer_is_a_context_manager() -> None:
    with SyncCheckpointer(memory()) as ckpt:
        future = ckpt.save_async(DATA)
    assert future.done()
    assert ckpt.exists(future.result().checkpoint_id)


def test_the_blocking_checkpointer_waits_when_the_block_raises() -> None:
    ckpt = SyncCheckpointer(memory())
    futures: list[Future[CheckpointManifest]] = []

    def block() -> None:
        with ckpt:
            futures.append(ckpt.save_async(DATA))
            raise Boom

    with pytest.raises(Boom):
        block()
    [future] = futures
    assert future.done() and ckpt.exists(future.result().checkpoint_id)


def test_the_blocking_checkpointer_raises_a_failed_save_on_exit() -> None:
    ckpt = SyncCheckpointer(ManifestRefused(memory()))

    def block() -> None:
        with ckpt:
            ckpt.save_async(DATA)

    with pytest.raises(StoreError, match="refused by the test"):
        block()
