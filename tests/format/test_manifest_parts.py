"""Large manifests: a root and parts, each part named by its digest and checked on read.

Most tests make the limit small (the ``small_parts`` fixture: parts of about 16 entries)
so that a few dozen partitions make several parts; the command-line test saves 5,000
partitions against the real limit, because the command runs in its own process.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import itertools
from pathlib import Path

import msgspec
import obstore
import pytest
from obstore.store import MemoryStore, S3Store
from support.backends import make_checkpointer
from support.cli import cairn
from support.recording import RecordingStore
from support.servers import S3Server, s3_store_options

from cairn import (
    CheckpointData,
    CheckpointExistsError,
    CheckpointId,
    CheckpointManifest,
    CorruptManifestError,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    SignatureError,
)
from cairn.format import manifest as manifest_module
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import (
    EncodedManifest,
    ManifestPart,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    assemble,
    decode_manifest,
    decode_part,
    decode_root,
    encode_manifest,
    encode_stored,
)
from cairn.format.signing import signing_keys
from cairn.protocol import _upload
from cairn.stores import as_store

PARTS_OF = 16
PATHS = CheckpointPaths("checkpoints/")


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Manifests of more than 16 entries are stored in parts of about 16."""
    monkeypatch.setattr(manifest_module, "PART_ENTRIES", PARTS_OF)


def state(partition: int, tag: bytes = b"v1") -> bytes:
    return tag + partition.to_bytes(4, "little") * 8


def data(epoch: int, partitions: range, parent: CheckpointId | None = None) -> CheckpointData:
    snapshots = {(op, p): state(p, b"e%d" % epoch) for op in ("agg", "join") for p in partitions}
    return CheckpointData(epoch=epoch, snapshots=snapshots, parent_id=parent)


def entries_of(operator: str, chains: dict[int, int]) -> list[PartitionSnapshotEntry]:
    """Entries of ``operator``: for each partition, a snapshot and ``chains[p] - 1`` deltas
    (owned by earlier checkpoints, so that several deltas of one partition may share it)."""
    found: list[PartitionSnapshotEntry] = []
    for partition, length in chains.items():
        for index in range(length):
            delta = index > 0
            path = CheckpointPaths.relative_artifact(operator, partition, delta)
            owner = CheckpointId.parse(f"01a230b4-cb20-7cd8-a3b6-{index:012x}") if delta else None
            found.append(
                PartitionSnapshotEntry(
                    partition_id=partition,
                    is_delta=delta,
                    path=path,
                    size_bytes=index,
                    sha256=hashlib.sha256(b"%d/%d" % (partition, index)).hexdigest(),
                    owner=owner,
                )
            )
    return found


def manifest_of(operators: dict[str, list[PartitionSnapshotEntry]]) -> CheckpointManifest:
    cid = CheckpointId.parse("01a230b8-0000-7000-8000-000000000001")
    return msgspec.structs.replace(
        CheckpointManifest.new(cid, 3),
        operators={op: OperatorSnapshotEntry.from_partitions(e) for op, e in operators.items()},
    )


def parts_read(
    root: CheckpointManifest, encoded: EncodedManifest
) -> list[tuple[ManifestPart, tuple[PartitionSnapshotEntry, ...]]]:
    """Each part of ``encoded`` as :func:`decode_part` reads it, with its record in ``root``."""
    return [
        (record, decode_part(root, record, path, body))
        for record, (path, body) in zip(root.parts, encoded.parts, strict=True)
    ]


# -- the encoding, pure ---------------------------------------------------------------------


def test_a_manifest_up_to_the_limit_is_stored_whole_byte_for_byte_as_before() -> None:
    manifest = manifest_of({"agg": entries_of("agg", dict.fromkeys(range(16), 1))})
    encoded = encode_stored(manifest, part_entries=16)
    assert encoded.parts == () and encoded.manifest == manifest
    assert encoded.root == encode_manifest(manifest)
    assert b"parts" not in encoded.root
    assert decode_manifest("m", encoded.root) == manifest


