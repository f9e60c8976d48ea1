"""Background saves (save_async) and the statistics every manifest records.

The caller goes on while a checkpoint uploads; saves commit in call order; at most
``max_saves_in_flight`` run at once; a failure is raised from its future or, if nobody
looked at that future, from the next call; interpreter exit waits for saves in flight.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore
from support.policies import FAST_RETRY

from cairn import (
    CheckpointAbortedError,
    CheckpointData,
    CheckpointExistsError,
    StoreError,
    SyncCheckpointer,
)
from cairn.format.manifest import decode_manifest, encode_manifest
from cairn.stores import ObstoreStore


class Gate:
    """Holds every artifact upload of one save until opened."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.opened = asyncio.Event()

    async def __call__(self, op: str, path: str) -> None:
        if op == "put" and self.marker.decode() in path:
            await self.opened.wait()


def gated(inner: ObstoreStore, *gates: Gate) -> FaultyStore:
    async def before(op: str, path: str) -> None:
        for gate in gates:
            await gate(op, path)

    return FaultyStore(inner, FaultPlan(before_call=before))


async def test_save_async_returns_before_the_upload_and_commits_later() -> None:
    inner = ObstoreStore(MemoryStore())
    gate = Gate(b"slow")
    ckpt = make_checkpointer(gated(inner, gate))
    task = await ckpt.save_async(CheckpointData(epoch=1, snapshots={("slow", 0): b"state"}))
    await asyncio.sleep(0.05)
    assert not task.done() and await ckpt.list_checkpoints() == []
    gate.opened.set()
    manifest = await task
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.manifest == manifest
    assert bytes(loaded.artifacts[("slow", 0)]) == b"state"


async def test_saves_commit_in_call_order_and_latest_never_moves_back() -> None:
    inner = ObstoreStore(MemoryStore())
    gate = Gate(b"first")
    store = gated(inner, gate)
    ckpt = make_checkpointer(store, max_saves_in_flight=2)
    first = await ckpt.save_async(CheckpointData(epoch=1, snapshots={("first", 0): b"1"}))
    second = await ckpt.save_async(CheckpointData(epoch=2, snapshots={("second", 0): b"2"}))
    await asyncio.sleep(0.05)
    # The second's uploads are done, but it waits for the first before its commit point.
    assert not second.done() and await ckpt.list_checkpoints() == []
    assert any("second" in path for op, path in store.log if op == "put")
    gate.opened.set()
    one, two = await first, await second
    commits = [p for op, p in store.log if op == "put" and p.endswith("/manifest.json")]
    assert commits == [
        ckpt.paths.manifest(one.checkpoint_id),
        ckpt.paths.manifest(two.checkpoint_id),
    ]
    assert await ckpt.read_latest() == two.checkpoint_id


async def test_a_third_save_waits_for_a_slot() -> None:
    inner = ObstoreStore(MemoryStore())
    gate = Gate(b"held")
    ckpt = make_checkpointer(gated(inner, gate), max_saves_in_flight=1)
    held = await ckpt.save_async(CheckpointData(epoch=1, snapshots={("held", 0): b"h"}))
    submitting = asyncio.create_task(
        ckpt.save_async(CheckpointData(epoch=2, snapshots={("next", 0): b"n"}))
    )
    await asyncio.sleep(0.05)
    assert not submitting.done(), "the second save_async must wait for the slot"
    gate.opened.set()
    await held
    second = await submitting
    assert (await second).epoch == 2


async def test_a_failure_nobody_looked_at_is_raised_by_the_next_call() -> None:
    inner = ObstoreStore(MemoryStore())
    failing = make_checkpointer(FaultyStore(inner, FaultPlan(fail_puts_matching="doomed")))
    doomed = await failing.save_async(CheckpointData(epoch=1, snapshots={("doomed", 0): b"x"}))
    await asyncio.wait([doomed])  # done, and nobody took its outcome
    with pytest.raises(StoreError, match="injected permanent fault"):
        await failing.save_async(CheckpointData(epoch=2, snapshots={("fine", 0): b"y"}))
    # Raised once: the next call goes through.
    ok = await failing.save_async(CheckpointData(epoch=3, snapshots={("fine", 0): b"z"}))
    assert (await ok).epoch == 3
    # A failure the caller awaited is not raised again.
    seen = await failing.save_async(CheckpointData(epoch=4, snapshots={("doomed", 1): b"x"}))
    with pytest.raises(StoreError):
        await seen
    await failing.wait_for_saves()
    # And one nobody awaited comes out of wait_for_saves (or close).
    await failing.save_async(CheckpointData(epoch=5, snapshots={("doomed", 2): b"x"}))
    with pytest.raises(StoreError, match="doomed"):
        await failing.close()
    committed = [await failing.load_manifest(c) for c in await failing.list_checkpoints()]
    assert [m.epoch for m in committed] == [3]


