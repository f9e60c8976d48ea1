"""``delete_checkpoint`` beside saves that build on the checkpoint it deletes.

A deletion decides what needs the checkpoint from one reading of the store, then
deletes. Three interleavings the deterministic simulator found (``tests/support/sim``),
each written down here:

* a save that read the checkpoint's manifest before it went commits after the decision,
  carrying the checkpoint's objects: the deletion must spare what it carries;
* a save in progress is judged by its lease, and a lease's age is the store's time less
  the stamp the store put on the intent, never this machine's clock (here days ahead);
* a save whose lease lapsed may be a paused process that has already checked its
  artifacts: the deletion claims its id first, so it can never commit naming what is
  deleted next.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import types
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.intents import is_intent_path

from cairn import (
    CheckpointAbortedError,
    CheckpointData,
    CheckpointId,
    CheckpointInUseError,
    CheckpointManifest,
    ObjectExistsError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
)
from cairn.errors import TransientStoreError
from cairn.protocol import _delete, retention
from cairn.stores import ForwardingStore, ObstoreStore, PutMode, Store, StoreMethod

T = TypeVar("T")


class Hooked(ForwardingStore):
    """Runs ``hook(operation, path, mode)`` before every call; records every create."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.hook: Callable[[str, str, PutMode | None], Awaitable[None]] | None = None
        self.created: list[str] = []

    async def _around(
        self, operation: StoreMethod, path: str, call: Any, *, mode: PutMode | None = None
    ) -> T:
        if self.hook is not None:
            await self.hook(operation, path, mode)
        result: T = await call()
        if operation == "put" and mode == "create":
            self.created.append(path)
        return result


async def _base_and_child_data(
    ckpt: ObjectStoreCheckpointer,
) -> tuple[CheckpointData, CheckpointData]:
    base = CheckpointData(epoch=1, snapshots={("agg", 0): b"base 0", ("agg", 1): b"base 1"})
    await ckpt.save(base)
    child = CheckpointData(epoch=2, deltas={("agg", 0): b"+1"}, parent_id=base.id)
    return base, child


async def test_a_save_committed_on_the_checkpoint_while_it_is_deleted_keeps_what_it_carries() -> (
    None
):
    inner = ObstoreStore(MemoryStore())
    deleting = Hooked(inner)
    writer = make_checkpointer(inner)
    base, child = await _base_and_child_data(writer)
    deleter = make_checkpointer(deleting)

    async def commit_child_after_the_decision(operation: str, path: str, mode: Any) -> None:
        if operation == "delete" and path == f"{base.id}/manifest.json":
            # The deletion found nothing that needs base; meanwhile a save reads base's
            # manifest and commits on it.
            deleting.hook = None
            await writer.save(child)

    deleting.hook = commit_child_after_the_decision
    await deleter.delete_checkpoint(base.id)

    assert not await writer.exists(base.id)
    loaded = await writer.load(child.id)
    assert [bytes(link.data) for link in loaded.chains[("agg", 0)]] == [b"base 0", b"+1"]
    assert bytes(loaded.artifacts[("agg", 1)]) == b"base 1"


class _ClockDaysAhead(dt.datetime):
    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> Any:
        return dt.datetime.now(tz) + dt.timedelta(days=3)


async def test_a_live_lease_is_judged_by_the_stores_time_not_the_deleters_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = ObstoreStore(MemoryStore())
    gated = Hooked(inner)
    writer = make_checkpointer(gated)
    base, child = await _base_and_child_data(writer)
    at_commit = asyncio.Event()
    go_on = asyncio.Event()

    async def hold_the_child_before_its_commit(operation: str, path: str, mode: Any) -> None:
        if operation == "put" and mode == "create" and path.startswith(str(child.id)):
            at_commit.set()
            await go_on.wait()

    gated.hook = hold_the_child_before_its_commit
    saving = asyncio.create_task(writer.save(child))
    await at_commit.wait()
    # The deleting process's clock runs three days ahead: by it, the child's lease lapsed.
    clock = types.SimpleNamespace(datetime=_ClockDaysAhead, timedelta=dt.timedelta, UTC=dt.UTC)
    monkeypatch.setattr(_delete, "dt", clock)
    deleter = make_checkpointer(inner)
    with pytest.raises(CheckpointInUseError) as refused:
        await deleter.delete_checkpoint(base.id)
    assert refused.value.dependents == [str(child.id)]
    go_on.set()
    await saving
    assert [bytes(x.data) for x in (await writer.load(child.id)).chains[("agg", 0)]] == [
        b"base 0",
        b"+1",
    ]


