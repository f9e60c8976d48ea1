"""Packs: a one-phase save merges small artifacts into a few objects, each artifact a
byte range with its own size and digest, read with one ranged request (or a few for a
whole load), carried, collected, copied and restored like any other artifact.

Most tests run on the memory store with the pack limits made small (the ``small_packs``
fixture) so that a few hundred artifacts make several packs; one test runs the real
limits on S3 (moto), where ranged reads go over HTTP.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import io
import os
from pathlib import Path
from typing import Any

import msgspec
import obstore
import pytest
from obstore.store import MemoryStore, ObjectStore, S3Store
from support.backends import make_checkpointer
from support.cli import cairn
from support.faults import FaultPlan, FaultyStore
from support.paths import DATA
from support.recording import RecordingStore
from support.servers import S3Server, s3_store_options

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointInUseError,
    CheckpointManifest,
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    StoreError,
)
from cairn.format.layout import CheckpointPaths, is_attempt_artifact, is_intent
from cairn.format.manifest import (
    MAX_INT64,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    check_manifest,
    decode_manifest,
    encode_manifest,
)
from cairn.protocol import _download, _upload
from cairn.protocol._read import read_pack, read_stored
from cairn.protocol._save import assemble_manifest
from cairn.stores import as_store

ENTRY_LIMIT = 4096
PACK_LIMIT = 64 * 1024


@pytest.fixture
def small_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packs of at most 64 KiB, of artifacts under 4 KiB; spans of at most 16 KiB."""
    monkeypatch.setattr(_upload, "PACK_ENTRY_BYTES", ENTRY_LIMIT)
    monkeypatch.setattr(_upload, "PACK_BYTES", PACK_LIMIT)
    monkeypatch.setattr(_download, "SPAN_BYTES", 16 * 1024)