def test_a_larger_manifest_is_a_small_root_and_parts_that_assemble_to_it_exactly() -> None:
    chains = {p: 1 + p % 3 for p in range(40)}  # 80 entries per operator
    manifest = manifest_of({"agg": entries_of("agg", chains), "join": entries_of("join", chains)})
    encoded = encode_stored(manifest, part_entries=16)
    assert encoded == encode_stored(manifest, part_entries=16)  # deterministic
    root = decode_root("m", encoded.root)
    assert root.operators["agg"].partitions == () and len(root.parts) == len(encoded.parts)
    assert root.operators["agg"].total_bytes == manifest.operators["agg"].total_bytes
    for record, (path, body) in zip(root.parts, encoded.parts, strict=True):
        assert path == record.path == CheckpointPaths.relative_manifest_part(record.sha256)
        assert hashlib.sha256(body).hexdigest() == record.sha256 and len(body) == record.size_bytes
        assert record.entries <= 16
    # No partition's chain is cut: each part's range is whole partitions, back to back.
    for op in ("agg", "join"):
        ranges = [(r.first_partition, r.last_partition) for r in root.parts if r.operator == op]
        assert ranges[0][0] == 0 and ranges[-1][1] == 39
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    assert assemble("m", root, parts_read(root, encoded)) == encoded.manifest
    assert encoded.manifest.partition_entries() == manifest.partition_entries()
    with pytest.raises(InvalidInputError, match="keeps its entries in .* parts"):
        decode_manifest("m", encoded.root)


def test_many_small_operators_are_stored_whole_not_as_a_part_each() -> None:
    """A DCP save of many ranks: an operator of one entry per rank. Parts of one entry
    would cost an object each and shrink nothing, so the manifest is stored whole."""
    ops = {f"rank-{r}": entries_of(f"rank-{r}", {0: 1}) for r in range(40)}
    manifest = manifest_of(ops)
    encoded = encode_stored(manifest, part_entries=16)
    assert encoded.parts == () and encoded.root == encode_manifest(manifest)
    assert decode_manifest("m", encoded.root) == manifest


def test_small_operators_stay_in_a_root_whose_large_ones_are_in_parts() -> None:
    small = {f"rank-{r}": entries_of(f"rank-{r}", {0: 1, 1: 2}) for r in range(12)}  # 3 each
    large = {"agg": entries_of("agg", dict.fromkeys(range(40), 1))}
    manifest = manifest_of(small | large)
    encoded = encode_stored(manifest, part_entries=16)
    root = decode_root("m", encoded.root)
    assert {r.operator for r in root.parts} == {"agg"} and len(root.parts) == 3
    assert root.operators["agg"].partitions == ()
    assert root.operators["rank-3"] == manifest.operators["rank-3"]
    assert assemble("m", root, parts_read(root, encoded)) == encoded.manifest
    assert encoded.manifest.partition_entries() == manifest.partition_entries()
    # One part read: its partitions, and the operators the root holds itself.
    one = assemble("m", root, parts_read(root, encoded)[:1])
    assert sorted(one.operators) == sorted(["agg", *small])
    assert len(one.operators["agg"].partitions) == root.parts[0].entries
    # An operator whose entries are in parts lists none of its own in the root.
    doc = msgspec.json.decode(encoded.root)
    doc["operators"]["agg"]["partitions"] = [
        msgspec.to_builtins(manifest.operators["agg"].partitions[0])
    ]
    del doc["manifest_sha256"]
    with pytest.raises(CorruptManifestError, match="does not list with its entries in parts"):
        decode_root("m", msgspec.json.encode(doc))


def test_a_chain_longer_than_a_part_is_a_part_of_its_own() -> None:
    manifest = manifest_of({"agg": entries_of("agg", {0: 2, 1: 40, 2: 2})})
    encoded = encode_stored(manifest, part_entries=16)
    root = decode_root("m", encoded.root)
    assert [(r.first_partition, r.last_partition, r.entries) for r in root.parts] == [
        (0, 0, 2),
        (1, 1, 40),
        (2, 2, 2),
    ]


