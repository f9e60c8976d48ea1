"""The fast paths (pooled read buffers, hashing beside the transfer, restores written as
ranges arrive, one request per small artifact, ranged manifest reads in listings and GC)
keep every guarantee: reused read buffers are never refilled while anything reads them,
hashing overlaps the transfer and stays in order, restores write in order, single-request
reads see every wrong length, and the listing and GC shortcuts answer exactly what the
slow paths answer."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import gc
import hashlib
import os
import random
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from obstore.store import MemoryStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.faults import FaultyStore
from support.recording import RecordingStore

from cairn import (
    CheckpointData,
    CheckpointId,
    IntegrityMismatchError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    StoreError,
)
from cairn.data.inputs import READ_BUFFERS, StreamSource
from cairn.format._buffer import Buffer, BufferPool
from cairn.format.integrity import StreamHasher
from cairn.format.layout import CheckpointPaths
from cairn.protocol import _catalog, _gcplan, _gcstate, retention
from cairn.protocol._lease import TOMBSTONE_RETENTION, is_live
from cairn.protocol._save import assemble_manifest
from cairn.stores import ForwardingStore, ObstoreStore, Store

KiB = 1024


def pattern(size: int, seed: int = 0) -> bytes:
    """Bytes that differ at every offset of every chunk (no period a test could miss)."""
    return random.Random(seed).randbytes(size)


# -- BufferPool -----------------------------------------------------------------------


def test_a_pooled_buffer_is_not_handed_out_while_any_view_of_it_lives() -> None:
    pool = BufferPool(4 * KiB, capacity=2)
    first = pool.take()
    view = memoryview(first)[10:20]  # a slice: it holds the bytearray, not a named view
    derived = memoryview(view)  # shares the export, then outlives its source
    del view
    second = pool.take()
    assert second is not first
    del derived
    gc.collect()
    assert pool.take() is first, "free again once the last view is gone"


def test_a_full_pool_hands_out_fresh_buffers_and_keeps_none_of_them() -> None:
    pool = BufferPool(KiB, capacity=1)
    kept = pool.take()
    held = memoryview(kept)
    extra = pool.take()
    assert extra is not kept and len(extra) == KiB
    held2 = memoryview(extra)
    third = pool.take()
    assert third is not kept and third is not extra, "the extra buffer is not pooled"
    del held, held2
    assert pool.take() is kept


# -- StreamSource: files through reused buffers -----------------------------------------


async def drain(
    source: StreamSource, keep: Callable[[Buffer], Buffer] | None = None
) -> tuple[bytes, bytes]:
    """Pull every chunk as a store would: (the bytes as they came, what ``keep`` held of
    each chunk, read once the stream has ended)."""
    held: list[Buffer] = []
    seen = bytearray()
    async for chunk in source.open():
        seen += chunk
        if keep is not None:
            held.append(keep(chunk))
        del chunk
    return bytes(seen), b"".join(bytes(memoryview(h)) for h in held)


async def test_a_file_is_read_into_a_few_reused_buffers_and_sent_as_read(tmp_path: Path) -> None:
    data = pattern(2 * 1024 * KiB + 123)
    file = tmp_path / "state.bin"
    file.write_bytes(data)
    source = StreamSource(file, chunk_size=64 * KiB)
    owners: list[object] = []  # kept alive, so that no two are at the same address
    async for chunk in source.open():
        view = memoryview(chunk)
        owners.append(view.obj)  # the buffer the chunk is a view of (not a view: no hold)
        del view, chunk
    assert source.sha256 == hashlib.sha256(data).hexdigest()
    assert source.size == len(data)
    # 33 chunks: read into fresh memory each, they would have 33 owners.
    distinct = len({id(owner) for owner in owners})
    assert len(owners) == 33 and 1 <= distinct <= READ_BUFFERS, distinct


@pytest.mark.parametrize("how", ["whole", "slice", "bytes-copy"])
async def test_chunks_a_store_holds_are_never_refilled(tmp_path: Path, how: str) -> None:
    data = pattern(1024 * KiB + 7, seed=1)
    file = tmp_path / "state.bin"
    file.write_bytes(data)
    keep: dict[str, Callable[[Buffer], Buffer]] = {
        "whole": lambda chunk: chunk,  # as a memory store: every part until the end
        "slice": lambda chunk: memoryview(chunk)[0:],  # a derived view, the chunk dropped
        "bytes-copy": lambda chunk: bytes(chunk),
    }
    with file.open("rb") as handle:
        for given in (file, handle):
            source = StreamSource(given, chunk_size=32 * KiB, buffers=2)
            assert await drain(source, keep[how]) == (data, data)
            assert source.sha256 == hashlib.sha256(data).hexdigest()


async def test_a_save_from_a_file_stores_what_it_hashed_on_every_backend_wrapper(
    tmp_path: Path,
) -> None:
    data = pattern(9 * 1024 * KiB + 5, seed=2)  # two parts: one full, one short
    file = tmp_path / "state.bin"
    file.write_bytes(data)
    inner = ObstoreStore(MemoryStore())  # holds every part until the upload completes
    ckpt = make_checkpointer(FaultyStore(inner))
    cid = CheckpointId.now()
    [(_, entry)] = await ckpt.save_partitions_concurrent(cid, [("op", 0, False, file)])
    assert (entry.sha256, entry.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data))
    assert bytes((await inner.get(ckpt.paths.resolve(cid, entry.path))).data) == data


# -- StreamHasher ----------------------------------------------------------------------


async def test_the_stream_hasher_hashes_small_and_large_chunks_in_the_order_fed() -> None:
    rng = random.Random(15)
    chunks = [pattern(rng.choice([0, 1, 100, 300 * KiB, 1024 * KiB]), seed=i) for i in range(40)]
    hasher = StreamHasher(lag=2)
    try:
        for chunk in chunks:
            await hasher.feed(chunk)
        assert await hasher.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()
    finally:
        hasher.close()


async def test_a_caller_chunk_refilled_after_it_is_passed_on_is_hashed_as_it_was(
    tmp_path: Path,
) -> None:
    """A caller may refill its buffer once asked for the next chunk: what was hashed and
    sent is the chunk as it was when handed over (copied, since it is not ours)."""
    buffer = bytearray(512 * KiB)
    parts = [pattern(len(buffer), seed=i) for i in range(6)]

    def refilled() -> Iterator[bytearray]:
        for part in parts:
            buffer[:] = part
            yield buffer

    source = StreamSource(refilled())
    sent, _ = await drain(source)
    assert sent == b"".join(parts)
    assert source.sha256 == hashlib.sha256(b"".join(parts)).hexdigest()


# -- streamed restore --------------------------------------------------------------------


class ShuffledRanges(ForwardingStore):
    """Answers ranged reads after random delays, so they complete out of order; can fail
    the ranged read that starts at ``fail_at``."""

    def __init__(self, inner: Store, seed: int, fail_at: int | None = None) -> None:
        super().__init__(inner)
        self.rng = random.Random(seed)
        self.fail_at = fail_at
        self.starts: list[int] = []

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        self.starts.append(start)
        await asyncio.sleep(self.rng.random() / 200)
        if start == self.fail_at:
            raise StoreError("get_range", path, "injected")
        return await super().get_range(path, start, end)


async def test_a_restore_writes_in_order_whatever_order_ranges_arrive(tmp_path: Path) -> None:
    data = pattern(3 * 1024 * KiB + 99, seed=3)
    store = ShuffledRanges(ObstoreStore(MemoryStore()), seed=4)
    ckpt = make_checkpointer(store)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): data}))
    [entry] = manifest.operators["op"].partitions
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    target = tmp_path / "restored.bin"
    digest = await ckpt.load_artifact_to(
        path, target, expected_sha256=entry.sha256, chunk_size=64 * KiB
    )
    assert digest == entry.sha256
    assert target.read_bytes() == data
    assert len(store.starts) == -(-len(data) // (64 * KiB))


async def test_a_restore_that_fails_midway_leaves_nothing_and_no_write_running(
    tmp_path: Path,
) -> None:
    data = pattern(2 * 1024 * KiB, seed=5)
    store = ShuffledRanges(ObstoreStore(MemoryStore()), seed=6, fail_at=20 * 64 * KiB)
    ckpt = make_checkpointer(store)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): data}))
    [entry] = manifest.operators["op"].partitions
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    with pytest.raises(StoreError, match="injected"):
        await ckpt.load_artifact_to(
            path, tmp_path / "restored.bin", expected_sha256=entry.sha256, chunk_size=64 * KiB
        )
    assert os.listdir(tmp_path) == []


# -- single-request reads of artifacts ----------------------------------------------------


async def test_many_small_artifacts_load_with_one_store_call_each() -> None:
    """Saved whole (the reference's call), one read each; saved in a pack, one read."""
    store = RecordingStore(ObstoreStore(MemoryStore()))
    ckpt = make_checkpointer(store)
    snapshots: Mapping[tuple[str, int], bytes] = {("op", p): bytes([p]) * 16 for p in range(50)}
    uploads = [(op, p, False, data) for (op, p), data in snapshots.items()]
    cid = CheckpointId.now()
    entries = await ckpt.save_partitions_concurrent(cid, uploads)
    whole = await ckpt.commit(assemble_manifest(cid, 1, entries))
    packed = await ckpt.save(CheckpointData(epoch=2, snapshots=dict(snapshots)))
    for manifest, reads in ((whole, 50), (packed, 1)):
        store.ops.clear()
        loaded = await ckpt.load(manifest.checkpoint_id)
        assert {key: bytes(v) for key, v in loaded.artifacts.items()} == snapshots
        assert dict(store.ops) == {"get": 1, "get_range": reads}, "the manifest, then reads"


@pytest.mark.parametrize("change", [b"tail", None])
async def test_an_artifact_of_another_length_is_a_size_mismatch_naming_both(
    change: bytes | None,
) -> None:
    inner = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(inner)
    data = pattern(1000, seed=7)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): data}))
    path = artifact_path(ckpt.paths, manifest, "op", 0)
    stored = data + change if change is not None else data[:600]
    await inner.put(path, stored)
    with pytest.raises(IntegrityMismatchError, match="size mismatch") as info:
        await ckpt.load(manifest.checkpoint_id)
    assert (info.value.path, info.value.expected, info.value.actual) == (
        path,
        "1000",
        str(len(stored)),
    )