def state(partition: int, size: int = 1000, tag: bytes = b"v1") -> bytes:
    """Distinct bytes per partition (and per ``tag``)."""
    return (tag + partition.to_bytes(4, "little") * (size // 4 + 1))[:size]


def recorded(raw: ObjectStore, **options: Any) -> tuple[RecordingStore, ObjectStoreCheckpointer]:
    """A checkpointer over ``raw`` through a store that records every call."""
    store = RecordingStore(as_store(raw))
    return store, make_checkpointer(store, **options)


def objects_of(
    raw: ObjectStore, ckpt: ObjectStoreCheckpointer, cid: CheckpointId
) -> dict[str, int]:
    """The objects in ``cid``'s checkpoint directory: relative path -> size."""
    directory = ckpt.paths.checkpoint_dir(cid)
    return {
        meta["path"].removeprefix(directory): meta["size"]
        for chunk in obstore.list(raw, directory)
        for meta in chunk
    }


async def test_a_save_merges_small_buffers_into_packs_and_keeps_others_whole(
    small_packs: None, tmp_path: Path
) -> None:
    raw = MemoryStore()
    store, ckpt = recorded(raw, max_concurrent_uploads=2)
    snapshots = {("agg", p): state(p) for p in range(200)}  # 200 x 1000 B: 4 packs
    snapshots[("big", 0)] = state(0, ENTRY_LIMIT)  # not under the limit: its own object
    (tmp_path / "f").write_bytes(b"a file")
    snapshots[("file", 0)] = tmp_path / "f"  # type: ignore[assignment]
    snapshots[("stream", 0)] = io.BytesIO(b"a stream")  # type: ignore[assignment]
    snapshots[("agg", 200)] = b""  # an empty range, in the last pack
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    objects = objects_of(raw, ckpt, manifest.checkpoint_id)
    packs = sorted(path for path in objects if path.startswith("packs/"))
    assert len(packs) == 4 and all(CheckpointPaths.is_pack(p) for p in packs)
    assert all(objects[p] <= PACK_LIMIT for p in packs)
    whole = sorted(path for path in objects if path.startswith("operators/"))
    assert [p.split("/")[1] for p in whole] == ["big", "file", "stream"]
    assert len(objects) == 4 + 3 + 1  # and the manifest
    assert len([p for op, p in store.log if op == "put" and "/packs/" in p]) == 4
    assert store.peak_by_op["put"] <= 2  # packs and whole objects, bounded together
    entries = {(op, e.partition_id, e.is_delta): e for op, e in manifest.partition_entries()}
    by_pack: dict[str, list[PartitionSnapshotEntry]] = {}
    for (op, _, _), entry in entries.items():
        if op == "agg":
            assert entry.offset is not None and entry.path in packs
            by_pack.setdefault(entry.path, []).append(entry)
        else:
            assert entry.offset is None and entry.path in whole
    # Each pack is its members' bytes back to back, in the order of the save, each with
    # its own size and digest.
    for path, members in by_pack.items():
        members.sort(key=lambda e: e.offset or 0)
        body = bytes((await ckpt.store.get(ckpt.paths.resolve(manifest.checkpoint_id, path))).data)
        starts = [sum(m.size_bytes for m in members[:i]) for i in range(len(members))]
        assert [e.offset for e in members] == starts
        assert len(body) == sum(e.size_bytes for e in members)
        for entry in members:
            piece = body[entry.offset or 0 :][: entry.size_bytes]
            assert hashlib.sha256(piece).hexdigest() == entry.sha256
    assert manifest.stats is not None
    assert manifest.stats.uploaded_artifacts == len(entries)
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert bytes(loaded.artifacts[("agg", 7)]) == snapshots[("agg", 7)]
    assert bytes(loaded.artifacts[("stream", 0)]) == b"a stream"
    assert bytes(loaded.artifacts[("agg", 200)]) == b""
    assert entries[("agg", 200, False)].offset == objects[packs[-1]]
    chain = await ckpt.load_chain(manifest.checkpoint_id, "agg", 200)
    assert bytes(chain[0].data) == b""


async def test_a_lone_small_artifact_and_the_reference_calls_keep_their_own_objects(
    small_packs: None,
) -> None:
    raw = MemoryStore()
    _, ckpt = recorded(raw)
    alone = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    [(_, entry)] = alone.partition_entries()
    assert entry.offset is None and entry.path.startswith("operators/op/partition-0.")
    cid = CheckpointId.now()
    entries = await ckpt.save_partitions_concurrent(
        cid, [("op", p, False, state(p)) for p in range(20)]
    )
    assert all(e.offset is None for _, e in entries)
    await ckpt.commit(assemble_manifest(cid, 2, entries))
    await ckpt.save_snapshot(reference := CheckpointId.now(), "op", 0, state(0))
    await ckpt.save_snapshot(reference, "op", 1, state(1))
    assert len(objects_of(raw, ckpt, cid)) == 20 + 1
    written = [name for name in objects_of(raw, ckpt, reference) if not is_intent(name)]
    assert sorted(written) == [
        "operators/op/partition-0.snap",
        "operators/op/partition-1.snap",
    ]


async def test_a_pack_of_empty_artifacts_is_an_empty_object() -> None:
    raw = MemoryStore()
    _, ckpt = recorded(raw)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"", ("op", 1): b""}))
    [(_, path, size)] = manifest.stored_objects()
    assert CheckpointPaths.is_pack(path) and size == 0
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {("op", 0): b"", ("op", 1): b""}
    full = ckpt.paths.resolve(manifest.checkpoint_id, path)
    entries = [e for _, e in manifest.partition_entries()]
    assert bytes(await read_pack(ckpt.store, full, entries)) == b""


async def test_compressed_members_are_each_compressed_and_read_on_their_own(
    small_packs: None,
) -> None:
    import zstandard

    raw = MemoryStore()
    store, ckpt = recorded(raw, compression="zstd")
    snapshots = {("agg", p): state(p, 3000) for p in range(40)}
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    entries = dict(((op, e.partition_id), e) for op, e in manifest.partition_entries())
    entry = entries[("agg", 5)]
    assert entry.codec == "zstd" and entry.offset is not None
    assert entry.stored_size_bytes is not None and entry.stored_size_bytes < entry.size_bytes
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    stored = await ckpt.store.get_range(path, entry.offset, entry.offset + entry.stored_size_bytes)
    assert zstandard.ZstdDecompressor().decompress(bytes(stored)) == snapshots[("agg", 5)]
    assert bytes(await read_stored(ckpt.store, path, entry)) == bytes(stored)
    store.log.clear()
    chain = await ckpt.load_chain(manifest.checkpoint_id, "agg", 5)
    assert bytes(chain[0].data) == snapshots[("agg", 5)]
    assert [op for op, p in store.log if p == path] == ["get_range"]  # one ranged read
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == snapshots