def test_a_signed_root_covers_its_parts_through_their_digests() -> None:
    keys = signing_keys(b"k" * 32)
    assert keys is not None
    manifest = manifest_of({"agg": entries_of("agg", dict.fromkeys(range(40), 1))})
    encoded = encode_stored(manifest, keys, part_entries=16)
    root = decode_root("m", encoded.root, keys)
    assert root.parts and b'"signature"' in encoded.root
    path, body = encoded.parts[0]
    forged = body.replace(b'"size_bytes":0', b'"size_bytes":1', 1)
    assert forged != body
    with pytest.raises(CorruptManifestError, match="part checksum mismatch"):
        decode_part(root, root.parts[0], path, forged)
    # A forger who also rewrites the root's record of the part (and its checksum) still
    # needs the key: the record is in the signed bytes.
    record = root.parts[0]
    rewritten = encoded.root.replace(
        record.sha256.encode(), hashlib.sha256(forged).hexdigest().encode()
    )
    checksum = msgspec.json.decode(rewritten)["manifest_sha256"]
    zeroed = rewritten.replace(checksum.encode(), b"0" * 64)
    rewritten = zeroed.replace(b"0" * 64, hashlib.sha256(zeroed).hexdigest().encode())
    forged_root = decode_root("m", rewritten)  # unchecked by a reader without keys...
    assert decode_part(forged_root, forged_root.parts[0], path, forged)
    with pytest.raises(SignatureError):  # ... refused by one with them
        decode_root("m", rewritten, keys)


@pytest.mark.parametrize(
    "damage",
    ["size", "digest", "other checkpoint", "other operator", "order", "count"],
)
def test_a_part_that_is_not_what_its_record_says_is_damage(damage: str) -> None:
    manifest = manifest_of({"agg": entries_of("agg", dict.fromkeys(range(40), 2))})
    encoded = encode_stored(manifest, part_entries=16)
    root = decode_root("m", encoded.root)
    record = root.parts[0]
    path, body = encoded.parts[0]
    parsed = msgspec.json.decode(body)
    if damage == "size":
        body = body + b" "
    elif damage == "digest":
        body = body.replace(b'"agg"', b'"agh"', 1)
    else:
        if damage == "other checkpoint":
            parsed["checkpoint_id"] = "01a230b8-0000-7000-8000-000000000002"
        elif damage == "other operator":
            parsed["operator"] = "join"
        elif damage == "order":
            parsed["partitions"].reverse()
        else:
            parsed["partitions"].pop()
        body = msgspec.json.encode(parsed) + b"\n"
        # A consistent record for the altered bytes: only the content is wrong.
        record = msgspec.structs.replace(
            record, size_bytes=len(body), sha256=hashlib.sha256(body).hexdigest()
        )
    with pytest.raises(CorruptManifestError) as caught:
        decode_part(root, record, path, body)
    assert caught.value.path == path


@pytest.mark.parametrize("damage", ["path", "overlap", "operator", "inline entries"])
def test_a_root_with_impossible_part_records_is_damage(damage: str) -> None:
    manifest = manifest_of({"agg": entries_of("agg", dict.fromkeys(range(40), 1))})
    encoded = encode_stored(manifest, part_entries=16)
    doc = msgspec.json.decode(encoded.root)
    if damage == "path":
        doc["parts"][0]["path"] = "parts/part-" + "0" * 64 + ".json"
    elif damage == "overlap":
        doc["parts"][1]["first_partition"] = doc["parts"][0]["last_partition"]
    elif damage == "operator":
        doc["parts"][0]["operator"] = "nobody"
    else:
        doc["operators"]["agg"]["partitions"] = [
            msgspec.to_builtins(manifest.partition_entries()[0][1])
        ]
    del doc["manifest_sha256"]  # a root without its checksum: only the records are wrong
    with pytest.raises(CorruptManifestError) as caught:
        decode_root("checkpoints/x/manifest.json", msgspec.json.encode(doc))
    assert caught.value.path == "checkpoints/x/manifest.json"


# -- through the checkpointer ----------------------------------------------------------------


async def test_a_large_save_writes_parts_and_loads_lists_and_chains_through_them(
    small_parts: None,
) -> None:
    raw = MemoryStore()
    store = RecordingStore(as_store(raw))
    ckpt = make_checkpointer(store, PATHS)
    saved = await ckpt.save(data(1, range(50)))
    cid = saved.checkpoint_id
    assert len(saved.parts) >= 2 * 50 // PARTS_OF
    directory = PATHS.checkpoint_dir(cid)
    listed = {m["path"].removeprefix(directory) for c in obstore.list(raw, directory) for m in c}
    assert {p.path for p in saved.parts} <= listed
    assert await ckpt.load_manifest(cid) == saved
    loaded = await ckpt.load(cid)
    expected = {(op, p): state(p, b"e1") for op in ("agg", "join") for p in range(50)}
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == expected
    assert await ckpt.list_checkpoints() == [cid]
    # One partition: the root and the one part that holds it, then its bytes.
    store.log.clear()
    [link] = await ckpt.load_chain(cid, "join", 37)
    assert bytes(link.data) == state(37, b"e1")
    part = next(
        p
        for p in saved.parts
        if p.operator == "join" and p.first_partition <= 37 <= p.last_partition
    )
    read = [path for op, path in store.log if op in ("get", "get_range")]
    assert read == [PATHS.manifest(cid), PATHS.resolve(cid, part.path), read[-1]]
    assert "/parts/" not in read[-1]