async def test_a_save_whose_lease_lapsed_is_claimed_before_its_parent_goes() -> None:
    inner = ObstoreStore(MemoryStore())
    gated = Hooked(inner)
    lease = dt.timedelta(milliseconds=200)
    writer = make_checkpointer(gated, lease=lease)
    base, child = await _base_and_child_data(writer)
    at_commit = asyncio.Event()
    go_on = asyncio.Event()
    intents = 0

    async def stall_the_child(operation: str, path: str, mode: Any) -> None:
        nonlocal intents
        if operation == "put" and path.startswith(f"{child.id}/") and is_intent_path(path):
            intents += 1
            if intents > 1:  # a stalled process renews nothing: its lease lapses
                await go_on.wait()
        if operation == "put" and mode == "create" and path.startswith(str(child.id)):
            at_commit.set()  # it checked its artifacts, base's included, and stalls here
            await go_on.wait()

    gated.hook = stall_the_child
    saving = asyncio.create_task(writer.save(child))
    await at_commit.wait()
    await asyncio.sleep(lease.total_seconds() * 3)
    deleter = make_checkpointer(inner)
    await deleter.delete_checkpoint(base.id)
    go_on.set()
    # The deletion claimed the child's id before it deleted what the child carries: its
    # commit cannot happen, so no manifest ever names a missing object.
    with pytest.raises(CheckpointAbortedError):
        await saving
    assert f"{child.id}/manifest.json" not in gated.created
    assert not await writer.exists(child.id)
    assert not await writer.exists(base.id)


async def test_gc_claims_a_save_that_began_after_its_plan_and_stalled_on_a_doomed_parent() -> None:
    # GC plans from one listing; a save on a checkpoint it is about to delete begins just
    # after it, checks its artifacts and stalls past its lease. GC's second look claims it
    # before deleting the parent's objects, as its first look claims what it finds lapsed.
    inner = ObstoreStore(MemoryStore())
    gated = Hooked(inner)
    lease = dt.timedelta(milliseconds=200)
    writer = make_checkpointer(inner, lease=lease)
    base, child = await _base_and_child_data(writer)
    await writer.save(CheckpointData(epoch=3, snapshots={("agg", 0): b"newest"}))
    stalled = make_checkpointer(gated, lease=lease)
    at_commit = asyncio.Event()
    go_on = asyncio.Event()
    intents = 0

    async def stall_the_child(operation: str, path: str, mode: Any) -> None:
        nonlocal intents
        if operation == "put" and path.startswith(f"{child.id}/") and is_intent_path(path):
            intents += 1
            if intents > 1:
                await go_on.wait()
        if operation == "put" and mode == "create" and path.startswith(str(child.id)):
            at_commit.set()
            await go_on.wait()

    gated.hook = stall_the_child
    collecting = Hooked(inner)
    saving: list[asyncio.Task[Any]] = []

    async def start_the_child_after_the_plan(operation: str, path: str, mode: Any) -> None:
        # GC's first write (the `_clock` record whose stamp it reads) follows its listing.
        if operation == "put" and path == "_clock" and not saving:
            saving.append(asyncio.create_task(stalled.save(child)))
            await at_commit.wait()
            await asyncio.sleep(lease.total_seconds() * 3)

    collecting.hook = start_the_child_after_the_plan
    result = await make_checkpointer(collecting).gc(
        RetentionPolicy(keep_last=1), min_age=dt.timedelta(0)
    )
    go_on.set()
    assert base.id in result.deleted
    with pytest.raises(CheckpointAbortedError):
        await saving[0]
    assert f"{child.id}/manifest.json" not in gated.created
    assert not await writer.exists(child.id)