# -- list_checkpoints: the listing decides, or a HEAD each -------------------------------


async def committed_by_heads(ckpt: ObjectStoreCheckpointer) -> list[CheckpointId]:
    ids = await _catalog.listed_ids(await ckpt._context())
    return [cid for cid in ids if await _catalog.committed(await ckpt._context(), cid)]


@pytest.mark.parametrize("artifacts", [1, 40])
async def test_list_checkpoints_answers_as_heads_do_with_the_fewest_calls(
    artifacts: int,
) -> None:
    store = RecordingStore(ObstoreStore(MemoryStore()))
    ckpt = make_checkpointer(store)
    saved = []
    for epoch in range(12):
        data = CheckpointData(epoch=epoch, snapshots={("op", p): b"x" for p in range(artifacts)})
        saved.append((await ckpt.save(data)).checkpoint_id)
    paths = ckpt.paths
    await store.put(paths.manifest(saved[3]), b"")  # a tombstone: GC's claim, not a commit
    await store.delete([paths.manifest(saved[5])])  # a save that never committed
    uncommitted = CheckpointId.now()
    await store.put(paths.snapshot(uncommitted, "op", 0), b"x")
    await store.put(f"{paths.base_prefix}not-an-id/manifest.json", b"{}")
    store.ops.clear()
    listed = await ckpt.list_checkpoints()
    calls = dict(store.ops)
    assert listed == [cid for cid in saved if cid not in (saved[3], saved[5])]
    assert listed == await committed_by_heads(ckpt)
    # The newest directory (a save in progress) has no manifest: the next one tells the
    # size of a checkpoint. Small: the recursive listing decides the rest.
    if artifacts == 1:
        assert calls == {"list_dir": 1, "head": 2, "get": 1, "list": 1}
    else:  # large: a HEAD per directory (13: 12 saved, 1 in progress)
        assert calls == {"list_dir": 1, "head": 13}