async def test_a_save_of_many_small_and_one_large_operator_parts_only_the_large_one(
    small_parts: None,
) -> None:
    raw = MemoryStore()
    store = RecordingStore(as_store(raw))
    ckpt = make_checkpointer(store, PATHS)
    snapshots = {(f"rank-{r}", 0): state(r) for r in range(30)}
    snapshots |= {("agg", p): state(p) for p in range(40)}
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    cid = saved.checkpoint_id
    assert {part.operator for part in saved.parts} == {"agg"}
    assert await ckpt.load_manifest(cid) == saved
    loaded = await ckpt.load(cid)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == snapshots
    # A small operator's partition: the root holds its entry, so no part is read.
    store.log.clear()
    [link] = await ckpt.load_chain(cid, "rank-7", 0)
    assert bytes(link.data) == state(7)
    read = [path for op, path in store.log if op in ("get", "get_range")]
    assert read[0] == PATHS.manifest(cid) and not any("/parts/" in path for path in read)


async def test_an_increment_of_a_large_parent_carries_its_chains(small_parts: None) -> None:
    ckpt = make_checkpointer(MemoryStore(), PATHS)
    base = await ckpt.save(data(1, range(40)))
    child = await ckpt.save(
        CheckpointData(
            epoch=2,
            snapshots={("agg", 3): b"new"},
            parent_id=base.checkpoint_id,
        )
    )
    assert child.parts
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == child.checkpoint_id
    assert bytes(loaded.artifacts[("agg", 3)]) == b"new"
    assert bytes(loaded.artifacts[("join", 39)]) == state(39, b"e1")
    carried = [e for _, e in child.partition_entries() if e.owner == base.checkpoint_id]
    assert len(carried) == 2 * 40 - 1


async def test_a_missing_or_damaged_part_makes_the_checkpoint_damaged_and_latest_falls_back(
    small_parts: None,
) -> None:
    raw = MemoryStore()
    ckpt = make_checkpointer(raw, PATHS)
    first = await ckpt.save(data(1, range(40)))
    second = await ckpt.save(data(2, range(40)))
    part = PATHS.resolve(second.checkpoint_id, second.parts[-1].path)
    await obstore.delete_async(raw, part)
    with pytest.raises(CorruptManifestError, match="missing") as caught:
        await ckpt.load_manifest(second.checkpoint_id)
    assert caught.value.path == part
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == first.checkpoint_id
    first_part = PATHS.resolve(first.checkpoint_id, first.parts[0].path)
    body = bytes((await obstore.get_async(raw, first_part)).bytes())
    await obstore.put_async(raw, first_part, body.replace(b"agg", b"agh", 1))
    with pytest.raises(CorruptManifestError, match="part checksum mismatch"):
        await ckpt.load(first.checkpoint_id)
    assert await ckpt.load_latest() is None


async def test_gc_deletes_a_checkpoints_parts_with_it_and_keeps_a_kept_ones(
    small_parts: None,
) -> None:
    raw = MemoryStore()
    ckpt = make_checkpointer(raw, PATHS)
    old = await ckpt.save(data(1, range(40)))
    kept = await ckpt.save(data(2, range(40)))
    # A losing writer of the kept id left a part of its own manifest behind.
    stray = PATHS.resolve(kept.checkpoint_id, CheckpointPaths.relative_manifest_part("ab" * 32))
    await obstore.put_async(raw, stray, b"{}")
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.deleted == [old.checkpoint_id]
    left = {m["path"] for c in obstore.list(raw, "checkpoints/") for m in c}
    assert not any(p.startswith(PATHS.checkpoint_dir(old.checkpoint_id)) for p in left)
    assert {PATHS.resolve(kept.checkpoint_id, p.path) for p in kept.parts} <= left
    # A kept checkpoint's directory is left as it is: the stray goes when the checkpoint
    # does (a writer of that id may still be stalled at its commit point).
    assert stray in left
    assert (await ckpt.load(kept.checkpoint_id)).manifest == kept