async def test_a_load_reads_a_pack_in_few_spans_and_a_chain_with_one_range(
    small_packs: None,
) -> None:
    raw = MemoryStore()
    store, ckpt = recorded(raw, max_concurrent_downloads=3)
    snapshots = {("agg", p): state(p) for p in range(300)}  # 5 packs, 300 KB
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    store.log.clear()
    store.peak_by_op.clear()
    seen: list[int] = []
    loaded = await ckpt.load(manifest.checkpoint_id, progress=seen.append)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == snapshots
    assert sorted(seen) == [1000] * 300
    ranges = [p for op, p in store.log if op == "get_range"]
    # 300 KB in spans of at most 16 KiB: 16 ranges of 1000 bytes per span.
    assert 300 // 16 <= len(ranges) <= 300 // 16 + 5 + 1
    assert store.peak_by_op["get_range"] <= 3
    store.log.clear()
    chain = await ckpt.load_chain(manifest.checkpoint_id, "agg", 150)
    assert bytes(chain[0].data) == snapshots[("agg", 150)]
    entry = chain[0].entry
    pack = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    assert [(op, p) for op, p in store.log if p != ckpt.paths.manifest(manifest.checkpoint_id)] == [
        ("get_range", pack)
    ]


async def test_damage_to_one_range_fails_only_that_range(small_packs: None) -> None:
    raw = MemoryStore()
    _, ckpt = recorded(raw)
    snapshots = {("agg", p): state(p) for p in range(10)}
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    entries = {e.partition_id: e for _, e in manifest.partition_entries()}
    path = ckpt.paths.resolve(manifest.checkpoint_id, entries[3].path)
    body = bytearray(bytes((await ckpt.store.get(path)).data))
    body[(entries[3].offset or 0) + 10] ^= 0xFF
    await ckpt.store.put(path, bytes(body))
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load(manifest.checkpoint_id)
    assert info.value.path == path and info.value.expected == entries[3].sha256
    chain = await ckpt.load_chain(manifest.checkpoint_id, "agg", 4)
    assert bytes(chain[0].data) == snapshots[("agg", 4)]
    with pytest.raises(IntegrityMismatchError):
        await ckpt.load_chain(manifest.checkpoint_id, "agg", 3)
    named = list(entries.values())
    with pytest.raises(IntegrityMismatchError) as info:
        await read_pack(ckpt.store, path, named)  # what copy and restore read: each range verified
    assert info.value.expected == entries[3].sha256
    assert bytes(await read_pack(ckpt.store, path, [entries[4]])) == bytes(body)
    # No manifest records a pack's size: a copy reads no more than a pack can hold.
    await ckpt.store.put(path, bytes(body) + bytes(2 * PACK_LIMIT))
    with pytest.raises(IntegrityMismatchError, match="size"):
        await read_pack(ckpt.store, path, [entries[4]])
    # A pack longer than its ranges is fine; a shorter one is a size mismatch, unverified
    # too, and a pack cut before a range's start as well.
    await ckpt.store.put(path, bytes(body) + b"more")
    assert (
        bytes((await ckpt.load_chain(manifest.checkpoint_id, "agg", 9))[0].data)
        == snapshots[("agg", 9)]
    )
    last = entries[9]
    await ckpt.store.put(path, bytes(body[: (last.offset or 0) + 500]))
    for verify in (True, False):
        with pytest.raises(IntegrityMismatchError) as info:
            await ckpt.load(manifest.checkpoint_id, verify=verify)
        # The cut fails the one range it ends inside, beside range 3's flipped byte.
        damaged = [info.value, *info.value.others]
        cut = [(e.operator, e.partition) for e in damaged if "size of bytes" in str(e)]
        assert cut == [("agg", 9)] and all(getattr(e, "path", None) == path for e in damaged)
        assert [e.partition for e in damaged] == ([3, 9] if verify else [9])
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load_chain(manifest.checkpoint_id, "agg", 9)
    assert (info.value.expected, info.value.actual) == ("1000", "500")
    await ckpt.store.put(path, bytes(body[:100]))
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load_chain(manifest.checkpoint_id, "agg", 9)
    assert (info.value.expected, info.value.actual) == ("1000", "0")


