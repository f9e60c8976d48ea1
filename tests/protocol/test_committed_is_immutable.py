"""A committed checkpoint is never changed and never lost through cairn.

Each test sets up the worst moment for one way it could be: two writers of one id, a
deletion of something others build on, a GC whose clock is days off beside a stalled
save, a manifest committed over missing artifacts. Every backend.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import types
from typing import Any

import pytest
from obstore.store import ObjectStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.gates import GatedStore, Match
from support.intents import is_intent_path

from cairn import (
    ArtifactExistsError,
    BrokenChainError,
    CheckpointAbortedError,
    CheckpointData,
    CheckpointExistsError,
    CheckpointId,
    CheckpointInUseError,
    CheckpointManifest,
    CheckpointNotFoundError,
    ObjectExistsError,
    ObjectStoreCheckpointer,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    RetentionPolicy,
    sha256_hex,
)
from cairn.format.layout import is_attempt_artifact
from cairn.protocol import retention as retention_module
from cairn.stores import ObstoreStore, PutMode, StoreMethod


def _manifest_create(operation: StoreMethod, path: str, mode: PutMode | None) -> bool:
    return operation == "put" and path.endswith("/manifest.json") and mode == "create"


def _first_artifact_put(operation: StoreMethod, path: str, mode: PutMode | None) -> bool:
    return operation in ("put", "put_stream") and "/operators/" in path


async def _all_paths(ckpt: ObjectStoreCheckpointer) -> set[str]:
    return {info.path for info in await ckpt.store.list(ckpt.paths.base_prefix)}


# -- two writers of one id ---------------------------------------------------------------


async def test_a_late_writer_of_the_same_id_never_replaces_committed_bytes(
    raw_store: ObjectStore,
) -> None:
    """Writer B stalls mid-upload; writer A saves the same id and commits; B resumes."""
    inner = ObstoreStore(raw_store)
    gate = GatedStore(inner, _first_artifact_put)
    a = make_checkpointer(inner)
    b = make_checkpointer(gate)
    cid = CheckpointId.now()
    b_data = CheckpointData(epoch=1, snapshots={("op", 0): b"B" * 5000}, checkpoint_id=cid)
    a_data = CheckpointData(epoch=1, snapshots={("op", 0): b"A" * 5000}, checkpoint_id=cid)
    b_save = asyncio.create_task(b.save(b_data))
    await gate.reached.wait()  # B checked that cid is not committed, and is uploading
    committed = await a.save(a_data)
    gate.release()
    with pytest.raises(CheckpointExistsError):
        await b_save
    loaded = await a.load(cid)
    assert loaded.manifest == committed
    assert bytes(loaded.artifacts[("op", 0)]) == b"A" * 5000
    # B's bytes went to names of its own, and are removed or left for GC: never A's.
    own = artifact_path(a.paths, committed, "op", 0)
    assert bytes((await inner.get(own)).data) == b"A" * 5000
    gc = await a.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert cid in gc.retained
    left = {p for p in await _all_paths(a) if p.startswith(a.paths.checkpoint_dir(cid))}
    assert left == {own, a.paths.manifest(cid)}
    assert bytes((await a.load(cid)).artifacts[("op", 0)]) == b"A" * 5000


async def test_what_a_losing_writer_left_stays_while_the_checkpoint_is_kept(
    raw_store: ObjectStore,
) -> None:
    """A second writer of the id leaves attempt-named objects beside the commit. It may be
    stalled at its commit point, not dead: its uploads stay whole while the checkpoint is
    kept, and when the checkpoint goes, only what its manifest names goes with it. The
    rest is then an uncommitted directory, which GC claims (a tombstone: that writer can
    no longer commit) before it sweeps it."""
    ckpt = make_checkpointer(raw_store)
    committed = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"winner"}))
    cid = committed.checkpoint_id
    own = artifact_path(ckpt.paths, committed, "op", 0)
    loser = ckpt.paths.resolve(cid, ckpt.paths.relative_artifact("op", 0, False, "0123456789ab"))
    await ckpt.store.put(loser, b"loser")
    assert is_attempt_artifact(loser.removeprefix(ckpt.paths.checkpoint_dir(cid)))
    kept = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert cid in kept.retained and kept.orphans_deleted == []
    assert loser in await _all_paths(ckpt)
    assert bytes((await ckpt.load(cid)).artifacts[("op", 0)]) == b"winner"

    await ckpt.save(CheckpointData(epoch=2, snapshots={("op", 0): b"newer"}))
    collected = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert collected.deleted == [cid]
    left = {p for p in await _all_paths(ckpt) if p.startswith(ckpt.paths.checkpoint_dir(cid))}
    assert left == {loser} and own not in left

    swept = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert swept.orphans_deleted == [loser]
    manifest_path = ckpt.paths.manifest(cid)
    left = {p for p in await _all_paths(ckpt) if p.startswith(ckpt.paths.checkpoint_dir(cid))}
    assert left == {manifest_path}, "the claim stands"
    assert bytes((await ckpt.store.get(manifest_path)).data) == b""
    with pytest.raises(ObjectExistsError):
        await ckpt.store.put(manifest_path, b"{}", mode="create")


async def test_a_failed_writer_of_a_committed_id_removes_nothing_of_the_commit(
    raw_store: ObjectStore,
) -> None:
    """B's upload fails after A committed the same id: B cleans up its own objects only."""
    inner = ObstoreStore(raw_store)
    a = make_checkpointer(inner)
    cid = CheckpointId.now()
    gate = GatedStore(inner, _first_artifact_put)

    def broken_stream() -> Any:
        async def chunks() -> Any:
            yield b"partial"
            raise OSError("the disk under B's file went away")

        return chunks()

    b = make_checkpointer(gate)
    b_data = CheckpointData(epoch=1, snapshots={("op", 0): broken_stream()}, checkpoint_id=cid)
    b_save = asyncio.create_task(b.save(b_data))
    await gate.reached.wait()
    committed = await a.save(
        CheckpointData(epoch=1, snapshots={("op", 0): b"A"}, checkpoint_id=cid)
    )
    gate.release()
    with pytest.raises(Exception):  # noqa: B017, PT011 - the stream's failure, wrapped or not
        await b_save
    assert await a.exists(cid)
    assert bytes((await a.load(cid)).artifacts[("op", 0)]) == b"A"
    assert (await a.load_manifest(cid)) == committed