async def test_a_second_writer_of_one_id_cannot_change_the_committed_parts(
    small_parts: None,
) -> None:
    raw = MemoryStore()
    first = make_checkpointer(raw, PATHS)
    second = make_checkpointer(raw, PATHS)
    won = await first.save(data(1, range(40)))
    twin = data(1, range(40))
    twin = CheckpointData(
        epoch=1,
        snapshots={k: b"other" for k in twin.snapshots},
        checkpoint_id=won.checkpoint_id,
    )
    with pytest.raises(CheckpointExistsError):
        await second.save(twin)
    assert await first.load_manifest(won.checkpoint_id) == won
    loaded = await first.load(won.checkpoint_id)
    assert bytes(loaded.artifacts[("agg", 5)]) == state(5, b"e1")


async def test_the_real_limit_on_s3_keeps_a_100_000_entry_root_small(
    s3_server: S3Server, s3_bucket: str
) -> None:
    raw = S3Store(s3_bucket, **s3_store_options(s3_server.endpoint))
    ckpt = make_checkpointer(raw, PATHS)
    snapshots = {("agg", p): p.to_bytes(4, "little") for p in range(10_000)}
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    assert len(saved.parts) == 3  # 10,000 entries in parts of at most 4,096
    root = await obstore.head_async(raw, PATHS.manifest(saved.checkpoint_id))
    assert root["size"] < 4096
    [link] = await ckpt.load_chain(saved.checkpoint_id, "agg", 9_999)
    assert bytes(link.data) == snapshots[("agg", 9_999)]


def test_the_command_line_verifies_copies_and_restores_a_large_manifest(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()
    snapshots = {("agg", p): p.to_bytes(4, "little") for p in range(5_000)}

    async def fill() -> CheckpointManifest:
        return await ObjectStoreCheckpointer(url, PATHS).save(
            CheckpointData(epoch=1, snapshots=snapshots)
        )

    saved = asyncio.run(fill())
    assert len(saved.parts) == 2
    store = ["--store", url, "--prefix", PATHS.base_prefix]
    verified = cairn("verify", "--all", *store)
    assert verified.code == 0, verified.explain()
    shown = cairn("show", str(saved.checkpoint_id), "--json", *store)
    assert shown.code == 0 and shown.json()["artifacts"] == 5_000, shown.explain()
    target = tmp_path / "copied"
    copied = cairn("copy", str(saved.checkpoint_id), "--to", target.as_uri(), *store)
    assert copied.code == 0, copied.explain()
    for part in saved.parts:
        source = root / PATHS.resolve(saved.checkpoint_id, part.path)
        assert (target / PATHS.resolve(saved.checkpoint_id, part.path)).read_bytes() == (
            source.read_bytes()
        )
    restored = tmp_path / "restored"
    restore = cairn("restore", str(saved.checkpoint_id), "--to", str(restored), *store)
    assert restore.code == 0, restore.explain()
    for part in saved.parts:
        assert (restored / str(saved.checkpoint_id) / part.path).is_file()

    async def reload() -> CheckpointManifest:
        # The restored directory is a store of its own: the checkpoint loads from it.
        return await ObjectStoreCheckpointer(restored.as_uri(), CheckpointPaths("")).load_manifest(
            saved.checkpoint_id
        )

    assert asyncio.run(reload()) == saved


async def test_list_checkpoints_counts_a_roots_parts_and_asks_a_head_each(
    small_parts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_upload, "PACK_ENTRY_BYTES", 0)  # an object per partition
    store = RecordingStore(as_store(MemoryStore()))
    ckpt = make_checkpointer(store, PATHS, max_concurrent_downloads=2)
    saved = []
    for epoch in range(6):  # 40 partitions in parts: small roots, but 40+ objects each
        snapshots = {("op", p): bytes([p]) for p in range(40)}
        manifest = await ckpt.save(CheckpointData(epoch=epoch, snapshots=snapshots))
        saved.append(manifest.checkpoint_id)
    store.ops.clear()
    assert await ckpt.list_checkpoints() == saved
    assert "list" not in store.ops, store.ops  # not a recursive listing of 240 objects
    assert store.ops["head"] == 6
