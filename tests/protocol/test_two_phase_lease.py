"""A save in two phases holds its lease from its first write to its commit.

Whoever will commit (the DCP coordinator, the distributed coordinator, a caller of the
integration interface) renews the checkpoint's intent however long the gap between the
uploads and the commit: a GC that runs in that gap, with ``min_age`` 0, sweeps nothing
of the save, and the save commits and loads. Every path begins the same way (the commit
protocol's one precondition check), so a fenced coordinator and a committed id are
refused before anything is written.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import time
from typing import Any

import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore
from support.intents import intents_of, is_intent_path
from support.policies import FAST_RETRY

from cairn import (
    CheckpointData,
    CheckpointExistsError,
    CheckpointId,
    FencedError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    SyncCheckpointer,
    commit_distributed,
    upload_partitions,
)
from cairn.format.layout import CheckpointPaths
from cairn.integrations._interface import assemble_manifest, begin
from cairn.protocol.retention import GcResult
from cairn.stores import ObstoreStore, Store

LEASE = dt.timedelta(milliseconds=300)
GAP = 3 * LEASE.total_seconds()  # longer than the lease: an unrenewed intent lapses
NOW = dt.timedelta(0)
KEEP = RetentionPolicy(keep_last=5)


def memory() -> Store:
    return ObstoreStore(MemoryStore())


async def objects_under(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> set[str]:
    return {info.path for info in await ckpt.store.list(ckpt.paths.checkpoint_dir(cid))}


async def test_a_two_phase_save_holds_its_lease_from_begin_to_commit() -> None:
    store = memory()
    ckpt = make_checkpointer(store, lease=LEASE)
    collector = make_checkpointer(store)
    cid = CheckpointId.now()
    async with await begin(ckpt, cid) as save:
        entries = await save.upload([("op", 0, False, b"first"), ("op", 1, False, b"second")])
        await asyncio.sleep(GAP)
        swept = await collector.gc(KEEP, min_age=NOW)
        assert swept.orphans_deleted == [], "GC swept a save whose lease was held"
        assert ckpt.paths.manifest(cid) not in await objects_under(ckpt, cid), "no claim"
        await save.commit(assemble_manifest(cid, 1, entries))
    loaded = await collector.load(cid)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {
        ("op", 0): b"first",
        ("op", 1): b"second",
    }
    assert await collector.read_latest() == cid
    # The lease ends with the commit: no intent is left, and none is written again.
    await asyncio.sleep(LEASE.total_seconds())
    assert await intents_of(ckpt.store, ckpt.paths, cid) == []


async def test_a_two_phase_save_ended_without_a_commit_lets_its_lease_lapse() -> None:
    store = memory()
    ckpt = make_checkpointer(store, lease=LEASE)
    collector = make_checkpointer(store)
    cid = CheckpointId.now()
    async with await begin(ckpt, cid) as save:
        await save.upload([("op", 0, False, b"abandoned")])
    await asyncio.sleep(GAP)
    swept = await collector.gc(KEEP, min_age=NOW)
    assert len(swept.orphans_deleted) == 2  # the artifact and the intent
    assert await objects_under(ckpt, cid) == {ckpt.paths.manifest(cid)}  # GC's tombstone


async def test_a_two_phase_save_dropped_without_an_end_stops_renewing() -> None:
    store = memory()
    ckpt = make_checkpointer(store, lease=LEASE)
    cid = CheckpointId.now()
    save = await begin(ckpt, cid)
    await asyncio.sleep(LEASE.total_seconds())  # renewed meanwhile
    del save  # as a DCP save that failed before its commit, its writer dropped
    gc.collect()
    await asyncio.sleep(0.01)
    [intent] = await intents_of(ckpt.store, ckpt.paths, cid)
    last = (await ckpt.store.head(intent)).last_modified
    await asyncio.sleep(GAP)
    assert (await ckpt.store.head(intent)).last_modified == last


async def test_a_two_phase_save_begins_with_the_commits_own_preconditions() -> None:
    store = memory()
    old = make_checkpointer(store)
    committed = await old.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    with pytest.raises(CheckpointExistsError):
        await begin(old, committed.checkpoint_id)
    new = make_checkpointer(store)
    await new.take_over()
    fresh = CheckpointId.now()
    with pytest.raises(FencedError):
        await begin(old, fresh)
    assert await objects_under(old, fresh) == set(), "a refused save writes nothing"


async def test_the_distributed_coordinator_holds_the_lease_through_its_checks() -> None:
    inner = memory()
    worker = make_checkpointer(inner, lease=LEASE)
    collector = make_checkpointer(inner)
    cid = CheckpointId.now()
    report = await upload_partitions(worker, cid, [("agg", 0, False, b"state")], worker="w0")
    await asyncio.sleep(GAP)  # the worker's lease has lapsed: nobody renews it
    runs: list[GcResult] = []

    async def gc_during_the_checks(op: str, path: str) -> None:
        if op in ("stat", "head") and "/operators/" in path and not runs:
            runs.append(await collector.gc(KEEP, min_age=NOW))

    coordinator = ObjectStoreCheckpointer(
        FaultyStore(inner, FaultPlan(before_call=gc_during_the_checks)),
        retry=FAST_RETRY,
        lease=LEASE,
    )
    manifest = await commit_distributed(coordinator, cid, 3, [("agg", 0)], [report])
    assert len(runs) == 1 and runs[0].orphans_deleted == []
    loaded = await collector.load(cid)
    assert loaded.manifest == manifest and bytes(loaded.artifacts[("agg", 0)]) == b"state"
    assert await intents_of(worker.store, worker.paths, cid) == []


@pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)
def test_a_dcp_save_whose_commit_comes_later_than_its_lease_commits() -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from cairn.torch import CairnWriter

    store = memory()
    collector = SyncCheckpointer(store, CheckpointPaths(""), retry=FAST_RETRY)
    runs: list[GcResult] = []

    class LateCoordinator(CairnWriter):
        """Every rank has uploaded; the coordinator commits only after the lease."""

        def finish(self, metadata: Any, results: Any) -> None:
            time.sleep(GAP)
            runs.append(collector.gc(KEEP, min_age=NOW))
            super().finish(metadata, results)

    writer = LateCoordinator(store, epoch=1, lease=LEASE)
    state = {"weights": torch.arange(1000, dtype=torch.float32)}
    dcp_save(state, storage_writer=writer, no_dist=True)
    cid = writer.checkpoint_id
    assert cid is not None
    assert len(runs) == 1 and runs[0].orphans_deleted == []
    assert collector.list_checkpoints() == [cid]
    assert collector.read_latest() == cid
    directory = collector.paths.checkpoint_dir(cid)
    inner = collector.async_checkpointer
    left = {info.path for info in asyncio.run(_list(inner.store, directory))}
    assert not [p for p in left if is_intent_path(p)], "the lease ended with the commit"


async def _list(store: Store, prefix: str) -> list[Any]:
    return await store.list(prefix)