# -- GC: the same plan, faster ---------------------------------------------------------


async def test_gc_reads_each_manifest_with_one_ranged_read() -> None:
    store = RecordingStore(ObstoreStore(MemoryStore()))
    ckpt = make_checkpointer(store)
    for epoch in range(6):
        await ckpt.save(CheckpointData(epoch=epoch, snapshots={("op", 0): b"state"}))
    store.ops.clear()
    result = await ckpt.gc(RetentionPolicy(keep_last=2), dry_run=True, min_age=dt.timedelta(0))
    assert len(result.deleted) == 4
    assert store.ops["get_range"] == 6
    assert store.ops["get"] == 2, "only the _latest pointer and the _writer record are read whole"


async def test_a_manifest_turned_tombstone_since_the_listing_is_read_as_it_is_now() -> None:
    inner = ObstoreStore(MemoryStore())
    await inner.put("ckpt/manifest.json", b"x" * 100)
    [info] = await inner.list("ckpt/")
    await inner.put("ckpt/manifest.json", b"")
    assert bytes(await _gcstate._read_listed(inner, info)) == b""
    await inner.put("ckpt/manifest.json", b"y" * 150)
    assert bytes(await _gcstate._read_listed(inner, info)) == b"y" * 150


def reference_plan(
    paths: CheckpointPaths,
    state: retention.StoreState,
    policy: RetentionPolicy,
    now: dt.datetime,
    min_age: dt.timedelta,
    claimed: set[CheckpointId],
) -> retention.GcPlan:
    """plan_gc computed the plain way, from the whole state: the oracle of the test below."""
    manifests = state.manifests
    now_ms = int(now.timestamp() * 1000)
    keep = policy.retained(manifests, now_ms) & set(manifests) | set(policy.pinned)
    order = _gcplan._latest_order(state.latest, manifests)
    if order is None:
        keep |= set(manifests)
    else:
        keep |= {cid for cid, m in manifests.items() if (m.epoch, cid.uuid.int) >= order}
    newest: dict[CheckpointId, dt.datetime] = {}
    for info in state.objects:
        cid = paths.checkpoint_of(info.path)
        if cid is None or cid in state.manifests or cid in state.damaged:
            continue
        if cid in state.tombstones:
            continue
        newest[cid] = max(newest.get(cid, info.last_modified), info.last_modified)
    parents: set[CheckpointId] = set()
    for cid, last in newest.items():
        intents = state.intents.get(cid, [])
        live = any(is_live(info, intent, now) for info, intent in intents)
        if live or last > now - min_age:
            parents |= {i.parent_id for _, i in intents if i is not None and i.parent_id}
    keep.update(p for p in parents if p in manifests)
    whole, referenced = _gcplan.reachable(paths, keep, manifests)
    doomed = sorted(set(manifests) - whole)
    dead = set(claimed) | set(state.tombstones)
    in_dir: dict[CheckpointId, int] = {}
    for info in state.objects:
        cid = paths.checkpoint_of(info.path)
        if cid is not None:
            in_dir[cid] = in_dir.get(cid, 0) + 1
    to_delete, orphans = [], []
    retired = set(doomed) & state.fenced
    for info in state.objects:
        cid = paths.checkpoint_of(info.path)
        if cid is None or info.path in referenced or cid in parents:
            continue
        if cid in manifests:
            # A kept checkpoint's directory stays as it is; a doomed one loses what its
            # manifest names, and is retired when a save of its id has not finished.
            own = {paths.resolve(cid, p) for p in manifests[cid].own_objects()}
            if cid not in whole and info.path in own:
                to_delete.append(info)
            elif cid not in whole and paths.is_intent_path(info.path):
                retired.add(cid)
        elif cid in dead:
            is_the_tombstone = info.path == paths.manifest(cid)
            expired = in_dir[cid] == 1 and info.last_modified <= now - TOMBSTONE_RETENTION
            if not is_the_tombstone or expired:
                orphans.append(info)
    return retention.GcPlan(
        retained=sorted(whole & set(manifests)),
        deleted=doomed,
        manifests_to_delete=[paths.manifest(cid) for cid in doomed],
        objects_to_delete=to_delete,
        orphans=orphans,
        retired=sorted(retired),
    )


