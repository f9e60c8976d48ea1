"""GC against saves that run for a long time, and against a pointer that moves meanwhile.

Whatever the duration of a save and whatever ``min_age``: either the save fails with a
clear error and nothing of it is committed, or it commits and loads. GC never deletes the
checkpoint ``_latest`` names when it deletes, nor one committed after it planned.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest
from obstore.store import MemoryStore, ObjectStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore
from support.intents import intents_of, is_intent_path

from cairn import (
    BrokenChainError,
    CheckpointAbortedError,
    CheckpointData,
    CheckpointId,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    StoreError,
)
from cairn.format._buffer import Buffer
from cairn.protocol._pointer import WriterRecord
from cairn.protocol._save import assemble_manifest, upload_all
from cairn.stores import ObjectInfo, ObstoreStore

NOW = dt.timedelta(0)
LEASE = dt.timedelta(milliseconds=300)
# S3 and Azure keep modification times to the second: a lease must be well above that.
REMOTE_LEASE = dt.timedelta(milliseconds=2500)


def lease_for(backend: str) -> dt.timedelta:
    return LEASE if backend in ("memory", "local") else REMOTE_LEASE


async def slow_chunks(
    gc_runs: list[object], collector: ObjectStoreCheckpointer, lease: dt.timedelta = LEASE
) -> AsyncIterator[bytes]:
    """One chunk, then GC with min_age 0 several times over more than the lease, then more."""
    yield b"first chunk;"
    for _ in range(4):
        await asyncio.sleep(lease.total_seconds() / 2)
        gc_runs.append(await collector.gc(RetentionPolicy(keep_last=1), min_age=NOW))
    yield b"second chunk"


async def objects_under(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> dict[str, int]:
    return {i.path: i.size for i in await ckpt.store.list(ckpt.paths.checkpoint_dir(cid))}


async def test_a_save_longer_than_its_lease_and_min_age_commits_and_loads(
    raw_store: ObjectStore, backend: str
) -> None:
    collector = make_checkpointer(raw_store)
    parent = await collector.save(CheckpointData(epoch=1, snapshots={("base", 0): b"parent"}))
    await collector.save(CheckpointData(epoch=2, snapshots={("other", 0): b"newest"}))
    lease = lease_for(backend)
    saver = make_checkpointer(raw_store, lease=lease)
    gc_runs: list[object] = []
    slow = slow_chunks(gc_runs, collector, lease)
    manifest = await saver.save(
        CheckpointData(
            epoch=3,
            snapshots={("slow", 0): b"already up", ("slow", 1): slow},
            parent_id=parent.checkpoint_id,
        )
    )
    assert len(gc_runs) == 4  # GC ran four times while the save was uploading
    loaded = await collector.load(manifest.checkpoint_id)
    assert bytes(loaded.artifacts[("slow", 0)]) == b"already up"
    assert bytes(loaded.artifacts[("slow", 1)]) == b"first chunk;second chunk"
    assert bytes(loaded.artifacts[("base", 0)]) == b"parent"  # the parent's chain was kept
    # The protection ends with the save: no intent is left behind.
    assert await intents_of(saver.store, saver.paths, manifest.checkpoint_id) == []
    await collector.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    latest = await collector.load_latest()
    assert latest is not None and latest.manifest.checkpoint_id == manifest.checkpoint_id


class StalledRenewals(FaultyStore):
    """A writer whose lease renewals never reach the store (as when its process stalls)."""

    renewals = 0

    async def put(self, path: str, data: Buffer, **kwargs: Any) -> ObjectInfo:
        if is_intent_path(path):
            self.renewals += 1
            if self.renewals > 1:
                raise StoreError("put", path, "injected: the renewal did not reach the store")
        return await super().put(path, data, **kwargs)


async def test_a_save_whose_lease_lapsed_is_aborted_and_commits_nothing() -> None:
    inner = ObstoreStore(MemoryStore())
    collector = make_checkpointer(inner)
    before = await collector.save(CheckpointData(epoch=1, snapshots={("op", 0): b"good"}))
    stalled = StalledRenewals(inner)
    saver = make_checkpointer(stalled, lease=LEASE)
    gc_runs: list[object] = []
    data = CheckpointData(epoch=2, snapshots={("op", 0): slow_chunks(gc_runs, collector)})
    with pytest.raises(CheckpointAbortedError, match="nothing was committed") as info:
        await saver.save(data)
    assert info.value.checkpoint_id == str(data.id)
    assert stalled.renewals > 1
    assert not await collector.exists(data.id)
    assert await collector.list_checkpoints() == [before.checkpoint_id]
    latest = await collector.load_latest()
    assert latest is not None and latest.manifest.checkpoint_id == before.checkpoint_id
    # GC claimed the id: its tombstone is there, and the early chunk was swept.
    left = await objects_under(collector, data.id)
    assert left.get(collector.paths.manifest(data.id)) == 0
    # A later save works as usual.
    after = await collector.save(CheckpointData(epoch=3, snapshots={("op", 0): b"next"}))
    latest = await collector.load_latest()
    assert latest is not None and latest.manifest.checkpoint_id == after.checkpoint_id


async def test_commit_refuses_a_manifest_whose_artifacts_are_gone(raw_store: ObjectStore) -> None:
    ckpt = make_checkpointer(raw_store)
    parent = await ckpt.save(
        CheckpointData(epoch=1, snapshots={("op", 0): b"base", ("op", 1): b"kept"})
    )
    data = CheckpointData(epoch=2, deltas={("op", 0): b"+1"}, parent_id=parent.checkpoint_id)
    entries = await upload_all(await ckpt._context(), data, WriterRecord(0))
    manifest = assemble_manifest(data.id, data.epoch, entries, parent_id=data.parent_id)
    # Someone deletes an artifact the new manifest carries over from its parent.
    gone = artifact_path(ckpt.paths, parent, "op", 1)
    await ckpt.store.delete([gone])
    with pytest.raises(BrokenChainError, match="missing at commit time") as info:
        await ckpt.commit(manifest)
    assert info.value.link == gone
    assert not await ckpt.exists(data.id)
    # And one of its own.
    data2 = CheckpointData(epoch=3, snapshots={("op", 0): b"x" * 100})
    entries2 = await upload_all(await ckpt._context(), data2, WriterRecord(0))
    manifest2 = assemble_manifest(data2.id, data2.epoch, entries2)
    own = artifact_path(ckpt.paths, manifest2, "op", 0)
    await ckpt.store.delete([own])
    with pytest.raises(BrokenChainError, match="missing at commit time"):
        await ckpt.commit(manifest2)
    assert not await ckpt.exists(data2.id)


async def test_an_intent_left_in_a_committed_checkpoint_goes_with_it(
    raw_store: ObjectStore,
) -> None:
    ckpt = make_checkpointer(raw_store)
    first = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"a"}))
    second = await ckpt.save(
        CheckpointData(epoch=2, deltas={("op", 0): b"b"}, parent_id=first.checkpoint_id)
    )
    # What cairn before leases left behind in every incremental checkpoint (and what a
    # save leaves that dies between its commit and the end of its lease).
    stale_intent = ckpt.paths.intent(second.checkpoint_id)
    await ckpt.store.put(stale_intent, b'{"parent_id": "%s"}' % str(first.checkpoint_id).encode())
    result = await ckpt.gc(RetentionPolicy(keep_last=5), min_age=dt.timedelta(hours=1))
    assert result.deleted == []
    # A kept checkpoint's directory is left as it is.
    assert stale_intent in await objects_under(ckpt, second.checkpoint_id)
    chain = await ckpt.load_chain(second.checkpoint_id, "op", 0)
    assert [bytes(link.data) for link in chain] == [b"a", b"b"]
    # When the checkpoint goes, it is retired (the save that wrote it may not have
    # finished), and the claimed directory is swept by the next run.
    await ckpt.save(CheckpointData(epoch=3, snapshots={("op", 0): b"c"}))
    collected = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert set(collected.deleted) == {first.checkpoint_id, second.checkpoint_id}
    await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    manifest = ckpt.paths.manifest(second.checkpoint_id)
    assert await objects_under(ckpt, second.checkpoint_id) == {manifest: 0}, "only the claim"


async def test_gc_keeps_a_checkpoint_committed_while_it_listed(raw_store: ObjectStore) -> None:
    """``_latest`` moves to epoch 11 during GC's listing; keep_every_n_epochs=10 must keep it."""
    inner = ObstoreStore(raw_store)
    writer = make_checkpointer(inner)
    for epoch in range(1, 11):
        await writer.save(CheckpointData(epoch=epoch, snapshots={("op", 0): b"%d" % epoch}))
    landed: list[CheckpointId] = []

    async def commit_during_listing(op: str, path: str) -> None:
        if op == "list" and not landed:
            m = await writer.save(CheckpointData(epoch=11, snapshots={("op", 0): b"11"}))
            landed.append(m.checkpoint_id)

    collector = make_checkpointer(FaultyStore(inner, FaultPlan(before_call=commit_during_listing)))
    await collector.gc(RetentionPolicy(keep_every_n_epochs=10), min_age=NOW)
    assert len(landed) == 1
    assert await writer.read_latest() == landed[0]
    assert landed[0] in await writer.list_checkpoints()
    latest = await writer.load_latest()
    assert latest is not None and latest.manifest.epoch == 11


async def test_gc_deletes_no_checkpoint_without_a_usable_pointer(raw_store: ObjectStore) -> None:
    ckpt = make_checkpointer(raw_store)
    ids = [
        (await ckpt.save(CheckpointData(epoch=e, snapshots={("op", 0): b"s"}))).checkpoint_id
        for e in range(3)
    ]
    await ckpt.store.delete([ckpt.paths.latest_pointer()])
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert result.deleted == [] and await ckpt.list_checkpoints() == ids