async def test_copy_lets_the_caller_reuse_its_buffer() -> None:
    inner = ObstoreStore(MemoryStore())
    gate = Gate(b"buf")
    ckpt = make_checkpointer(gated(inner, gate))
    buffer = bytearray(b"before")
    task = await ckpt.save_async(CheckpointData(epoch=1, snapshots={("buf", 0): buffer}), copy=True)
    buffer[:] = b"AFTER!"  # the job goes on and overwrites its state
    gate.opened.set()
    manifest = await task
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert bytes(loaded.artifacts[("buf", 0)]) == b"before"


def test_the_blocking_facade_returns_a_future_and_surfaces_failures(tmp_path: Path) -> None:
    ckpt = SyncCheckpointer(f"file://{tmp_path}", retry=FAST_RETRY, max_saves_in_flight=2)
    futures = [
        ckpt.save_async(CheckpointData(epoch=e, snapshots={("op", 0): b"%d" % e})) for e in (1, 2)
    ]
    assert [f.result(timeout=30).epoch for f in futures] == [1, 2]
    loaded = ckpt.load_latest()
    assert loaded is not None and loaded.epoch == 2
    # A failure: a manifest already committed under the same id.
    again = CheckpointData(epoch=3, snapshots={("op", 0): b"3"}, checkpoint_id=loaded.checkpoint_id)
    failed = ckpt.save_async(again)
    while not failed.done():
        pass
    with pytest.raises(Exception, match="already committed"):
        ckpt.wait_for_saves()
    ckpt.wait_for_saves()  # reported once


