"""Keyed state saved by N workers and restored by M, on real stores: every key once,
each group read alone by ranged reads and verified alone, key spaces that disagree
refused before anything is committed."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from support.backends import make_checkpointer, make_store

from cairn import (
    CheckpointData,
    CheckpointInUseError,
    IntegrityMismatchError,
    InvalidCheckpointDataError,
    InvalidInputError,
    KeyedSnapshot,
    KeyGroupError,
    KeyGroups,
    KeySpaceMismatchError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    SyncCheckpointer,
)
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.protocol.copy import copy_checkpoints
from cairn.stores import ForwardingStore, ObstoreStore, Store, StoreMethod

T = TypeVar("T")

KEYS = 5000
COUNTS = KeyGroups(128)
PARALLELISMS = (1, 3, 4, 7)


class ByteCountingStore(ForwardingStore):
    """Counts the bytes every read returns, per path."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.read: dict[str, int] = {}
        self.requests = 0

    def reset(self) -> None:
        self.read, self.requests = {}, 0

    async def _around(
        self, operation: StoreMethod, path: str, call: Callable[[], Awaitable[T]], **_: object
    ) -> T:
        result = await call()
        if operation in ("get", "get_range"):
            self.requests += 1
            data: Buffer = result.data if operation == "get" else result  # type: ignore[attr-defined,assignment]
            self.read[path] = self.read.get(path, 0) + memoryview(data).nbytes
        return result

    def artifact_bytes(self) -> int:
        return sum(n for path, n in self.read.items() if not path.endswith("manifest.json"))


