"""Retention and GC: what is kept, what is reclaimed, and that nothing reachable is lost."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from obstore.store import LocalStore, MemoryStore, ObjectStore
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore, InjectedCrash
from support.intents import intents_of, is_intent_path
from support.killed import age_files, killed_save, staging_files

from cairn import (
    CheckpointData,
    CheckpointId,
    FencedError,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    StoreError,
)
from cairn.protocol._lease import TOMBSTONE_RETENTION
from cairn.stores import ObstoreStore

NOW = dt.timedelta(0)
T = TypeVar("T")


async def paths_in(ckpt: ObjectStoreCheckpointer) -> set[str]:
    return {info.path for info in await ckpt.store.list("")}


async def tombstones(ckpt: ObjectStoreCheckpointer) -> set[str]:
    """The claims GC leaves in swept directories (empty manifests, kept for a while)."""
    return {
        info.path
        for info in await ckpt.store.list("")
        if info.path.endswith("/manifest.json") and info.size == 0
    }


async def checkpoint_objects(ckpt: ObjectStoreCheckpointer) -> set[str]:
    """Objects inside checkpoint directories (not _latest, _writer, or tombstones)."""
    inside = {p for p in await paths_in(ckpt) if ckpt.paths.checkpoint_of(p) is not None}
    return inside - await tombstones(ckpt)


async def reachable_paths(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> set[str]:
    """Every object the checkpoint needs: its own directory and what its chains reference."""
    own = {i.path for i in await ckpt.store.list(ckpt.paths.checkpoint_dir(cid))}
    loaded = await ckpt.load(cid)
    chained = {
        ckpt.paths.resolve(link.owner, link.entry.path)
        for links in loaded.chains.values()
        for link in links
    }
    return own | chained


async def save_series(ckpt: ObjectStoreCheckpointer, count: int) -> list[CheckpointId]:
    """Full snapshot every third epoch, deltas in between."""
    ids: list[CheckpointId] = []
    for epoch in range(count):
        if epoch % 3 == 0:
            data = CheckpointData(
                epoch=epoch, snapshots={("op", p): bytes([epoch]) * 100 for p in range(2)}
            )
        else:
            data = CheckpointData(
                epoch=epoch, deltas={("op", 0): bytes([epoch])}, parent_id=ids[-1]
            )
        ids.append((await ckpt.save(data)).checkpoint_id)
    return ids


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keep_last": 0},
        {"keep_last": -1},
        {"keep_last": True},
        {"keep_every_n_epochs": 0},
        {"keep_within": dt.timedelta(seconds=-1)},
        {"keep_within": 5},
        {"pinned": ("x",)},
    ],
)
def test_bad_policies_raise_when_built(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError):
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]


async def test_bad_gc_arguments_change_nothing(ckpt: ObjectStoreCheckpointer) -> None:
    await save_series(ckpt, 3)
    before = await paths_in(ckpt)
    with pytest.raises(InvalidInputError, match="pinned"):
        await ckpt.gc(RetentionPolicy(keep_last=1, pinned=(CheckpointId.now(),)), min_age=NOW)
    with pytest.raises(InvalidInputError, match="min_age"):
        await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(seconds=-1))
    assert await paths_in(ckpt) == before


async def test_keep_last_keeps_the_chain_it_needs(ckpt: ObjectStoreCheckpointer) -> None:
    ids = await save_series(ckpt, 5)  # 0 full, 1 2 deltas, 3 full, 4 delta
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert result.retained == [ids[4]]
    assert sorted(result.deleted) == sorted(ids[:4])
    assert await ckpt.list_checkpoints() == [ids[4]]
    assert await checkpoint_objects(ckpt) == await reachable_paths(ckpt, ids[4])
    assert result.bytes_reclaimed > 0 and not result.failures
    chain = await ckpt.load_chain(ids[4], "op", 0)
    assert [bytes(x.data) for x in chain] == [bytes([3]) * 100, bytes([4])]


async def test_rules_combine_by_union_and_latest_is_kept(ckpt: ObjectStoreCheckpointer) -> None:
    ids = await save_series(ckpt, 7)
    # Latest, and whatever is newer (the pointer may still move there), is kept whatever
    # the policy says.
    await ckpt.update_latest(ids[4], force=True)
    policy = RetentionPolicy(keep_last=1, keep_every_n_epochs=3, pinned=(ids[2],))
    result = await ckpt.gc(policy, min_age=NOW)
    kept = set(await ckpt.list_checkpoints())
    assert kept == {ids[0], ids[2], ids[3], ids[4], ids[5], ids[6]}
    assert set(result.retained) == kept
    for cid in kept:
        await ckpt.load(cid)  # every retained checkpoint loads and verifies


async def test_keep_within(ckpt: ObjectStoreCheckpointer) -> None:
    ids = await save_series(ckpt, 3)
    result = await ckpt.gc(RetentionPolicy(keep_within=dt.timedelta(hours=1)), min_age=NOW)
    assert result.deleted == [] and sorted(result.retained) == ids


async def test_dry_run_deletes_nothing(ckpt: ObjectStoreCheckpointer) -> None:
    ids = await save_series(ckpt, 4)
    before = await paths_in(ckpt)
    dry = await ckpt.gc(RetentionPolicy(keep_last=1), dry_run=True, min_age=NOW)
    assert dry.dry_run and sorted(dry.deleted) == sorted(ids[:3])
    assert await paths_in(ckpt) == before
    real = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert real.deleted == dry.deleted and real.bytes_reclaimed == dry.bytes_reclaimed


async def test_orphans_are_swept_only_when_old(ckpt: ObjectStoreCheckpointer) -> None:
    await save_series(ckpt, 1)
    orphan = CheckpointId.now()
    crashed = ObjectStoreCheckpointer(ckpt.store, lease=dt.timedelta(milliseconds=30))
    await crashed.save_snapshot(orphan, "op", 0, b"left behind by a crashed save")
    await asyncio.sleep(2.1)  # its lease lapses (stamps may be whole seconds): min_age is left
    young = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(hours=1))
    assert young.orphans_deleted == []
    assert ckpt.paths.snapshot(orphan, "op", 0) in await paths_in(ckpt)
    [intent] = await intents_of(ckpt.store, ckpt.paths, orphan)
    old = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    swept = [ckpt.paths.snapshot(orphan, "op", 0), intent]
    assert sorted(old.orphans_deleted) == sorted(swept)
    assert not set(swept) & await paths_in(ckpt)
    # GC claimed the id first: the crashed save can never commit it now.
    assert await tombstones(ckpt) == {ckpt.paths.manifest(orphan)}
    assert not await ckpt.exists(orphan)


def empty_directories(root: Path) -> list[str]:
    """Every directory below ``root`` that holds nothing at all."""
    return sorted(
        os.path.relpath(folder, root)
        for folder, subdirs, files in os.walk(root)
        if not subdirs and not files and folder != str(root)
    )


async def test_gc_on_a_local_directory_leaves_no_empty_folders(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = ObjectStoreCheckpointer(LocalStore(root))
    for epoch in range(60):
        snapshots = {("op", 0): b"state", ("other", 1): bytes([epoch])}
        await ckpt.save(CheckpointData(epoch=epoch, snapshots=snapshots))
    result = await ckpt.gc(RetentionPolicy(keep_last=5), min_age=NOW)
    assert len(result.deleted) == 55
    kept = await ckpt.list_checkpoints()
    assert len(kept) == 5
    assert empty_directories(root) == []
    base = await ckpt.store.list_dir(ckpt.paths.base_prefix)
    assert sorted(base.prefixes) == sorted(ckpt.paths.checkpoint_dir(cid) for cid in kept)
    assert {info.path for info in base.objects} <= {
        ckpt.paths.clock(),
        ckpt.paths.latest_pointer(),
        ckpt.paths.writer_record(),
    }
    for cid in kept:
        await ckpt.load(cid)


async def test_deleting_a_local_checkpoint_leaves_no_empty_folder(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = ObjectStoreCheckpointer(LocalStore(root))
    first, second = [
        (await ckpt.save(CheckpointData(epoch=epoch, snapshots={("op", 0): b"x"}))).checkpoint_id
        for epoch in (1, 2)
    ]
    await ckpt.delete_checkpoint(first)
    assert empty_directories(root) == []
    base = await ckpt.store.list_dir(ckpt.paths.base_prefix)
    assert base.prefixes == [ckpt.paths.checkpoint_dir(second)]


async def test_gc_removes_what_killed_writes_left_in_a_directory_it_claims(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = ObjectStoreCheckpointer(LocalStore(root))
    [kept] = await save_series(ckpt, 1)
    orphan, cut = await killed_save(ckpt, root)
    in_kept = root / ckpt.paths.checkpoint_dir(kept) / "intent.json#7"
    in_kept.write_bytes(b"a write in a committed directory")

    swept = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(hours=1))

    assert swept.orphans_deleted and swept.failures == []
    assert sorted(swept.staging_files_deleted) == [str(p.relative_to(root)) for p in cut]
    assert staging_files(root) == [in_kept], "a committed directory is left alone"
    directory = root / ckpt.paths.checkpoint_dir(orphan)
    assert [p.relative_to(directory) for p in directory.rglob("*")] == [Path("manifest.json")], (
        "only the tombstone is left, and no emptied folder"
    )
    assert not await ckpt.exists(orphan)
    await ckpt.load(kept)


async def test_gc_removes_a_late_staging_file_with_the_expired_tombstone(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = ObjectStoreCheckpointer(LocalStore(root))
    await save_series(ckpt, 1)
    orphan, _ = await killed_save(ckpt, root)
    first = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert first.orphans_deleted and len(first.staging_files_deleted) == 2
    # A write of the dead save that was cut after GC claimed the directory.
    directory = root / ckpt.paths.checkpoint_dir(orphan)
    late = directory / "operators/op/partition-0.late.snap#5"
    late.parent.mkdir(parents=True, exist_ok=True)
    late.write_bytes(b"cut after the claim")
    age_files(directory, TOMBSTONE_RETENTION + dt.timedelta(hours=1))  # the tombstone expired

    second = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)

    assert second.orphans_deleted == [ckpt.paths.manifest(orphan)]
    assert second.staging_files_deleted == [str(late.relative_to(root))]
    assert not directory.exists(), "the directory went with the last of its files"
    assert empty_directories(root) == []


async def test_gc_is_resumable_after_a_crash(raw_store: ObjectStore) -> None:
    inner = ObstoreStore(raw_store)
    plain = make_checkpointer(inner)
    ids = await save_series(plain, 6)
    for crash_at in (2, 5, 9, 14):
        crashing = make_checkpointer(FaultyStore(inner, FaultPlan(crash_at=crash_at)))
        with pytest.raises(InjectedCrash):
            await crashing.gc(RetentionPolicy(keep_last=1), min_age=NOW)
        for cid in await plain.list_checkpoints():
            await plain.load(cid)  # listed means whole, at every crash point
    await plain.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert await plain.list_checkpoints() == [ids[-1]]
    assert await checkpoint_objects(plain) == await reachable_paths(plain, ids[-1])


async def test_gc_during_an_incremental_save_does_not_break_it(raw_store: ObjectStore) -> None:
    inner = ObstoreStore(raw_store)
    plain = make_checkpointer(inner)
    ids = await save_series(plain, 3)
    other = await plain.save(CheckpointData(epoch=10, snapshots={("x", 0): b"newer"}))
    ran: list[int] = []

    async def gc_while_uploading(op: str, path: str) -> None:
        if op == "put" and ".delta" in path and not ran:
            ran.append(1)
            # Once its intent is written (beside its uploads), the save is protected:
            # collect everything but the latest. (A parent deleted before that stops the
            # save before its commit: see test_save_sequencing.)
            directory = path[: path.index("/operators/") + 1]
            while not [i for i in await inner.list(directory) if "/intent." in i.path]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await plain.gc(RetentionPolicy(keep_last=1), min_age=NOW)

    saving = make_checkpointer(FaultyStore(inner, FaultPlan(before_call=gc_while_uploading)))
    manifest = await saving.save(
        CheckpointData(epoch=5, deltas={("op", 0): b"late"}, parent_id=ids[-1])
    )
    assert ran == [1]
    chain = await plain.load_chain(manifest.checkpoint_id, "op", 0)
    assert [bytes(x.data) for x in chain] == [bytes([0]) * 100, b"\x01", b"\x02", b"late"]
    assert other.checkpoint_id in await plain.list_checkpoints()


async def test_failures_are_reported_not_raised() -> None:
    inner = ObstoreStore(MemoryStore())
    plain = make_checkpointer(inner)
    ids = await save_series(plain, 3)
    faulty = FaultyStore(inner)
    failing = make_checkpointer(faulty)
    original_delete = faulty.delete

    async def refuse_manifest_deletes(paths: list[str]) -> None:
        if paths and paths[0].endswith("manifest.json"):
            raise StoreError("delete", paths[0], "permission denied")
        await original_delete(paths)

    faulty.delete = refuse_manifest_deletes  # type: ignore[method-assign,assignment]
    result = await failing.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert len(result.failures) == 2 and "permission denied" in result.failures[0][1]
    for cid in await plain.list_checkpoints():
        await plain.load(cid)
    assert set(await plain.list_checkpoints()) == set(ids)


async def test_a_checkpoint_whose_manifest_gc_cannot_delete_keeps_all_it_names() -> None:
    inner = ObstoreStore(MemoryStore())
    plain = make_checkpointer(inner)
    ids = [
        (
            await plain.save(CheckpointData(epoch=e, snapshots={("op", 0): b"%d" % e * 100}))
        ).checkpoint_id
        for e in range(3)
    ]
    before = await paths_in(plain)
    faulty = FaultyStore(inner)
    original_delete = faulty.delete

    async def refuse_manifest_deletes(paths: list[str]) -> None:
        if paths and paths[0].endswith("manifest.json"):
            raise StoreError("delete", paths[0], "permission denied")
        await original_delete(paths)

    faulty.delete = refuse_manifest_deletes  # type: ignore[method-assign,assignment]
    result = await make_checkpointer(faulty).gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert [path for path, _ in result.failures] == [plain.paths.manifest(c) for c in ids[:2]]
    assert result.deleted == [] and result.objects_deleted == 0
    assert await paths_in(plain) == before | {plain.paths.clock()}
    for epoch, cid in enumerate(ids):
        assert bytes((await plain.load(cid)).artifacts[("op", 0)]) == b"%d" % epoch * 100


class GcMachine(RuleBasedStateMachine):
    """Saves, GCs with random policies, crashes at any store call, and loads, interleaved."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = ObstoreStore(MemoryStore())
        self.ckpt = make_checkpointer(self.inner)
        self.epoch = 0
        self.runner = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run_until_complete(coro)

    def teardown(self) -> None:
        self.runner.close()

    def latest(self) -> CheckpointId | None:
        return self.run(self.ckpt.read_latest())

    @initialize()
    def first(self) -> None:
        self.save_full()

    @rule()
    def save_full(self) -> None:
        self.epoch += 1
        self.run(
            self.ckpt.save(
                CheckpointData(
                    epoch=self.epoch,
                    snapshots={("op", p): f"{self.epoch}/{p}".encode() for p in range(2)},
                )
            )
        )

    @precondition(lambda self: self.latest() is not None)
    @rule(carry_only=st.booleans())
    def save_incremental(self, carry_only: bool) -> None:
        self.epoch += 1
        deltas = {} if carry_only else {("op", 0): f"+{self.epoch}".encode()}
        self.run(
            self.ckpt.save(CheckpointData(epoch=self.epoch, deltas=deltas, parent_id=self.latest()))
        )

    @rule(
        keep_last=st.integers(1, 3),
        every=st.none() | st.integers(2, 4),
        crash_at=st.none() | st.integers(1, 40),
    )
    def gc(self, keep_last: int, every: int | None, crash_at: int | None) -> None:
        policy = RetentionPolicy(keep_last=keep_last, keep_every_n_epochs=every)
        store = FaultyStore(self.inner, FaultPlan(crash_at=crash_at))
        collector = make_checkpointer(store)
        with contextlib.suppress(InjectedCrash):
            self.run(collector.gc(policy, min_age=NOW))

    @precondition(lambda self: self.latest() is not None)
    @rule(keep_last=st.integers(1, 2), incremental=st.booleans(), at_put=st.integers(1, 3))
    def slow_save_with_gc_inside(self, keep_last: int, incremental: bool, at_put: int) -> None:
        """A save during which a GC with min_age 0 runs: it commits whole and loads."""
        ran: list[int] = []
        puts = {"n": 0}

        async def gc_mid_save(op: str, path: str) -> None:
            if op == "put" and "/operators/" in path:
                puts["n"] += 1
                if puts["n"] == at_put and not ran:
                    ran.append(1)
                    collector = make_checkpointer(self.inner)
                    await collector.gc(RetentionPolicy(keep_last=keep_last), min_age=NOW)

        saver = make_checkpointer(FaultyStore(self.inner, FaultPlan(before_call=gc_mid_save)))
        saver.writer_generation = self.ckpt.writer_generation
        self.epoch += 1
        if incremental:
            data = CheckpointData(
                epoch=self.epoch, deltas={("op", 0): b"+slow"}, parent_id=self.latest()
            )
        else:
            data = CheckpointData(
                epoch=self.epoch, snapshots={("op", p): b"slow %d" % p for p in range(3)}
            )
        manifest = self.run(saver.save(data))
        assert self.latest() == manifest.checkpoint_id
        self.run(self.ckpt.load(manifest.checkpoint_id))

    @rule()
    def takeover(self) -> None:
        """A new writer takes over; the old one can no longer commit."""
        stale = self.ckpt
        self.ckpt = make_checkpointer(self.inner)
        self.run(self.ckpt.take_over())
        with pytest.raises(FencedError):
            self.run(stale.save(CheckpointData(epoch=self.epoch + 1, snapshots={("op", 0): b"x"})))

    @rule(crash_at=st.integers(1, 12))
    def crashed_save(self, crash_at: int) -> None:
        store = FaultyStore(self.inner, FaultPlan(crash_at=crash_at))
        # A killed process stops renewing its lease: a short one lapses by the next GC.
        writer = make_checkpointer(store, lease=dt.timedelta(milliseconds=1))
        writer.writer_generation = self.ckpt.writer_generation
        try:
            self.run(
                writer.save(
                    CheckpointData(
                        epoch=self.epoch + 1, snapshots={("op", p): b"crash" for p in range(2)}
                    )
                )
            )
        except InjectedCrash:
            pass
        else:
            self.epoch += 1

    @invariant()
    def every_listed_checkpoint_loads_whole(self) -> None:
        for cid in self.run(self.ckpt.list_checkpoints()):
            loaded = self.run(self.ckpt.load(cid))
            for links in loaded.chains.values():
                assert not links[0].entry.is_delta, "every chain starts at a snapshot"

    def teardown_check(self) -> None:
        """After a clean keep_last=1 GC only what the kept checkpoint reaches remains: two
        runs, since what the first claims or retires is swept by the next."""
        self.run(self.ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW))
        self.run(self.ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW))
        kept = self.run(self.ckpt.list_checkpoints())
        # The newest, the one _latest names, and every one newer than it (committed by a
        # save that crashed before its pointer swap: the pointer may still move there).
        manifests = {cid: self.run(self.ckpt.load_manifest(cid)) for cid in kept}
        order = {cid: (m.epoch, cid.uuid.int) for cid, m in manifests.items()}
        latest = self.latest()
        assert latest in kept
        newest = max(kept, key=lambda cid: order[cid])
        assert set(kept) == {newest, latest} | {c for c in kept if order[c] > order[latest]}
        remaining = self.run(checkpoint_objects(self.ckpt))
        needed: set[str] = set()
        for cid in kept:
            needed |= self.run(reachable_paths(self.ckpt, cid))
        assert needed <= remaining
        # A kept checkpoint's directory is left as it is: the intent of a save that
        # crashed after its commit goes with the checkpoint, not before.
        left = remaining - needed
        assert all(is_intent_path(p) and self.ckpt.paths.checkpoint_of(p) in kept for p in left)

    @rule()
    def full_gc_then_only_reachable_objects_remain(self) -> None:
        self.teardown_check()


GcMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGcMachine = GcMachine.TestCase