async def test_carried_ranges_keep_their_pack_and_gc_keeps_it_while_named(
    small_packs: None,
) -> None:
    raw = MemoryStore()
    _, ckpt = recorded(raw)
    snapshots = {("agg", p): state(p) for p in range(100)}
    base = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    # Replace all but partition 7: the rest of the old packs is no longer named.
    fresh = {("agg", p): state(p, tag=b"v2") for p in range(100) if p != 7}
    second = await ckpt.save(
        CheckpointData(
            epoch=2, snapshots=fresh, deltas={("agg", 7): b"+7"}, parent_id=base.checkpoint_id
        )
    )
    old = {e.partition_id: e for _, e in base.partition_entries()}
    carried = [e for _, e in second.partition_entries() if e.owner is not None]
    assert [(e.partition_id, e.path, e.offset) for e in carried] == [
        (7, old[7].path, old[7].offset)
    ]
    assert carried[0].owner == base.checkpoint_id
    assert await ckpt.dependents(base.checkpoint_id) == [second.checkpoint_id]
    with pytest.raises(CheckpointInUseError):
        await ckpt.delete_checkpoint(base.checkpoint_id)
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.deleted == [base.checkpoint_id] and result.retained == [second.checkpoint_id]
    # The pack holding partition 7 stays whole; the other old packs are gone.
    left = objects_of(raw, ckpt, base.checkpoint_id)
    assert list(left) == [old[7].path]
    assert result.pack_range_bytes == sum(e.stored_length for _, e in second.partition_entries())
    assert result.pack_bytes == result.pack_range_bytes - 1000 + left[old[7].path]
    loaded = await ckpt.load(second.checkpoint_id)
    assert [bytes(link.data) for link in loaded.chains[("agg", 7)]] == [
        snapshots[("agg", 7)],
        b"+7",
    ]
    # A full save, then GC: nothing names the old pack any more.
    third = await ckpt.save(CheckpointData(epoch=3, snapshots=snapshots))
    again = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert again.retained == [third.checkpoint_id]
    # (GC claimed the directory left without a manifest: its tombstone stays a while.)
    assert list(objects_of(raw, ckpt, base.checkpoint_id)) == ["manifest.json"]
    assert again.pack_bytes == again.pack_range_bytes == 100 * 1000


async def test_a_failed_save_removes_its_packs(small_packs: None) -> None:
    raw = MemoryStore()
    store = FaultyStore(as_store(raw), FaultPlan(fail_puts_matching="pack-2."))
    ckpt = make_checkpointer(store)
    data = CheckpointData(epoch=1, snapshots={("agg", p): state(p) for p in range(200)})
    with pytest.raises(StoreError, match="pack-2"):
        await ckpt.save(data)
    assert [op for op, p in store.log if op == "put" and "/packs/" in p] == ["put"] * 4
    assert objects_of(raw, ckpt, data.id) == {}


def test_pack_names_carry_the_attempt_and_nothing_else_does_what_they_do() -> None:
    name = CheckpointPaths.relative_pack(3, "0123456789ab")
    assert name == "packs/pack-3.0123456789ab.pack"
    assert CheckpointPaths.is_pack(name) and is_attempt_artifact(name)
    for other in (
        "packs/pack-3.pack",
        "packs/pack-03.0123456789ab.pack",
        "pack-3.0123456789ab.pack",
    ):
        assert not CheckpointPaths.is_pack(other) and not is_attempt_artifact(other)
    for index, attempt in ((-1, "0123456789ab"), (0, "xyz"), (True, "0123456789ab")):
        with pytest.raises(InvalidInputError):
            CheckpointPaths.relative_pack(index, attempt)


def _manifest(*entries: PartitionSnapshotEntry) -> CheckpointManifest:
    """A manifest of operator ``op`` with ``entries``, as given."""
    group = OperatorSnapshotEntry(partitions=entries, total_bytes=0)
    return msgspec.structs.replace(
        CheckpointManifest.new(CheckpointId.now(), 1), operators={"op": group}
    )


PACK = "packs/pack-0.0123456789ab.pack"
DIGEST = "0" * 64


def ranged(
    partition: int, offset: int | None, size: int = 10, path: str = PACK, codec: str | None = None
) -> PartitionSnapshotEntry:
    """An entry of ``size`` bytes at ``offset`` of ``path``."""
    return PartitionSnapshotEntry(
        partition_id=partition,
        is_delta=False,
        path=path,
        size_bytes=size,
        sha256=DIGEST,
        codec=codec,
        offset=offset,
    )


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ((ranged(0, 0, path="operators/op/partition-0.snap"),), "must be a range of a pack"),
        ((ranged(0, None),), "not at the layout's path"),
        ((ranged(0, 0), ranged(1, 5)), "overlap"),
        ((ranged(0, -1),), "out of range"),
        ((ranged(0, MAX_INT64),), "ends past"),
        ((ranged(0, 0, codec="zstd"),), "no stored_size_bytes"),
    ],
)
def test_the_manifest_refuses_ranges_that_are_not_a_packs(
    entries: tuple[PartitionSnapshotEntry, ...], message: str
) -> None:
    manifest = _manifest(*entries)
    with pytest.raises(InvalidInputError, match=message):
        check_manifest(manifest)
    forged = msgspec.json.format(
        msgspec.json.encode(msgspec.structs.asdict(manifest), enc_hook=str), indent=2
    )
    with pytest.raises(CorruptManifestError, match=message):
        decode_manifest("m", forged)