async def test_a_writer_stalled_at_its_commit_is_never_swept_and_never_commits_over_a_sweep() -> (
    None
):
    # Two writers save one explicit id. The second checks its uploads and stalls at its
    # commit point while the first commits; GC runs (the commit is kept), then the
    # checkpoint is deleted. The stalled writer's uploads were never GC's to sweep, and
    # its intent tells the deletion that a save of that id has not finished: the id is
    # retired, and the stalled writer's commit fails, cleanly, instead of landing.
    inner = ObstoreStore(MemoryStore())
    gated = Hooked(inner)
    first = make_checkpointer(inner)
    second = make_checkpointer(gated)
    cid = CheckpointId.now()
    at_commit = asyncio.Event()
    go_on = asyncio.Event()

    async def stall_at_the_commit(operation: str, path: str, mode: Any) -> None:
        if operation == "put" and mode == "create" and path == f"{cid}/manifest.json":
            at_commit.set()
            await go_on.wait()

    gated.hook = stall_at_the_commit
    late = CheckpointData(epoch=1, snapshots={("agg", 0): b"second"}, checkpoint_id=cid)
    saving = asyncio.create_task(second.save(late))
    await at_commit.wait()
    uploads = set(await inner.list(f"{cid}/"))
    await first.save(CheckpointData(epoch=1, snapshots={("agg", 0): b"first"}, checkpoint_id=cid))
    kept = await first.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert cid in kept.retained
    assert uploads <= set(await inner.list(f"{cid}/")), "GC left the stalled save's uploads"
    await first.delete_checkpoint(cid)
    assert bytes((await inner.get(f"{cid}/manifest.json")).data) == b"", "the id is retired"
    go_on.set()
    with pytest.raises(CheckpointAbortedError):
        await saving
    assert not await first.exists(cid)


class LosesTheCommitReply(ForwardingStore):
    """Applies the first create of ``path``, then runs ``meanwhile`` and reports a lost
    reply (the writer retries the create); records every create that landed."""

    def __init__(self, inner: Store, path: str) -> None:
        super().__init__(inner)
        self.path = path
        self.meanwhile: Callable[[], Awaitable[None]] | None = None
        self.created: list[str] = []

    async def _around(
        self, operation: StoreMethod, path: str, call: Any, *, mode: PutMode | None = None
    ) -> T:
        result: T = await call()
        if operation == "put" and mode == "create":
            self.created.append(path)
            if path == self.path and self.meanwhile is not None:
                meanwhile, self.meanwhile = self.meanwhile, None
                await meanwhile()
                raise TransientStoreError("put", path, "reply lost")
        return result


async def test_a_checkpoint_deleted_while_its_writer_retries_the_create_stays_deleted() -> None:
    # The create of the manifest lands, its reply is lost, and before the writer retries
    # it another process lists the checkpoint and deletes it. The retried create must not
    # write the manifest again over the objects the deletion removed: a checkpoint whose
    # directory still holds an intent is retired (its manifest becomes a tombstone).
    inner = ObstoreStore(MemoryStore())
    data = CheckpointData(epoch=1, snapshots={("agg", 0): b"state"})
    losing = LosesTheCommitReply(inner, f"{data.id}/manifest.json")
    writer = make_checkpointer(losing)
    deleter = make_checkpointer(inner)

    async def delete_it() -> None:
        await deleter.delete_checkpoint(data.id)

    losing.meanwhile = delete_it
    with pytest.raises(CheckpointAbortedError):
        await writer.save(data)
    assert losing.created.count(f"{data.id}/manifest.json") == 1
    assert not await writer.exists(data.id)
    assert bytes((await inner.get(f"{data.id}/manifest.json")).data) == b""


async def test_gc_retires_a_checkpoint_whose_save_has_not_finished() -> None:
    # A checkpoint committed by a save that has not finished (its intent is still there:
    # it may retry its create) is retired, not deleted: its manifest becomes a tombstone,
    # and the next runs sweep the claimed directory.
    inner = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(inner)
    unfinished = await ckpt.save(CheckpointData(epoch=1, snapshots={("agg", 0): b"old"}))
    cid = unfinished.checkpoint_id
    await inner.put(ckpt.paths.intent(cid, "0123456789ab"), b'{"lease_ms":60000}')
    await ckpt.save(CheckpointData(epoch=2, snapshots={("agg", 0): b"new"}))
    collected = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert collected.deleted == [cid] and collected.failures == []
    assert bytes((await inner.get(ckpt.paths.manifest(cid))).data) == b""
    assert not await ckpt.exists(cid)
    with pytest.raises(ObjectExistsError):
        await inner.put(ckpt.paths.manifest(cid), b"{}", mode="create")