def test_exit_waits_for_saves_in_flight(tmp_path: Path) -> None:
    store = tmp_path / "store"
    program = textwrap.dedent(
        f"""
        import os
        from cairn import CheckpointData, SyncCheckpointer
        ckpt = SyncCheckpointer({str(store)!r})
        state = {{("op", p): os.urandom(1 << 20) for p in range(16)}}
        ckpt.save_async(CheckpointData(epoch=7, snapshots=state))
        print("returned", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "returned"
    loaded = SyncCheckpointer(str(store)).load_latest()
    assert loaded is not None and loaded.epoch == 7 and len(loaded.artifacts) == 16


async def test_every_manifest_records_how_it_was_made() -> None:
    inner = ObstoreStore(MemoryStore())
    plain = make_checkpointer(inner)
    base = await plain.save(
        CheckpointData(epoch=1, snapshots={("op", p): b"x" * (100 + p) for p in range(3)})
    )
    assert base.stats is not None
    assert (base.stats.uploaded_artifacts, base.stats.uploaded_bytes) == (3, 303)
    assert (base.stats.carried_artifacts, base.stats.carried_bytes, base.stats.retries) == (0, 0, 0)
    assert base.stats.duration_ms >= base.stats.upload_ms >= 0
    flaky = make_checkpointer(
        FaultyStore(inner, FaultPlan(transient_burst=2, transient_ops=frozenset({"put"})))
    )
    delta = await flaky.save(
        CheckpointData(epoch=2, deltas={("op", 0): b"+1"}, parent_id=base.checkpoint_id)
    )
    assert delta.stats is not None
    assert (delta.stats.uploaded_artifacts, delta.stats.uploaded_bytes) == (1, 2)
    assert (delta.stats.carried_artifacts, delta.stats.carried_bytes) == (3, 303)
    assert delta.stats.retries == 2
    stored = await plain.load_manifest(delta.checkpoint_id)
    assert stored.stats == delta.stats


def test_manifests_without_stats_still_load() -> None:
    import msgspec

    from cairn import CheckpointId
    from cairn.format.manifest import CheckpointManifest

    old = CheckpointManifest.new(CheckpointId.now(), 3)
    body = encode_manifest(old)
    assert b"stats" not in body
    assert decode_manifest("old/manifest.json", body).stats is None
    assert msgspec.structs.replace(old, stats=None) == old


async def test_a_pipelined_save_after_one_that_failed_commits_nothing() -> None:
    # Save N names an id another writer has committed, so it fails; save N+1, submitted
    # while N ran, builds on that id. Committing N+1 would publish a chain whose parent
    # is the other writer's state, not the one this job saved: it must fail instead,
    # and it waits for N's outcome rather than read the other writer's manifest.
    store = ObstoreStore(MemoryStore())
    other = make_checkpointer(store)
    taken = CheckpointData(epoch=1, snapshots={("agg", 0): b"another writer's state"})
    await other.save(taken)
    ckpt = make_checkpointer(store, max_saves_in_flight=2)
    failing = await ckpt.save_async(
        CheckpointData(epoch=1, snapshots={("agg", 0): b"ours"}, checkpoint_id=taken.id)
    )
    child = CheckpointData(epoch=2, deltas={("agg", 0): b"+1"}, parent_id=taken.id)
    behind = await ckpt.save_async(child)
    with pytest.raises(CheckpointExistsError):
        await failing
    with pytest.raises(CheckpointAbortedError, match=f"the save of its parent {taken.id} did not"):
        await behind
    assert not await ckpt.exists(child.id)
    assert [info.path for info in await store.list(f"{child.id}/")] == []
    assert await ckpt.list_checkpoints() == [taken.id]


async def test_a_pipelined_save_builds_on_a_parent_still_committing() -> None:
    # An incremental job saving every interval names the save before as the parent of
    # the next, while that one still uploads: each child takes its parent's chains from
    # what the parent commits, not from the store, which holds no manifest of it yet.
    inner = ObstoreStore(MemoryStore())
    base = CheckpointData(epoch=0, snapshots={("agg", 0): b"base", ("other", 0): b"kept"})
    gate = Gate(f"{base.id}/".encode())
    ckpt = make_checkpointer(gated(inner, gate), max_saves_in_flight=4)
    tasks = [await ckpt.save_async(base)]
    parent = base.id
    for epoch in range(1, 4):
        delta = CheckpointData(epoch=epoch, deltas={("agg", 0): b"+%d" % epoch}, parent_id=parent)
        tasks.append(await ckpt.save_async(delta))
        parent = delta.id
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in tasks)  # the base's writes are held
    gate.opened.set()
    manifests = [await task for task in tasks]
    assert [m.epoch for m in manifests] == [0, 1, 2, 3]
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == parent
    chain = [bytes(link.data) for link in loaded.chains[("agg", 0)]]
    assert chain == [b"base", b"+1", b"+2", b"+3"]
    assert bytes(loaded.artifacts[("other", 0)]) == b"kept"
    assert [link.owner for link in loaded.chains[("other", 0)]] == [base.id]


async def test_a_pipelined_save_fails_when_its_parent_still_in_flight_fails() -> None:
    # The parent fails while its child uploads; the child commits nothing (a chain
    # never skips a link), and the parent's own failure reaches the caller.
    inner = ObstoreStore(MemoryStore())
    store = FaultyStore(inner)
    ckpt = make_checkpointer(store, max_saves_in_flight=3, retry=FAST_RETRY)
    base = await ckpt.save(CheckpointData(epoch=0, snapshots={("agg", 0): b"base"}))
    doomed = CheckpointData(epoch=1, deltas={("agg", 0): b"+1"}, parent_id=base.checkpoint_id)
    store.plan.fail_puts_matching = f"{doomed.id}/"  # every write of that save fails
    failing = await ckpt.save_async(doomed)
    child = CheckpointData(epoch=2, deltas={("agg", 0): b"+2"}, parent_id=doomed.id)
    behind = await ckpt.save_async(child)
    with pytest.raises(StoreError):
        await failing
    with pytest.raises(CheckpointAbortedError, match=f"the save of its parent {doomed.id}"):
        await behind
    assert await ckpt.list_checkpoints() == [base.checkpoint_id]
    assert [info.path for info in await inner.list(f"{child.id}/")] == []


async def test_a_save_submitted_after_a_failure_was_seen_commits() -> None:
    # The rule covers saves submitted while the failed one ran, not every later one: a
    # save submitted once the failure is known is the caller's answer to it.
    store = ObstoreStore(MemoryStore())
    other = make_checkpointer(store)
    taken = CheckpointData(epoch=1, snapshots={("agg", 0): b"another writer's state"})
    await other.save(taken)
    ckpt = make_checkpointer(store, max_saves_in_flight=2)
    failing = await ckpt.save_async(
        CheckpointData(epoch=1, snapshots={("agg", 0): b"ours"}, checkpoint_id=taken.id)
    )
    with pytest.raises(CheckpointExistsError):
        await failing
    fresh = CheckpointData(epoch=2, snapshots={("agg", 0): b"ours again"})
    manifest = await (await ckpt.save_async(fresh))
    assert manifest.checkpoint_id == fresh.id
    assert await ckpt.exists(fresh.id)


async def test_a_save_waiting_for_a_slot_is_refused_when_one_before_it_fails() -> None:
    # With one save in flight at most, the second waits for the first's slot. When the
    # first fails meanwhile, the second is not started: its save_async raises the first's
    # failure, so the caller learns of it before anything more commits.
    store = ObstoreStore(MemoryStore())
    other = make_checkpointer(store)
    taken = CheckpointData(epoch=1, snapshots={("agg", 0): b"another writer's state"})
    await other.save(taken)
    ckpt = make_checkpointer(store, max_saves_in_flight=1)
    failing = await ckpt.save_async(
        CheckpointData(epoch=1, snapshots={("agg", 0): b"ours"}, checkpoint_id=taken.id)
    )
    child = CheckpointData(epoch=2, deltas={("agg", 0): b"+1"}, parent_id=taken.id)
    with pytest.raises(CheckpointExistsError):
        await ckpt.save_async(child)
    assert failing.done()
    assert not await ckpt.exists(child.id)
    assert await ckpt.list_checkpoints() == [taken.id]