async def test_the_reference_calls_write_their_fixed_names_once(
    raw_store: ObjectStore,
) -> None:
    ckpt = make_checkpointer(raw_store)
    cid = CheckpointId.now()
    digest = await ckpt.save_snapshot(cid, "op", 0, b"first")
    assert await ckpt.save_snapshot(cid, "op", 0, b"first") == digest  # the same bytes: done
    with pytest.raises(ArtifactExistsError) as info:
        await ckpt.save_snapshot(cid, "op", 0, b"other")
    assert info.value.path == ckpt.paths.snapshot(cid, "op", 0)
    assert bytes(await ckpt.load_artifact(ckpt.paths.snapshot(cid, "op", 0))) == b"first"
    with pytest.raises(ArtifactExistsError):
        await ckpt.save_snapshot(cid, "op", 0, iter([b"oth", b"er"]))
    assert bytes(await ckpt.load_artifact(ckpt.paths.snapshot(cid, "op", 0))) == b"first"


# -- deleting ----------------------------------------------------------------------------


async def test_deleting_a_base_that_an_incremental_carries_is_refused(
    raw_store: ObjectStore,
) -> None:
    ckpt = make_checkpointer(raw_store)
    base = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"b0", ("op", 1): b"b1"}))
    incremental = await ckpt.save(
        CheckpointData(epoch=2, deltas={("op", 0): b"+d"}, parent_id=base.checkpoint_id)
    )
    assert await ckpt.dependents(base.checkpoint_id) == [incremental.checkpoint_id]
    before = await _all_paths(ckpt)
    with pytest.raises(CheckpointInUseError) as info:
        await ckpt.delete_checkpoint(base.checkpoint_id)
    assert info.value.dependents == [str(incremental.checkpoint_id)]
    assert str(incremental.checkpoint_id) in str(info.value)
    assert await _all_paths(ckpt) == before, "a refused deletion leaves the store as it was"
    loaded = await ckpt.load(incremental.checkpoint_id)
    assert bytes(loaded.artifacts[("op", 1)]) == b"b1"
    latest = await ckpt.load_latest()
    assert latest is not None and latest.checkpoint_id == incremental.checkpoint_id
    # The newest one has no dependents: it goes, and _latest moves to the base.
    assert await ckpt.dependents(incremental.checkpoint_id) == []
    await ckpt.delete_checkpoint(incremental.checkpoint_id)
    assert await ckpt.read_latest() == base.checkpoint_id
    await ckpt.delete_checkpoint(base.checkpoint_id)
    assert await ckpt.read_latest() is None
    assert await ckpt.list_checkpoints() == []
    assert await ckpt.load_latest() is None