async def test_a_forced_delete_claims_the_saves_on_it_before_its_manifest_goes() -> None:
    # A save on the checkpoint is under way when it is deleted with force. The save is
    # claimed before the manifest goes: a GC that runs right after the manifest is gone
    # may sweep the checkpoint's objects, and the save must not commit naming them.
    inner = ObstoreStore(MemoryStore())
    gated = Hooked(inner)
    writer = make_checkpointer(gated)
    base, child = await _base_and_child_data(writer)
    at_commit = asyncio.Event()
    go_on = asyncio.Event()

    async def hold_the_child_before_its_commit(operation: str, path: str, mode: Any) -> None:
        if operation == "put" and mode == "create" and path.startswith(str(child.id)):
            at_commit.set()
            await go_on.wait()

    gated.hook = hold_the_child_before_its_commit
    saving = asyncio.create_task(writer.save(child))
    await at_commit.wait()
    deleting = Hooked(inner)
    collector = make_checkpointer(inner)

    gone = False

    async def collect_and_resume_once_the_manifest_is_gone(
        operation: str, path: str, mode: Any
    ) -> None:
        nonlocal gone
        if gone:  # the call after the manifest's delete
            deleting.hook = None
            await collector.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
            go_on.set()  # the save goes on before the deletion does
            with pytest.raises(CheckpointAbortedError):
                await saving
        gone = operation == "delete" and path == f"{base.id}/manifest.json"

    deleting.hook = collect_and_resume_once_the_manifest_is_gone
    await make_checkpointer(deleting).delete_checkpoint(base.id, force=True)
    assert saving.done()
    assert f"{child.id}/manifest.json" not in gated.created
    assert not await writer.exists(child.id)


async def test_deleting_the_checkpoint_a_fence_names_retires_its_id() -> None:
    # After a takeover, the fence says where the fenced generation ended: at the
    # checkpoint _latest named. Deleting that checkpoint keeps its id claimed, so that a
    # fenced writer of the same id cannot commit it again as if nothing had changed.
    inner = ObstoreStore(MemoryStore())
    old = make_checkpointer(inner)
    ended = await old.save(CheckpointData(epoch=1, snapshots={("agg", 0): b"old"}))
    new = make_checkpointer(inner)
    await new.take_over()
    await new.delete_checkpoint(ended.checkpoint_id)
    manifest = new.paths.manifest(ended.checkpoint_id)
    assert bytes((await inner.get(manifest)).data) == b""
    with pytest.raises(ObjectExistsError):
        await inner.put(manifest, b"{}", mode="create")
    assert await new.load_latest() is None


async def test_two_writers_of_one_id_on_two_parents_keep_both_parents() -> None:
    # Each save has an intent of its own: two writers of one explicit id, building on
    # two parents, both stalled before their commit, keep both parents from GC (a shared
    # intent would name only the parent of whoever wrote it last).
    inner = ObstoreStore(MemoryStore())
    writer = make_checkpointer(inner)
    first = await writer.save(CheckpointData(epoch=1, snapshots={("agg", 0): b"one"}))
    second = await writer.save(CheckpointData(epoch=2, snapshots={("agg", 0): b"two"}))
    await writer.save(CheckpointData(epoch=3, snapshots={("agg", 0): b"three"}))
    cid = CheckpointId.now()
    gates = [Hooked(inner), Hooked(inner)]
    stalled = [asyncio.Event(), asyncio.Event()]
    go_on = asyncio.Event()
    tasks = []
    for gate, at_commit, parent in zip(gates, stalled, (first, second), strict=True):

        async def stall(
            op: str, path: str, mode: Any, at_commit: asyncio.Event = at_commit
        ) -> None:
            if op == "put" and mode == "create" and path == f"{cid}/manifest.json":
                at_commit.set()
                await go_on.wait()

        gate.hook = stall
        data = CheckpointData(
            epoch=4, deltas={("agg", 0): b"+"}, parent_id=parent.checkpoint_id, checkpoint_id=cid
        )
        tasks.append(asyncio.create_task(make_checkpointer(gate).save(data)))
    await asyncio.gather(*(event.wait() for event in stalled))
    collected = await writer.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    for parent in (first, second):
        assert parent.checkpoint_id in collected.retained
        assert collected.reasons[parent.checkpoint_id] == ["base of a save in progress"]
    go_on.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(isinstance(o, CheckpointManifest) for o in outcomes) == 1
    loaded = await writer.load(cid)
    assert [bytes(link.data) for link in loaded.chains[("agg", 0)]][-1] == b"+"


