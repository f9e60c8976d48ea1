"""How many round trips a save and a load wait for, one after another, and what they ask
of the store: counted exactly (:mod:`support.roundtrips`), on every kind of store.

A small save takes four sequential round trips: its intent and uploads at once (with
``_latest`` read beside them when the checkpointer holds no version of it), the fence
read and the check of its artifacts at once, the create of its manifest, then the swap
of ``_latest``, the check after the create and the removal of its intent at once.
``load_latest`` takes three, in a new process too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.backends import make_store
from support.roundtrips import RoundTripStore, simulate

from cairn import (
    CheckpointData,
    CheckpointId,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
)
from cairn.stores import as_store

BACKENDS = ["memory", "local", "s3", "gcs"]


def small(epoch: int, **fields: object) -> CheckpointData:
    """64 partitions of 4 KiB and one source offset: state that fits in one pack."""
    snapshots = {(f"op{p // 8}", p % 8): bytes([epoch]) * 4096 for p in range(64)}
    offsets = {"events": SourceOffsetEntry("kafka", {"0": str(epoch)}, epoch)}
    return CheckpointData(epoch=epoch, snapshots=snapshots, source_offsets=offsets, **fields)  # type: ignore[arg-type]


def incremental(epoch: int, parent: CheckpointId) -> CheckpointData:
    """One partition in ten of :func:`small` changed, as a delta on ``parent``."""
    deltas = {(f"op{p // 8}", p % 8): b"+" * 400 for p in range(0, 64, 10)}
    offsets = {"events": SourceOffsetEntry("kafka", {"0": str(epoch)}, epoch)}
    return CheckpointData(epoch=epoch, deltas=deltas, parent_id=parent, source_offsets=offsets)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> RoundTripStore:
    backend = str(request.param)
    if backend in ("s3", "gcs"):
        request.applymarker(pytest.mark.servers)
    return RoundTripStore(as_store(make_store(backend, tmp_path, request)))


def test_a_save_and_a_load_wait_for_few_round_trips(store: RoundTripStore) -> None:
    async def scenario() -> None:
        ckpt = ObjectStoreCheckpointer(store)
        with store.measure() as first:
            await ckpt.save(small(1))
        # A new checkpointer chooses its layout (both listings at once) first.
        assert first.round_trips == 5, first.trace()

        with store.measure() as later:
            saved = await ckpt.save(small(2))
        assert later.round_trips == 4, later.trace()
        # Intent, pack, manifest and pointer; the fence; a listing before the create and
        # one after; the intent removed. No HEAD: a generated id needs no check.
        assert later.requests() == {"put": 4, "get": 1, "list": 2, "delete": 1}, later.trace()

        with store.measure() as delta:
            # Incremental: one partition changes, the 63 others are carried.
            data = CheckpointData(
                epoch=3, parent_id=saved.checkpoint_id, deltas={("op0", 0): b"+" * 400}
            )
            await ckpt.save(data)
        assert delta.round_trips == 4, delta.trace()

        with store.measure() as given:
            await ckpt.save(small(4, checkpoint_id=CheckpointId.now()))
        # An id given, not generated, is checked not to be committed: beside the uploads.
        assert given.round_trips == 4 and given.requests()["head"] == 1, given.trace()

        with store.measure() as warm:
            loaded = await ckpt.load_latest()
        assert loaded is not None and loaded.manifest.epoch == 4
        assert warm.round_trips == 3, warm.trace()

        fresh = ObjectStoreCheckpointer(store)  # as in a new process
        with store.measure() as cold:
            loaded = await fresh.load_latest()
        assert loaded is not None and loaded.manifest.epoch == 4
        assert cold.round_trips == 3, cold.trace()

        with store.measure() as takeover:
            await fresh.take_over()
        assert takeover.round_trips <= 7, takeover.trace()

    simulate(store, scenario)


def test_pipelined_saves_overlap_their_round_trips() -> None:
    """Saves handed over at once: each uploads and checks while the one before commits,
    and they commit in order; one at a time they would take four round trips each."""
    store = RoundTripStore(as_store("memory://"))

    async def scenario() -> None:
        ckpt = ObjectStoreCheckpointer(store, max_saves_in_flight=2)
        await ckpt.save(small(1))
        with store.measure() as four:
            tasks = [await ckpt.save_async(small(epoch)) for epoch in range(2, 6)]
            await ckpt.wait_for_saves()
        assert [(await task).epoch for task in tasks] == [2, 3, 4, 5]
        assert await ckpt.read_latest() == (await tasks[-1]).checkpoint_id
        # The first takes four; each after it two more (its create, then its swap).
        assert four.round_trips == 4 + 3 * 2, four.trace()

    simulate(store, scenario)


def test_pipelined_incremental_saves_wait_only_for_their_parent() -> None:
    """Each save builds on the one before it, handed over at once: its uploads overlap
    that save, and it takes its parent's chains from what that save commits once it has,
    then checks (its parent's manifest too), creates and swaps: three round trips."""
    store = RoundTripStore(as_store("memory://"))

    async def scenario() -> None:
        ckpt = ObjectStoreCheckpointer(store, max_saves_in_flight=2)
        parent = (await ckpt.save(small(1))).checkpoint_id
        with store.measure() as chained:
            tasks = []
            for epoch in range(2, 6):
                data = incremental(epoch, parent)
                tasks.append(await ckpt.save_async(data))
                parent = data.id
            await ckpt.wait_for_saves()
        assert [(await task).epoch for task in tasks] == [2, 3, 4, 5]
        assert await ckpt.read_latest() == parent
        assert chained.round_trips == 4 + 3 * 3, chained.trace()

    simulate(store, scenario)


def test_a_save_lists_its_own_directory_and_its_parents_not_every_owner() -> None:
    """A save whose chains reach back to many checkpoints (each changed a partition)
    lists, around its create, its own directory and its parent's: one listing each,
    however far back they reach (what it carries stands while its parent does)."""
    store = RoundTripStore(as_store("memory://"))

    async def scenario() -> None:
        ckpt = ObjectStoreCheckpointer(store)
        base = small(1)
        parent = (await ckpt.save(base)).checkpoint_id
        for epoch in range(2, 10):  # each its own owner of one partition
            data = CheckpointData(
                epoch=epoch, snapshots={("op0", epoch % 8): b"new" * epoch}, parent_id=parent
            )
            parent = (await ckpt.save(data)).checkpoint_id
        with store.measure() as counted:
            last = CheckpointData(epoch=10, snapshots={("op1", 0): b"last"}, parent_id=parent)
            manifest = await ckpt.save(last)
        owners = {entry.owner for _, entry in manifest.partition_entries() if entry.owner}
        assert len(owners) >= 8
        # Before the create: its own directory and its parent's; after it: its own.
        assert counted.requests()["list"] == 3, counted.trace()
        assert counted.round_trips == 4, counted.trace()

    simulate(store, scenario)