def random_state(seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {
        rng.randbytes(rng.randint(1, 24)): rng.randbytes(rng.randint(0, 40)) for _ in range(KEYS)
    }


def encode(pairs: dict[bytes, bytes]) -> bytes:
    return json.dumps(sorted([k.hex(), v.hex()] for k, v in pairs.items())).encode()


def decode(data: Buffer) -> list[tuple[bytes, bytes]]:
    return [(bytes.fromhex(k), bytes.fromhex(v)) for k, v in json.loads(bytes(data))]


def snapshots_of(
    state: dict[bytes, bytes], workers: int, space: KeyGroups = COUNTS
) -> dict[tuple[str, int], KeyedSnapshot]:
    """What ``workers`` workers save: each its groups, each group the pairs of its keys."""
    per_group: dict[int, dict[bytes, bytes]] = {}
    for key, value in state.items():
        per_group.setdefault(space.group_of(key), {})[key] = value
    return {
        ("counts", worker): KeyedSnapshot(
            space,
            {g: encode(per_group[g]) for g in space.groups_of(worker, workers) if g in per_group},
        )
        for worker in range(workers)
    }


@pytest.fixture(params=["memory", "local", "s3", "gcs"])
def keyed_store(request: pytest.FixtureRequest, tmp_path: Path) -> ByteCountingStore:
    return ByteCountingStore(ObstoreStore(make_store(str(request.param), tmp_path, request)))


@pytest.mark.parametrize("saved_by", PARALLELISMS)
async def test_keys_saved_by_n_workers_restore_once_each_on_m_workers(
    keyed_store: ByteCountingStore, saved_by: int
) -> None:
    ckpt = make_checkpointer(keyed_store)
    state = random_state(saved_by)
    snapshots = snapshots_of(state, saved_by)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    cid = manifest.checkpoint_id
    index_bytes = {
        entry.partition_id: entry.index_size_bytes or 0
        for entry in manifest.operators["counts"].partitions
    }
    for restored_by in PARALLELISMS:
        plan = await ckpt.restore_plan(cid, workers=restored_by)
        restored: list[tuple[bytes, bytes]] = []
        for worker in range(restored_by):
            groups = COUNTS.groups_of(worker, restored_by)
            assignment = plan.worker(worker).keyed["counts"]
            assert assignment.groups == groups
            keyed_store.reset()
            got = await ckpt.load_key_groups(cid, "counts", groups, key_groups=COUNTS)
            group_bytes = sum(memoryview(data).nbytes for data in got.values())
            partitions = {read.partition for read in assignment.reads}
            indexes = sum(index_bytes[p] for p in partitions)
            assert keyed_store.artifact_bytes() <= 1.1 * group_bytes + indexes
            keyed_store.reset()
            planned = await ckpt.load_assignment(assignment)
            assert keyed_store.artifact_bytes() <= 1.1 * group_bytes
            assert keyed_store.requests <= len(partitions) + group_bytes // (8 << 20) + 1
            assert {g: bytes(v) for g, v in planned.items()} == {
                g: bytes(v) for g, v in got.items()
            }
            for group, data in got.items():
                assert group in groups
                for key, value in decode(data):
                    assert COUNTS.group_of(key) == group
                    restored.append((key, value))
        assert len(restored) == len(state)  # each exactly once
        assert dict(restored) == state


async def test_a_flipped_byte_fails_only_its_group_naming_operator_partition_and_group(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = ObstoreStore(make_store("local", tmp_path, request))
    ckpt = make_checkpointer(store)
    state = random_state(7)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots_of(state, 3)))
    cid = manifest.checkpoint_id
    plan = await ckpt.restore_plan(cid, workers=3)
    victim = plan.worker(1).keyed["counts"].reads[5]
    blob = bytearray((await store.get(victim.path)).data)
    blob[victim.offset + victim.length // 2] ^= 0x01
    await store.put(victim.path, bytes(blob))

    with pytest.raises(IntegrityMismatchError) as caught:
        await ckpt.load_key_groups(cid, "counts", range(128))
    error = caught.value
    assert (error.operator, error.partition, error.group) == ("counts", 1, victim.group)
    assert error.others == ()
    assert f"operator 'counts', partition 1, key group {victim.group}: " in str(error)
    assert f"sha256 of key group {victim.group}" in str(error)
    others = [g for g in range(128) if g != victim.group]
    got = await ckpt.load_key_groups(cid, "counts", others)
    assert len(got) == len(others)
    with pytest.raises(IntegrityMismatchError, match=f"key group {victim.group}"):
        await ckpt.load_assignment(plan.worker(1).keyed["counts"])
    assert len(await ckpt.load_assignment(plan.worker(0).keyed["counts"])) == len(
        COUNTS.groups_of(0, 3)
    )


async def committed(ckpt: ObjectStoreCheckpointer) -> list[CheckpointId]:
    return await ckpt.list_checkpoints()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: {
                ("counts", 0): KeyedSnapshot(KeyGroups(8), {0: b"a", 3: b"b"}),
                ("counts", 1): KeyedSnapshot(KeyGroups(8), {3: b"c"}),
            },
            "partitions 0 and 1 both hold key group 3",
        ),
        (
            lambda: {
                ("counts", 0): KeyedSnapshot(KeyGroups(8), {0: b"a"}),
                ("counts", 1): KeyedSnapshot(KeyGroups(16), {9: b"c"}),
            },
            "partition 1 has 16 key groups, partition 0 8",
        ),
        (
            lambda: {
                ("counts", 0): KeyedSnapshot(KeyGroups(8), {0: b"a"}),
                ("counts", 1): b"plain",
            },
            "partition 1 is not a KeyedSnapshot",
        ),
    ],
)
async def test_a_save_whose_partitions_disagree_commits_nothing(
    make: Callable[[], dict[tuple[str, int], object]], message: str
) -> None:
    ckpt = make_checkpointer("memory://")
    with pytest.raises(KeySpaceMismatchError, match=message):
        await ckpt.save(CheckpointData(epoch=1, snapshots=make()))  # type: ignore[arg-type]
    assert await committed(ckpt) == []
    assert await ckpt.store.list("") == []


async def test_partitions_uploaded_apart_that_overlap_are_refused_at_the_commit() -> None:
    """Two workers upload on their own; the commit of what they uploaded refuses."""
    ckpt = make_checkpointer("memory://")
    cid = CheckpointId.now()
    space = KeyGroups(8)
    first = await ckpt.save_partitions_concurrent(
        cid, [("counts", 0, False, KeyedSnapshot(space, {0: b"a", 1: b"b"}))]
    )
    second = await ckpt.save_partitions_concurrent(
        cid, [("counts", 1, False, KeyedSnapshot(space, {1: b"c"}))]
    )
    from cairn.protocol._save import assemble_manifest

    manifest = assemble_manifest(cid, 1, first + second)
    with pytest.raises(KeySpaceMismatchError, match="partitions 0 and 1 both hold key group 1"):
        await ckpt.commit(manifest)
    assert await committed(ckpt) == []


async def test_a_keyed_delta_is_refused() -> None:
    with pytest.raises(InvalidCheckpointDataError, match="KeyedSnapshot given as a delta"):
        CheckpointData(
            epoch=1,
            deltas={("counts", 0): KeyedSnapshot(KeyGroups(8), {0: b"a"})},
            parent_id=CheckpointId.now(),
        )