async def test_gc_never_sweeps_what_a_live_save_builds_on_even_uncommitted() -> None:
    # A save read its parent's manifest, and then the manifest went (a deletion that did
    # not see the save yet). The parent's directory is now uncommitted; while the save's
    # lease is live GC neither claims nor sweeps it.
    inner = ObstoreStore(MemoryStore())
    gated = Hooked(inner)
    writer = make_checkpointer(gated)
    base, child = await _base_and_child_data(writer)
    at_commit = asyncio.Event()
    go_on = asyncio.Event()

    async def hold_the_child_before_its_commit(operation: str, path: str, mode: Any) -> None:
        if operation == "put" and mode == "create" and path.startswith(str(child.id)):
            at_commit.set()
            await go_on.wait()

    gated.hook = hold_the_child_before_its_commit
    saving = asyncio.create_task(writer.save(child))
    await at_commit.wait()
    before = {info.path for info in await inner.list(f"{base.id}/")} - {f"{base.id}/manifest.json"}
    await inner.delete([f"{base.id}/manifest.json"])
    collected = await make_checkpointer(inner).gc(
        RetentionPolicy(keep_last=1), min_age=dt.timedelta(0)
    )
    assert collected.orphans_deleted == []
    assert {info.path for info in await inner.list(f"{base.id}/")} == before, "no claim, no sweep"
    go_on.set()
    await saving
    assert [bytes(x.data) for x in (await writer.load(child.id)).chains[("agg", 0)]] == [
        b"base 0",
        b"+1",
    ]


async def test_a_save_that_commits_while_a_deletion_looks_again_keeps_what_it_carries() -> None:
    # The second look lists the save's intent; by the time it reads it, the save has
    # committed and removed it. What that commit carries is spared all the same.
    inner = ObstoreStore(MemoryStore())
    gated = Hooked(inner)
    writer = make_checkpointer(gated)
    base, child = await _base_and_child_data(writer)
    at_commit = asyncio.Event()
    go_on = asyncio.Event()

    async def hold_the_child_before_its_commit(operation: str, path: str, mode: Any) -> None:
        if operation == "put" and mode == "create" and path.startswith(str(child.id)):
            at_commit.set()
            await go_on.wait()

    gated.hook = hold_the_child_before_its_commit
    saving = asyncio.create_task(writer.save(child))
    await at_commit.wait()
    known = (await retention.read_state(inner, writer.paths)).manifests
    looking = Hooked(inner)

    async def commit_the_child_before_its_intent_is_read(op: str, path: str, mode: Any) -> None:
        if op == "get" and path.startswith(f"{child.id}/") and is_intent_path(path):
            looking.hook = None
            go_on.set()
            await saving  # committed, and its intent removed

    looking.hook = commit_the_child_before_its_intent_is_read
    spared_whole, spared = await retention.look_again(
        looking, writer.paths, known, {base.id}, min_age=dt.timedelta(0)
    )
    assert child.id in spared_whole
    carried = await writer.load_manifest(child.id)
    assert {
        writer.paths.resolve(base.id, e.path) for _, e in carried.partition_entries() if e.owner
    }
    assert all(
        writer.paths.resolve(e.owner, e.path) in spared
        for _, e in carried.partition_entries()
        if e.owner == base.id
    )