@pytest.mark.parametrize("seed", range(6))
async def test_the_fast_gc_plan_is_the_reference_plan(seed: int) -> None:
    """Saves, incremental chains, abandoned and live saves, tombstones, a directory
    named in upper case: the plan equals, field by field and in order, the plan the
    straightforward algorithm makes."""
    rng = random.Random(seed)
    inner = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(inner)
    paths = await ckpt.resolve_paths()
    parent = None
    for epoch in range(rng.randint(3, 9)):
        delta = parent is not None and rng.random() < 0.5
        data = CheckpointData(
            epoch=epoch,
            parent_id=parent if delta else None,
            snapshots={} if delta else {("op", p): b"s" * p for p in range(rng.randint(1, 4))},
            deltas={("op", 0): b"d"} if delta else {},
        )
        parent = (await ckpt.save(data)).checkpoint_id
    for _ in range(rng.randint(0, 3)):  # abandoned or in-progress saves, and claims
        cid = CheckpointId.now()
        await inner.put(paths.snapshot(cid, "op", 0), b"left")
        if rng.random() < 0.5:
            await inner.put(paths.manifest(cid), b"")
        elif rng.random() < 0.7:  # a save in progress on the newest committed checkpoint
            intent = b'{"parent_id":"%s","lease_ms":60000}' % str(parent).encode()
            await inner.put(paths.intent(cid, rng.choice([None, "0123456789ab"])), intent)
    if parent is not None and rng.random() < 0.5:  # a save that did not finish its commit
        await inner.put(paths.intent(parent, "ba9876543210"), b'{"lease_ms":60000}')
    upper = str(CheckpointId.now()).upper()
    await inner.put(f"{paths.base_prefix}{upper}/operators/op/partition-0.snap", b"u")
    state = await retention.read_state(inner, paths)
    now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=rng.choice([0, 10, 4000]))
    policy = RetentionPolicy(keep_last=rng.randint(1, 3))
    for min_age in (dt.timedelta(0), dt.timedelta(hours=1)):
        _, abandoned = retention.uncommitted_dirs(state, paths, now=now, min_age=min_age)
        fast = retention.plan_gc(paths, state, policy, now=now, min_age=min_age, claimed=abandoned)
        slow = reference_plan(paths, state, policy, now, min_age, abandoned)
        assert fast == slow


async def test_the_state_gc_reads_is_a_value_without_caches() -> None:
    """What GC read is data and nothing else: no speed cache rides in it (the owners of
    the listed objects travel beside it, inside ``run_gc``), so two readings of an
    unchanged store are equal and a plan depends on nothing but its arguments."""
    inner = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(inner)
    for epoch in range(3):
        await ckpt.save(CheckpointData(epoch=epoch, snapshots={("op", 0): b"s"}))
    state = await retention.read_state(inner, ckpt.paths)
    fields = {f.name for f in dataclasses.fields(state)}
    assert fields == {
        "manifests",
        "objects",
        "intents",
        "tombstones",
        "damaged",
        "newer",
        "latest",
        "fenced",
        "ended",
    }
    assert state == await retention.read_state(inner, ckpt.paths)