def test_ranges_that_touch_share_a_pack_and_round_trip() -> None:
    manifest = _manifest(ranged(0, 0), ranged(1, 10), ranged(2, 10, size=0), ranged(3, 20))
    check_manifest(manifest)
    assert decode_manifest("m", encode_manifest(manifest)) == manifest
    assert manifest.stored_objects() == [(None, PACK, 30)]
    assert b'"offset": 10' in encode_manifest(manifest)


def test_manifests_without_offsets_encode_byte_for_byte_as_before() -> None:
    store = DATA / "store-unpacked"
    paths = sorted(store.glob("checkpoints/*/manifest.json"))
    assert len(paths) == 3
    for path in paths:
        data = path.read_bytes()
        assert encode_manifest(decode_manifest(str(path), data)) == data, path


async def test_the_real_limits_on_s3_make_few_objects_and_few_requests(
    s3_server: S3Server, s3_bucket: str
) -> None:
    raw = S3Store(s3_bucket, **s3_store_options(s3_server.endpoint))
    store, ckpt = recorded(raw)
    snapshots = {("agg", p): state(p, 1024) for p in range(3000)}
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    [(_, path, size)] = manifest.stored_objects()
    assert sorted(objects_of(raw, ckpt, manifest.checkpoint_id)) == ["manifest.json", path]
    assert CheckpointPaths.is_pack(path) and size == 3000 * 1024
    store.log.clear()
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == snapshots
    ranges = [op for op, _ in store.log if op == "get_range"]
    assert len(ranges) == 1  # 3 MB: one span
    store.log.clear()
    chain = await ckpt.load_chain(manifest.checkpoint_id, "agg", 2999)
    assert bytes(chain[0].data) == snapshots[("agg", 2999)]
    assert [op for op, _ in store.log if op == "get_range"] == ["get_range"]


def test_the_command_line_verifies_shows_copies_restores_and_collects_packs(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()

    async def fill() -> tuple[CheckpointManifest, CheckpointManifest]:
        ckpt = ObjectStoreCheckpointer(url, compression="zstd")
        base = await ckpt.save(
            CheckpointData(epoch=1, snapshots={("agg", p): state(p) for p in range(30)})
        )
        fresh = {("agg", p): state(p, tag=b"v2") for p in range(1, 30)}
        second = await ckpt.save(
            CheckpointData(epoch=2, snapshots=fresh, parent_id=base.checkpoint_id)
        )
        return base, second

    base, second = asyncio.run(fill())
    store = ["--store", url]
    verified = cairn("verify", "--all", *store)
    assert verified.code == 0, verified.explain()
    shown = cairn("show", str(second.checkpoint_id), "--json", "--partitions", *store)
    assert shown.code == 0, shown.explain()
    doc = shown.json()
    assert doc["artifacts"] == 30 and doc["carried_artifacts"] == 1
    offsets = {e["partition"]: (e["path"], e["offset"]) for e in doc["entries"]}
    assert all(CheckpointPaths.is_pack(p) and o is not None for p, o in offsets.values())
    target = tmp_path / "copied"
    copied = cairn("copy", str(second.checkpoint_id), "--to", target.as_uri(), *store)
    assert copied.code == 0, copied.explain()
    again = cairn("verify", "--all", "--store", target.as_uri())
    assert again.code == 0, again.explain()
    [(_, base_pack, _)] = base.stored_objects()
    source_pack = root / f"{base.checkpoint_id}/{base_pack}"  # the default: the store's root
    copied_pack = target / f"{base.checkpoint_id}/{base_pack}"
    assert copied_pack.read_bytes() == source_pack.read_bytes()  # whole, once
    restore_dir = tmp_path / "restored"
    restore = cairn("restore", str(second.checkpoint_id), "--to", str(restore_dir), *store)
    assert restore.code == 0, restore.explain()
    restored_pack = restore_dir / str(base.checkpoint_id) / base_pack
    assert restored_pack.read_bytes() == source_pack.read_bytes()
    own = [p for owner, p, _ in second.stored_objects() if owner is None]
    assert sorted(os.listdir(restore_dir / str(second.checkpoint_id) / "packs")) == sorted(
        p.removeprefix("packs/") for p in own
    )
    collected = cairn("gc", "--keep-last", "1", "--min-age", "0s", "--json", *store)
    assert collected.code == 0, collected.explain()
    gc = collected.json()
    assert gc["deleted"] == [str(base.checkpoint_id)]
    assert gc["pack_bytes"] > gc["pack_range_bytes"] > 0
    assert source_pack.exists()
    table = cairn("gc", "--keep-last", "1", "--min-age", "0s", "--dry-run", *store)
    assert "shared objects kept:" in table.stdout, table.explain()