async def test_a_save_with_another_count_than_its_parent_commits_nothing() -> None:
    ckpt = make_checkpointer("memory://")
    parent = await ckpt.save(
        CheckpointData(epoch=1, snapshots=snapshots_of(random_state(1), 2, KeyGroups(16)))
    )
    before = await ckpt.store.list("")
    with pytest.raises(KeySpaceMismatchError, match="the key-group count is fixed"):
        await ckpt.save(
            CheckpointData(
                epoch=2,
                parent_id=parent.checkpoint_id,
                snapshots=snapshots_of(random_state(1), 2, KeyGroups(32)),
            )
        )
    assert await committed(ckpt) == [parent.checkpoint_id]
    assert sorted(i.path for i in await ckpt.store.list("")) == sorted(i.path for i in before)


@pytest.mark.parametrize(("before", "after"), [(4, 3), (3, 7), (7, 1)])
async def test_a_save_after_a_rescale_uploads_only_the_changed_groups(
    before: int, after: int
) -> None:
    ckpt = make_checkpointer("memory://")
    state = random_state(before)
    parent = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots_of(state, before)))
    state[b"new key"] = b"new value"
    changed = COUNTS.group_of(b"new key")
    child = await ckpt.save(
        CheckpointData(
            epoch=2, parent_id=parent.checkpoint_id, snapshots=snapshots_of(state, after)
        )
    )
    entries = child.operators["counts"].partitions
    own = [e for e in entries if e.owner is None]
    assert sorted(e.partition_id for e in own) == list(range(after))
    assert [e.key_groups.groups for e in own if e.key_groups and e.key_groups.groups] == [
        ((changed, changed + 1),)
    ]
    carried = [e for e in entries if e.owner is not None]
    assert {e.owner for e in carried} == {parent.checkpoint_id}
    held = sorted(
        g for e in carried if e.key_groups for s, t in e.key_groups.held for g in range(s, t)
    )
    assert held == sorted(set(range(128)) - {changed})
    for entry in carried:
        assert entry.key_groups is not None
        owner = COUNTS.owner_of(entry.key_groups.held[0][0], after)
        assert entry.partition_id == owner  # carried into the partition that now holds it
    stats = child.stats
    assert stats is not None
    group_bytes = len(encode({k: v for k, v in state.items() if COUNTS.group_of(k) == changed}))
    assert stats.uploaded_bytes == group_bytes + sum(e.index_size_bytes or 0 for e in own)
    got = await ckpt.load_key_groups(child.checkpoint_id, "counts", range(128))
    assert dict(pair for data in got.values() for pair in decode(data)) == state
    # The parent's objects stay while the child reads groups from them, GC or not.
    await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert await committed(ckpt) == [child.checkpoint_id]
    got = await ckpt.load_key_groups(child.checkpoint_id, "counts", range(128))
    assert dict(pair for data in got.values() for pair in decode(data)) == state
    assert (await ckpt.load(child.checkpoint_id)).checkpoint_id == child.checkpoint_id
    # A later save carries from both: groups named in its parent by reference stay there.
    grandchild = await ckpt.save(
        CheckpointData(
            epoch=3, parent_id=child.checkpoint_id, snapshots=snapshots_of(state, before)
        )
    )
    assert grandchild.stats is not None and grandchild.stats.uploaded_bytes == sum(
        e.index_size_bytes or 0 for e in grandchild.operators["counts"].partitions if not e.owner
    )
    assert {e.owner for e in grandchild.operators["counts"].partitions} == {
        None,
        parent.checkpoint_id,
        child.checkpoint_id,
    }
    plan = await ckpt.restore_plan(grandchild.checkpoint_id, workers=after)
    restored: dict[bytes, bytes] = {}
    for worker in plan.assignments:
        for data in (await ckpt.load_assignment(worker.keyed["counts"])).values():
            restored.update(decode(data))
    assert restored == state