async def test_deleting_what_latest_names_moves_latest_to_the_newest_left(
    raw_store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = make_checkpointer(raw_store)
    saved = [
        await ckpt.save(CheckpointData(epoch=e, snapshots={("op", 0): b"%d" % e}))
        for e in (1, 2, 3)
    ]
    await ckpt.delete_checkpoint(saved[-1].checkpoint_id)
    assert await ckpt.read_latest() == saved[1].checkpoint_id
    await ckpt.delete_checkpoint(saved[0].checkpoint_id)  # not the latest: _latest stays
    assert await ckpt.read_latest() == saved[1].checkpoint_id
    with caplog.at_level("WARNING", logger="cairn"):
        assert await ckpt.latest_id() == saved[1].checkpoint_id
        assert await ckpt.list_checkpoints() == [saved[1].checkpoint_id]
    assert not [r for r in caplog.records if "no readable manifest" in r.getMessage()]


async def test_deleting_the_parent_of_a_save_in_progress_is_refused(
    raw_store: ObjectStore,
) -> None:
    inner = ObstoreStore(raw_store)
    gate = GatedStore(inner, _first_artifact_put)
    ckpt = make_checkpointer(gate)
    base = await ObjectStoreCheckpointer(inner).save(
        CheckpointData(epoch=1, snapshots={("op", 0): b"b0", ("op", 1): b"b1"})
    )
    data = CheckpointData(epoch=2, deltas={("op", 0): b"+d"}, parent_id=base.checkpoint_id)
    running = asyncio.create_task(ckpt.save(data))
    await gate.reached.wait()  # it is uploading, its intent written beside the uploads
    directory = ckpt.paths.checkpoint_dir(data.id)
    intents = f"{directory}intent."
    # Its lease names the parent once the intent is there (no event says so: poll).
    while not [i for i in await inner.list(directory) if i.path.startswith(intents)]:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    other = make_checkpointer(inner)
    with pytest.raises(CheckpointInUseError) as info:
        await other.delete_checkpoint(base.checkpoint_id)
    assert info.value.dependents == [str(data.id)]
    gate.release()
    committed = await running
    loaded = await other.load(committed.checkpoint_id)
    assert bytes(loaded.artifacts[("op", 1)]) == b"b1"


# -- the clock ---------------------------------------------------------------------------


class _ClockAhead:
    """Stands for the ``datetime`` module in :mod:`cairn.protocol.retention`: a clock days ahead."""

    def __init__(self, ahead: dt.timedelta) -> None:
        offset = ahead

        class Ahead(dt.datetime):
            @classmethod
            def now(cls, tz: dt.tzinfo | None = None) -> Ahead:
                real = dt.datetime.now(tz)
                shifted = real + offset
                return cls.fromtimestamp(shifted.timestamp(), tz)

        self.datetime = Ahead
        self.timedelta = dt.timedelta
        self.UTC = dt.UTC
        self.timezone = dt.timezone


async def test_a_gc_whose_clock_is_days_ahead_cannot_break_a_stalled_save(
    raw_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save stalls between its artifact check and its create; GC runs twice."""
    ahead = _ClockAhead(dt.timedelta(days=2))
    monkeypatch.setattr(retention_module, "dt", types.SimpleNamespace(**vars(ahead)))
    inner = ObstoreStore(raw_store)
    gate = GatedStore(inner, _manifest_create)
    saver = make_checkpointer(gate)
    await ObjectStoreCheckpointer(inner).save(
        CheckpointData(epoch=1, snapshots={("op", 0): b"older"})
    )
    data = CheckpointData(epoch=2, snapshots={("op", 0): b"S" * 4096, ("op", 1): b"T"})
    running = asyncio.create_task(saver.save(data))
    await gate.reached.wait()
    gc = make_checkpointer(inner)
    for _ in range(2):
        await gc.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(hours=1))
    gate.release()
    # By the store's clock the save's lease is live: GC claimed nothing, and it commits.
    committed = await running
    loaded = await gc.load(committed.checkpoint_id)
    assert bytes(loaded.artifacts[("op", 0)]) == b"S" * 4096
    latest = await gc.load_latest()
    assert latest is not None and latest.checkpoint_id == data.id


async def test_a_save_whose_directory_was_swept_while_it_stalled_commits_nothing(
    raw_store: ObjectStore,
) -> None:
    """What GC does to an abandoned id, all of it, inside the save's stall between its
    artifact check and its create: claim, sweep, and (a day later) drop the tombstone."""
    inner = ObstoreStore(raw_store)
    gate = GatedStore(inner, _manifest_create)
    saver = make_checkpointer(gate)
    reader = make_checkpointer(inner)
    first = await reader.save(CheckpointData(epoch=1, snapshots={("op", 0): b"older"}))
    data = CheckpointData(epoch=2, snapshots={("op", 0): b"new"})
    running = asyncio.create_task(saver.save(data))
    await gate.reached.wait()
    manifest_path = reader.paths.manifest(data.id)
    await inner.put(manifest_path, b"", mode="create")  # GC's claim
    swept = [i.path for i in await inner.list(reader.paths.checkpoint_dir(data.id))]
    await inner.delete([p for p in swept if p != manifest_path])
    await inner.delete([manifest_path])  # the tombstone, once expired
    gate.release()
    with pytest.raises(CheckpointAbortedError) as info:
        await running
    assert str(data.id) in str(info.value)
    assert not await reader.exists(data.id)
    assert await reader.list_checkpoints() == [first.checkpoint_id]
    assert await reader.read_latest() == first.checkpoint_id
    latest = await reader.load_latest()
    assert latest is not None and latest.checkpoint_id == first.checkpoint_id


def _lease_renewals() -> Match:
    """Matches every write of an intent but the first: the renewals of a lease."""
    seen = 0

    def match(operation: StoreMethod, path: str, mode: PutMode | None) -> bool:
        nonlocal seen
        if operation == "put" and is_intent_path(path):
            seen += 1
            return seen > 1
        return False

    return match


@pytest.mark.parametrize("tombstone_dropped", [False, True])
async def test_a_save_whose_lease_gc_claimed_is_aborted(
    raw_store: ObjectStore, tombstone_dropped: bool
) -> None:
    inner = ObstoreStore(raw_store)
    # The save's process is frozen mid-upload: partition 1's upload and every lease
    # renewal wait, so the lease lapses by the store's own time.
    renewals = GatedStore(inner, _lease_renewals(), every=True)
    frozen = GatedStore(renewals, lambda op, path, mode: op == "put" and "/partition-1." in path)
    saver = make_checkpointer(
        frozen, lease=dt.timedelta(milliseconds=300), max_concurrent_uploads=1
    )
    # Partition 0, a stream, is uploaded whole and first; partition 1, alone of the small
    # buffers, has an object of its own too (no pack).
    data = CheckpointData(epoch=1, snapshots={("op", 0): io.BytesIO(b"a"), ("op", 1): b"b"})
    running = asyncio.create_task(saver.save(data))
    await frozen.reached.wait()
    gc = make_checkpointer(inner)
    claimed = False
    for _ in range(50):  # until the lease has lapsed by the store's clock (~1 s stamps)
        await gc.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
        if await _tombstoned(gc, data.id):
            claimed = True
            break
        await asyncio.sleep(0.1)
    assert claimed, "GC claims a directory whose lease lapsed"
    if tombstone_dropped:  # as when the tombstone expired before the save woke up
        await inner.delete([gc.paths.manifest(data.id)])
    renewals.release()
    frozen.release()
    with pytest.raises(CheckpointAbortedError) as info:
        await running
    assert str(data.id) in str(info.value)
    assert not await gc.exists(data.id)
    assert await gc.list_checkpoints() == []


async def _tombstoned(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> bool:
    try:
        info = await ckpt.store.head(ckpt.paths.manifest(cid))
    except CheckpointNotFoundError:
        return False
    return info.size == 0


# -- save_manifest -----------------------------------------------------------------------


async def test_save_manifest_refuses_a_manifest_over_missing_artifacts(
    raw_store: ObjectStore,
) -> None:
    ckpt = make_checkpointer(raw_store)
    cid = CheckpointId.now()
    digest = await ckpt.save_snapshot(cid, "op", 0, b"here")
    present = ckpt.paths.relative_artifact("op", 0, False)
    absent = ckpt.paths.relative_artifact("op", 1, False)
    entries = [
        PartitionSnapshotEntry(
            partition_id=0, is_delta=False, path=present, size_bytes=4, sha256=digest
        ),
        PartitionSnapshotEntry(
            partition_id=1, is_delta=False, path=absent, size_bytes=5, sha256=sha256_hex(b"never")
        ),
    ]
    manifest = CheckpointManifest(
        version=2,
        checkpoint_id=cid,
        epoch=1,
        timestamp_ms=1,
        operators={"op": OperatorSnapshotEntry.from_partitions(entries)},
    )
    with pytest.raises(BrokenChainError) as info:
        await ckpt.save_manifest(manifest)
    assert info.value.link == ckpt.paths.resolve(cid, absent)
    assert not await ckpt.exists(cid)
    assert ckpt.paths.manifest(cid) not in await _all_paths(ckpt)
