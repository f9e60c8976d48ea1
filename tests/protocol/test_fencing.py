"""A fenced writer's late commit never counts for the writer that took over.

A stale writer passes its fence check, ``take_over()`` runs, the stale manifest lands,
and the stale process dies before its pointer swap and its rollback. That checkpoint is
committed, but it is never returned by ``load_latest``, named as the latest, or built
upon; checkpoints of the old generation from before the takeover still are.
"""

from __future__ import annotations

import pytest
from obstore.store import ObjectStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore, InjectedCrash

from cairn import CheckpointData, CheckpointId, InvalidCheckpointDataError, ObjectStoreCheckpointer
from cairn.protocol import _pointer
from cairn.stores import ObstoreStore


async def stale_commit_after_takeover(
    raw_store: ObjectStore,
) -> tuple[ObjectStoreCheckpointer, list[CheckpointId], CheckpointId]:
    """Old writer commits epochs 4 and 5; a new writer takes over while the old one commits
    epoch 6, which lands and is never published. Returns (new writer, old ids, stale id).

    A takeover claims the id of every save in flight, so the stale commit cannot land
    by itself: the claim is taken away again, as a takeover that claims nothing
    leaves it. What is tested is the readers' own defense."""
    inner = ObstoreStore(raw_store)
    new = make_checkpointer(inner)
    state = {"took_over": False, "committed": False}  # the hook's own progress

    async def takeover_then_die(op: str, path: str) -> None:
        if op == "put" and path.endswith("/manifest.json") and not state["took_over"]:
            state["took_over"] = state["committed"] = True
            await new.take_over()  # lands after the old writer's fence check
            await inner.delete([path])  # the claim on the old writer's id
        elif state["committed"] and path.endswith("_latest"):
            raise InjectedCrash("the stale writer dies before its pointer swap")

    old_plain = make_checkpointer(inner)
    await old_plain.take_over()
    older = [
        (await old_plain.save(CheckpointData(epoch=e, snapshots={("op", 0): b"%d" % e})))
        for e in (4, 5)
    ]
    old = make_checkpointer(FaultyStore(inner, FaultPlan(before_call=takeover_then_die)))
    old.writer_generation = old_plain.writer_generation
    stale = CheckpointData(epoch=6, snapshots={("op", 0): b"stale"})
    # The takeover lands just before the manifest put, after the save's own fence check.
    with pytest.raises(InjectedCrash):
        await old.save(stale)
    assert state["took_over"] and new.writer_generation == 2
    assert await new.exists(stale.id), "the stale manifest landed"
    return new, [m.checkpoint_id for m in older], stale.id


async def test_the_new_writer_never_restores_a_stale_commit(raw_store: ObjectStore) -> None:
    new, older, stale = await stale_commit_after_takeover(raw_store)
    loaded = await new.load_latest()
    assert loaded is not None and loaded.manifest.checkpoint_id == older[-1]
    assert bytes(loaded.artifacts[("op", 0)]) == b"5"
    assert await new.latest_id() == older[-1]
    # Even with no pointer at all, the ranking leaves the stale one out.
    await new.store.delete([new.paths.latest_pointer()])
    loaded = await new.load_latest()
    assert loaded is not None and loaded.manifest.checkpoint_id == older[-1]
    # And an older checkpoint of the fenced generation is still a fallback.
    newest_older = await new.load_manifest(older[-1])
    await new.store.delete([artifact_path(new.paths, newest_older, "op", 0)])
    loaded = await new.load_latest()
    assert loaded is not None and loaded.manifest.checkpoint_id == older[0]
    assert stale in await new.list_checkpoints()  # committed, listed, never the latest


async def test_a_stale_commit_is_not_built_upon(raw_store: ObjectStore) -> None:
    new, older, stale = await stale_commit_after_takeover(raw_store)
    with pytest.raises(InvalidCheckpointDataError, match="fenced writer") as info:
        await new.save(CheckpointData(epoch=7, deltas={("op", 0): b"+"}, parent_id=stale))
    assert str(stale) in str(info.value)
    assert not [c for c in await new.list_checkpoints() if c not in (*older, stale)]
    built = await new.save(CheckpointData(epoch=7, deltas={("op", 0): b"+"}, parent_id=older[-1]))
    chain = await new.load_chain(built.checkpoint_id, "op", 0)
    assert [bytes(link.data) for link in chain] == [b"5", b"+"]


async def test_a_takeover_that_died_before_its_fence_is_completed(raw_store: ObjectStore) -> None:
    inner = ObstoreStore(raw_store)
    first = make_checkpointer(inner)
    await first.take_over()
    kept = await first.save(CheckpointData(epoch=3, snapshots={("op", 0): b"kept"}))
    writes = {"writer": 0}

    async def die_after_claim(op: str, path: str) -> None:
        if op == "put" and path.endswith("_writer"):
            writes["writer"] += 1
            if writes["writer"] == 2:  # the fence, after the generation and the claim
                raise InjectedCrash("the new writer dies before recording its fence")

    dying = make_checkpointer(FaultyStore(inner, FaultPlan(before_call=die_after_claim)))
    with pytest.raises(InjectedCrash):
        await dying.take_over()
    record, _, _ = await _pointer.read_writer(inner, first.paths.writer_record())
    assert record is not None and record.generation == 2
    assert [f.generation for f in record.fences] == [0]  # only the first takeover's
    third = make_checkpointer(inner)
    assert await third.take_over() == 3
    record, _, _ = await _pointer.read_writer(inner, first.paths.writer_record())
    assert record is not None
    assert [(f.generation, f.checkpoint_id) for f in record.fences][-2:] == [
        (1, kept.checkpoint_id),
        (2, kept.checkpoint_id),
    ]
    # A generation-1 checkpoint past the recorded end would not count; the kept one does.
    assert record.admits(1, (3, kept.checkpoint_id.uuid.int))
    assert not record.admits(1, (4, CheckpointId.now().uuid.int))


async def test_fences_are_capped(raw_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pointer, "MAX_FENCES", 3)
    ckpt = make_checkpointer(raw_store)
    for _ in range(5):
        await ckpt.take_over()
    record, _, _ = await _pointer.read_writer(ckpt.store, ckpt.paths.writer_record())
    assert record is not None and [f.generation for f in record.fences] == [2, 3, 4]