async def test_an_unchanged_keyed_partition_is_carried_and_a_partial_one_refused() -> None:
    ckpt = make_checkpointer("memory://")
    space = KeyGroups(8)
    parent = await ckpt.save(
        CheckpointData(
            epoch=1,
            snapshots={
                ("counts", 0): KeyedSnapshot(space, {0: b"a", 1: b"b"}),
                ("counts", 1): KeyedSnapshot(space, {4: b"e", 5: b"f"}),
            },
        )
    )
    child = await ckpt.save(
        CheckpointData(
            epoch=2,
            parent_id=parent.checkpoint_id,
            snapshots={("counts", 0): KeyedSnapshot(space, {0: b"A", 1: b"B"})},
        )
    )
    carried = [e for e in child.operators["counts"].partitions if e.owner is not None]
    assert [(e.partition_id, e.owner) for e in carried] == [(1, parent.checkpoint_id)]
    got = await ckpt.load_key_groups(child.checkpoint_id, "counts", range(8))
    assert {g: bytes(v) for g, v in got.items()} == {0: b"A", 1: b"B", 4: b"e", 5: b"f"}
    with pytest.raises(KeySpaceMismatchError, match="holds key groups that the new partitions"):
        await ckpt.save(
            CheckpointData(
                epoch=3,
                parent_id=child.checkpoint_id,
                snapshots={("counts", 2): KeyedSnapshot(space, {4: b"E"})},
            )
        )


async def test_reading_asks_for_the_right_key_space() -> None:
    ckpt = make_checkpointer("memory://")
    manifest = await ckpt.save(
        CheckpointData(
            epoch=1,
            snapshots={
                ("counts", 0): KeyedSnapshot(KeyGroups(8), {2: b"x"}),
                ("plain", 0): b"not keyed",
            },
        )
    )
    cid = manifest.checkpoint_id
    with pytest.raises(KeyGroupError, match="key group 8 is out of range: expected 0..7"):
        await ckpt.load_key_groups(cid, "counts", [8])
    with pytest.raises(KeySpaceMismatchError, match="has 8 key groups, the reader expects 16"):
        await ckpt.load_key_groups(cid, "counts", [1], key_groups=KeyGroups(16))
    with pytest.raises(KeySpaceMismatchError, match="holds no keyed state"):
        await ckpt.load_key_groups(cid, "plain", [0])
    assert await ckpt.load_key_groups(cid, "counts", [0, 1]) == {}  # held by none: no state
    plan = await ckpt.restore_plan(cid, workers=2, non_keyed="union")
    assert [w.partitions for w in plan.assignments] == [{"plain": (0,)}, {"plain": (0,)}]
    # The whole checkpoint still loads as before, each keyed object verified range by range.
    loaded = await ckpt.load(cid)
    assert bytes(loaded.artifacts[("plain", 0)]) == b"not keyed"


def test_the_blocking_checkpointer_reads_key_groups() -> None:
    with SyncCheckpointer("memory://") as ckpt:
        manifest = ckpt.save(
            CheckpointData(
                epoch=1, snapshots={("counts", 0): KeyedSnapshot(KeyGroups(4), {1: b"one"})}
            )
        )
        got = ckpt.load_key_groups(manifest.checkpoint_id, "counts", [1, 2])
        assert {g: bytes(v) for g, v in got.items()} == {1: b"one"}
        plan = ckpt.restore_plan(manifest.checkpoint_id, workers=4)
        assert bytes(ckpt.load_assignment(plan.worker(1).keyed["counts"])[1]) == b"one"


def test_keyed_snapshot_input_is_checked() -> None:
    with pytest.raises(KeyGroupError, match="key group 9"):
        KeyedSnapshot(KeyGroups(8), {9: b"x"})
    with pytest.raises(InvalidInputError, match="must be bytes-like"):
        KeyedSnapshot(KeyGroups(8), {1: "text"})  # type: ignore[dict-item]
    with pytest.raises(InvalidInputError, match="must be a KeyGroups"):
        KeyedSnapshot(8, {})  # type: ignore[arg-type]


async def test_objects_a_checkpoint_reads_groups_from_stay_deletable_only_with_it() -> None:
    """A parent whose objects a child reads groups from is in use; a copy of the child
    alone takes those objects with it."""
    ckpt = make_checkpointer("memory://")
    state = random_state(11)
    parent = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots_of(state, 4)))
    state[b"another key"] = b"v"
    child = await ckpt.save(
        CheckpointData(epoch=2, parent_id=parent.checkpoint_id, snapshots=snapshots_of(state, 3))
    )
    with pytest.raises(CheckpointInUseError):
        await ckpt.delete_checkpoint(parent.checkpoint_id)

    target = make_checkpointer("memory://")
    [copied] = await copy_checkpoints(ckpt, target, [child.checkpoint_id])
    assert copied.status == "copied", copied
    got = await target.load_key_groups(child.checkpoint_id, "counts", range(128))
    assert dict(pair for data in got.values() for pair in decode(data)) == state
