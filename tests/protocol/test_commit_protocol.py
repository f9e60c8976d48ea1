"""The commit protocol under faults: crashes at every store call, lost replies, races,
fencing, corruption, and bad input. Runs against every backend where it takes ``ckpt``
or ``raw_store``.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore, ObjectStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore, InjectedCrash
from support.recording import RecordingStore
from support.samples import expected_artifacts, sample

from cairn import (
    CheckpointAbortedError,
    CheckpointData,
    CheckpointExistsError,
    CheckpointId,
    CheckpointNotFoundError,
    CorruptManifestError,
    FencedError,
    IntegrityError,
    InvalidCheckpointDataError,
    InvalidInputError,
    InvalidNameError,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
    StoreError,
    TransientStoreError,
)
from cairn.format.manifest import encode_manifest
from cairn.protocol._save import assemble_manifest
from cairn.stores import ObstoreStore, Store


async def snapshot_of_store(store: Store) -> dict[str, bytes]:
    return {info.path: bytes((await store.get(info.path)).data) for info in await store.list("")}


async def assert_loads(ckpt: ObjectStoreCheckpointer, epoch: int) -> None:
    latest = await ckpt.load_latest()
    assert latest is not None, "a committed checkpoint must load"
    assert latest.epoch == epoch
    snaps = {k: bytes(v) for k, v in latest.artifacts.items() if k[0] != "op-delta"}
    assert snaps == expected_artifacts(epoch)


# -- crash matrix ------------------------------------------------------------------------


async def test_crash_at_every_store_call(raw_store: ObjectStore) -> None:
    inner = ObstoreStore(raw_store)
    plain = make_checkpointer(inner)
    await plain.save(sample(0))
    counter = RecordingStore(inner)
    probe = CheckpointData(
        epoch=1, snapshots=sample(1).snapshots, source_offsets=sample(1).source_offsets
    )
    await make_checkpointer(counter).save(probe)
    calls = counter.calls
    commit_call = next(
        i
        for i, (op, path) in enumerate(counter.log, 1)
        if op == "put" and path.endswith("manifest.json")
    )
    assert calls >= 10 and commit_call < calls
    epoch = 1
    for k in range(1, calls + 1):
        epoch += 1
        data = CheckpointData(
            epoch=epoch,
            snapshots=sample(epoch).snapshots,
            source_offsets=sample(epoch).source_offsets,
        )
        crashing = make_checkpointer(FaultyStore(inner, FaultPlan(crash_at=k)))
        with pytest.raises(InjectedCrash):
            await crashing.save(data)
        listed = await plain.list_checkpoints()
        if k <= commit_call:
            assert data.id not in listed, f"crash at call {k} of {calls} must not commit"
            await assert_loads(plain, epoch - 1)
            epoch -= 1  # that epoch never happened
        else:
            assert data.id in listed, f"crash at call {k}, after the commit point, keeps it"
            await assert_loads(plain, epoch)
        # And the store is still usable: a new save succeeds and becomes latest.
        epoch += 1
        done = await plain.save(CheckpointData(epoch=epoch, snapshots=sample(epoch).snapshots))
        assert await plain.read_latest() == done.checkpoint_id
        await assert_loads(plain, epoch)


async def test_a_failing_call_at_every_step_leaves_the_store_consistent(
    raw_store: ObjectStore,
) -> None:
    inner = ObstoreStore(raw_store)
    plain = make_checkpointer(inner)
    await plain.save(sample(0))
    for k in range(1, 12):
        failing = make_checkpointer(
            FaultyStore(inner, FaultPlan(fail_calls={k: StoreError("put", "x", "boom")}))
        )
        data = sample(k, parent=None)
        try:
            await failing.save(data)
        except StoreError:
            assert data.id not in await plain.list_checkpoints()
            leftovers = [i.path for i in await inner.list(plain.paths.checkpoint_dir(data.id))]
            assert leftovers == [], "a failed save removes what it uploaded"
        else:
            assert data.id in await plain.list_checkpoints()
        latest = await plain.load_latest()
        assert latest is not None
        assert {k2: bytes(v) for k2, v in latest.artifacts.items()} == expected_artifacts(
            latest.epoch
        )


# -- ambiguous writes --------------------------------------------------------------------


async def test_lost_reply_of_our_commit_is_a_success(raw_store: ObjectStore) -> None:
    faulty = FaultyStore(
        ObstoreStore(raw_store), FaultPlan(lose_put_responses_matching="manifest.json")
    )
    ckpt = make_checkpointer(faulty)
    manifest = await ckpt.save(sample(1))
    assert faulty.plan.lose_put_responses_matching is None, "the fault did fire"
    assert await ckpt.read_latest() == manifest.checkpoint_id
    assert (await ckpt.load(manifest.checkpoint_id)).manifest == manifest


async def test_lost_reply_when_another_writer_committed_is_a_conflict(
    raw_store: ObjectStore,
) -> None:
    inner = ObstoreStore(raw_store)
    data = sample(1)
    other = make_checkpointer(inner)
    theirs = CheckpointData(epoch=9, snapshots={("x", 0): b"theirs"}, checkpoint_id=data.id)

    fired: list[bool] = []

    async def times_out_while_another_writer_commits(op: str, path: str) -> None:
        if op == "put" and path.endswith("manifest.json") and not fired:
            fired.append(True)
            await other.save_manifest(assemble_manifest(theirs.id, theirs.epoch, []))
            raise TransientStoreError(op, path, "injected: timed out, did not land")

    faulty = FaultyStore(inner, FaultPlan(before_call=times_out_while_another_writer_commits))
    ckpt = make_checkpointer(faulty)
    with pytest.raises(CheckpointExistsError):
        await ckpt.save(data)
    committed = await other.load_manifest(data.id)
    assert fired == [True]
    assert committed.epoch == 9, "the other writer's commit is untouched"
    assert await ckpt.read_latest() is None, "our failed commit did not move _latest"


# -- races -------------------------------------------------------------------------------


async def run_writers(stores: list[Store], rounds: int) -> dict[CheckpointId, bytes]:
    """8 writers, each saving ``rounds`` checkpoints with increasing epochs."""
    written: dict[CheckpointId, bytes] = {}

    async def writer(w: int, store: Store) -> None:
        ckpt = make_checkpointer(store)
        for r in range(rounds):
            epoch = r * len(stores) + w
            manifest = await ckpt.save(
                CheckpointData(epoch=epoch, snapshots={("op", w): f"{w}/{r}".encode()})
            )
            written[manifest.checkpoint_id] = encode_manifest(manifest)
            await asyncio.sleep(random.random() / 100)

    await asyncio.gather(*(writer(w, s) for w, s in enumerate(stores)))
    return written


async def test_concurrent_writers_race_to_latest(raw_store: ObjectStore) -> None:
    stores: list[Store] = [ObstoreStore(raw_store) for _ in range(8)]
    written = await run_writers(stores, rounds=4)
    reader = make_checkpointer(raw_store)
    committed = await reader.list_checkpoints()
    assert sorted(written) == committed
    for cid, body in written.items():
        stored = await reader.store.get(reader.paths.manifest(cid))
        assert bytes(stored.data) == body, f"manifest of {cid} is byte-identical"
    epochs = {cid: (await reader.load_manifest(cid)).epoch for cid in committed}
    best = max(epochs, key=lambda c: (epochs[c], c))
    assert await reader.read_latest() == best
    assert epochs[best] == 8 * 4 - 1


# -- fencing -----------------------------------------------------------------------------


async def test_takeover_fences_the_old_writer(raw_store: ObjectStore) -> None:
    old = make_checkpointer(raw_store)
    new = make_checkpointer(raw_store)
    kept = await old.save(sample(1))
    assert await new.take_over() == 1
    assert await new.read_latest() == kept.checkpoint_id, "a takeover keeps the latest"
    fenced = sample(50)
    with pytest.raises(FencedError) as info:
        await old.save(fenced)
    assert (info.value.own_generation, info.value.current_generation) == (0, 1)
    assert fenced.id not in await new.list_checkpoints()
    mine = await new.save(sample(2))
    assert await new.read_latest() == mine.checkpoint_id
    with pytest.raises(FencedError):
        await old.update_latest(kept.checkpoint_id, force=True)
    newer = make_checkpointer(raw_store)
    assert await newer.take_over() == 2
    with pytest.raises(FencedError):
        await new.save(sample(3))


async def test_takeover_between_fence_check_and_commit(raw_store: ObjectStore) -> None:
    """The old writer passed its fence check; the takeover lands before its manifest. The
    takeover claimed the id of the save in flight: its commit fails, and nothing of it
    stays."""
    inner = ObstoreStore(raw_store)
    new = make_checkpointer(inner)
    fired: list[int] = []

    async def takeover_just_before_commit(op: str, path: str) -> None:
        if op == "put" and path.endswith("manifest.json") and not fired:
            fired.append(await new.take_over())

    old = make_checkpointer(FaultyStore(inner, FaultPlan(before_call=takeover_just_before_commit)))
    base = await new.save(sample(0))
    data = sample(7)
    with pytest.raises(CheckpointAbortedError, match="its id was claimed"):
        await old.save(data)
    assert fired == [1]
    assert await new.read_latest() == base.checkpoint_id, "_latest never names a fenced commit"
    assert data.id not in await new.list_checkpoints(), "the fenced save never commits"
    await assert_loads(new, 0)


async def test_takeover_racing_a_saving_writer(raw_store: ObjectStore) -> None:
    old = make_checkpointer(raw_store)
    new = make_checkpointer(raw_store)
    outcomes: list[tuple[CheckpointId, str]] = []

    async def keep_saving() -> None:
        for epoch in range(1, 200):
            data = CheckpointData(epoch=epoch, snapshots={("op", 0): str(epoch).encode()})
            try:
                await old.save(data)
                outcomes.append((data.id, "ok"))
            except CheckpointAbortedError:
                # It read the fence before the raise: the takeover found its intent and
                # claimed its id, so its create failed. The next save reads the fence.
                outcomes.append((data.id, "claimed"))
            except FencedError:
                outcomes.append((data.id, "fenced"))
                return

    async def take_over_later() -> None:
        await asyncio.sleep(0.05 + random.random() / 20)
        await new.take_over()

    await asyncio.gather(keep_saving(), take_over_later())
    assert outcomes[-1][1] == "fenced", "the old writer ends fenced"
    results = [result for _, result in outcomes[:-1]]
    assert results.count("claimed") <= 1 and "claimed" not in results[:-1], outcomes
    latest = await new.read_latest()
    refused = [cid for cid, result in outcomes if result != "ok"]
    assert latest not in refused
    assert not set(refused) & set(await new.list_checkpoints())
    assert latest in [cid for cid, result in outcomes if result == "ok"] or latest is None
    mine = await new.save(CheckpointData(epoch=1000))
    assert await new.read_latest() == mine.checkpoint_id


# -- load_latest fallbacks ---------------------------------------------------------------


async def test_load_latest_falls_back_from_a_bad_pointer(ckpt: ObjectStoreCheckpointer) -> None:
    assert await ckpt.load_latest() is None
    first = await ckpt.save(sample(1))
    second = await ckpt.save(sample(2))
    pointer = ckpt.paths.latest_pointer()

    await ckpt.store.delete([pointer])  # missing
    await assert_loads(ckpt, 2)
    await ckpt.store.put(pointer, b"\x00garbage")  # unreadable
    await assert_loads(ckpt, 2)
    await ckpt.store.put(pointer, str(first.checkpoint_id).encode())  # stale (reference format)
    await assert_loads(ckpt, 2)
    await ckpt.store.put(pointer, str(CheckpointId.now()).encode())  # names a missing one
    await assert_loads(ckpt, 2)
    await ckpt.store.delete([pointer])
    await ckpt.update_latest(second.checkpoint_id)
    snap = artifact_path(ckpt.paths, second, "op0", 0)
    await ckpt.store.put(snap, b"corrupted")  # names a corrupt one
    await assert_loads(ckpt, 1)
    await ckpt.store.put(ckpt.paths.manifest(first.checkpoint_id), b"{}")
    assert await ckpt.load_latest() is None, "no valid checkpoint left"


async def test_a_stale_pointer_after_a_crash_is_passed_by(ckpt: ObjectStoreCheckpointer) -> None:
    await ckpt.save(sample(1))
    orphan_commit = sample(2)  # committed, but the writer died before moving _latest
    # Commit it the reference way: partitions, then the manifest, no pointer update.
    uploaded = await ckpt.save_partitions_concurrent(
        orphan_commit.id, [(o, p, False, d) for (o, p), d in orphan_commit.snapshots.items()]
    )
    await ckpt.save_manifest(assemble_manifest(orphan_commit.id, orphan_commit.epoch, uploaded))
    await assert_loads(ckpt, 2)


# -- corruption --------------------------------------------------------------------------


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(target=st.integers(0, 1_000), position=st.integers(0, 10**6), xor=st.integers(1, 255))
async def test_any_flipped_byte_is_detected_and_passed_by(
    target: int, position: int, xor: int
) -> None:
    ckpt = make_checkpointer(MemoryStore())
    await ckpt.save(sample(1))
    victim = await ckpt.save(sample(2))
    objects = [
        i.path
        for i in await ckpt.store.list(ckpt.paths.checkpoint_dir(victim.checkpoint_id))
        if "/offsets/" not in i.path
    ]
    path = sorted(objects)[target % len(objects)]
    body = bytearray((await ckpt.store.get(path)).data)
    body[position % len(body)] ^= xor
    await ckpt.store.put(path, bytes(body))
    with pytest.raises(IntegrityError):
        await ckpt.load(victim.checkpoint_id)
    await assert_loads(ckpt, 1)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: CheckpointData(epoch=-1), InvalidCheckpointDataError),
        (lambda: CheckpointData(epoch=True), InvalidCheckpointDataError),
        (
            lambda: CheckpointData(
                epoch=1,
                snapshots={("a", 0): b"x"},
                deltas={("a", 0): b"y"},
                parent_id=CheckpointId.now(),
            ),
            InvalidCheckpointDataError,
        ),
        (lambda: CheckpointData(epoch=1, deltas={("a", 0): b"y"}), InvalidCheckpointDataError),
        (lambda: CheckpointData(epoch=1, snapshots={("a/b", 0): b"x"}), InvalidNameError),
        (lambda: CheckpointData(epoch=1, snapshots={("a", -1): b"x"}), InvalidNameError),
        (
            lambda: CheckpointData(epoch=1, snapshots={("a", 0): "text"}),  # type: ignore[dict-item]
            InvalidCheckpointDataError,
        ),
        (
            lambda: CheckpointData(epoch=1, source_offsets={"..": SourceOffsetEntry("k")}),
            InvalidNameError,
        ),
        (
            lambda: CheckpointData(epoch=1, source_offsets={"s": {"0": "1"}}),  # type: ignore[dict-item]
            InvalidCheckpointDataError,
        ),
    ],
)
def test_bad_checkpoint_data_is_refused_before_any_io(make: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        make()  # type: ignore[operator]


async def test_bad_input_leaves_the_store_unchanged(ckpt: ObjectStoreCheckpointer) -> None:
    good = await ckpt.save(sample(1))
    before = await snapshot_of_store(ckpt.store)
    with pytest.raises(CheckpointNotFoundError):  # a delta whose parent does not exist
        await ckpt.save(
            CheckpointData(epoch=2, deltas={("a", 0): b"d"}, parent_id=CheckpointId.now())
        )
    with pytest.raises(CheckpointExistsError):
        await ckpt.save(CheckpointData(epoch=3, checkpoint_id=good.checkpoint_id))
    with pytest.raises(InvalidNameError):
        await ckpt.save_partitions_concurrent(
            CheckpointId.now(), [("ok", 0, False, b"x"), ("", 1, False, b"y")]
        )
    with pytest.raises(InvalidInputError):
        await ckpt.save("not data")  # type: ignore[arg-type]
    assert await snapshot_of_store(ckpt.store) == before


async def test_corrupt_manifest_is_typed_and_changes_nothing(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    good = await ckpt.save(sample(1))
    path = ckpt.paths.manifest(good.checkpoint_id)
    await ckpt.store.put(path, b'{"version": 2, "checkpoint_id": "')
    before = await snapshot_of_store(ckpt.store)
    with pytest.raises(CorruptManifestError) as info:
        await ckpt.load(good.checkpoint_id)
    assert info.value.path == path
    assert await snapshot_of_store(ckpt.store) == before
