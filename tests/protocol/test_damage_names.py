"""Integrity errors name what is damaged: the operator and partition (and the DCP item,
or the file of a directory partition) besides the object; each range of a pack is
verified on its own, so damage to one partition fails that partition only.

A byte is flipped inside one partition's range of a pack (memory and local stores): a
whole load fails naming it (and every other damaged partition, in ``others``), a load of
another partition of the same pack succeeds, ``load_latest`` falls back with a warning
naming it, ``cairn verify`` reports every damaged partition in its text and ``--json``.
The same for a compressed checkpoint and for one item of a DCP rank object.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from pathlib import Path

import msgspec
import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.cli import cairn, document

from cairn import (
    BrokenChainError,
    CheckpointData,
    CheckpointId,
    CheckpointManifest,
    CheckpointPaths,
    IntegrityMismatchError,
    ObjectStoreCheckpointer,
    PartitionSnapshotEntry,
    UndecodableArtifactError,
)
from cairn.cli.errors import describe
from cairn.integrations.distributed import commit_distributed, upload_partitions


def state(partition: int, size: int = 1000) -> bytes:
    """Distinct bytes per partition."""
    return (b"p" + partition.to_bytes(4, "little") * (size // 4 + 1))[:size]


SNAPSHOTS = {("agg", p): state(p) for p in range(4)} | {("join", 0): state(9)}
"""Five small partitions: one pack."""


def entry_of(manifest: CheckpointManifest, operator: str, partition: int) -> PartitionSnapshotEntry:
    [entry] = [
        e for op, e in manifest.partition_entries() if (op, e.partition_id) == (operator, partition)
    ]
    return entry


async def flip(
    ckpt: ObjectStoreCheckpointer, manifest: CheckpointManifest, key: tuple[str, int]
) -> str:
    """Flip one byte inside ``key``'s stored range; the path of the object it is in."""
    entry = entry_of(manifest, *key)
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    body = bytearray(bytes((await ckpt.store.get(path)).data))
    body[(entry.offset or 0) + entry.stored_length // 2] ^= 0x10
    await ckpt.store.put(path, bytes(body))
    return path


async def test_a_flipped_byte_in_a_packed_range_names_its_partition_and_fails_it_alone() -> None:
    ckpt = make_checkpointer(MemoryStore())
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    entries = {key: entry_of(manifest, *key) for key in SNAPSHOTS}
    assert len({e.path for e in entries.values()}) == 1
    assert all(e.offset is not None for e in entries.values())
    pack = await flip(ckpt, manifest, ("agg", 0))

    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load(manifest.checkpoint_id)
    error = info.value
    assert (error.path, error.expected) == (pack, entries[("agg", 0)].sha256)
    assert (error.operator, error.partition, error.item, error.file) == ("agg", 0, None, None)
    assert error.others == ()
    assert str(error).startswith(f"operator 'agg', partition 0: sha256 mismatch at {pack!r}: ")
    assert describe(error).startswith(
        f"integrity failure: artifact {pack!r} of operator 'agg', partition 0 is damaged: "
    )

    # Every other partition of the same pack loads on its own, verified.
    for key in [k for k in SNAPSHOTS if k != ("agg", 0)]:
        [link] = await ckpt.load_chain(manifest.checkpoint_id, *key)
        assert bytes(link.data) == SNAPSHOTS[key]
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load_chain(manifest.checkpoint_id, "agg", 0)
    assert (info.value.operator, info.value.partition, info.value.path) == ("agg", 0, pack)


async def test_a_load_names_every_damaged_partition_in_the_manifests_order() -> None:
    ckpt = make_checkpointer(MemoryStore())
    big = state(7, 2 << 20)  # too large for a pack: an object of its own
    data = CheckpointData(epoch=1, snapshots={**SNAPSHOTS, ("big", 0): big})
    manifest = await ckpt.save(data)
    pack = await flip(ckpt, manifest, ("agg", 2))
    await flip(ckpt, manifest, ("agg", 0))
    gone = ckpt.paths.resolve(manifest.checkpoint_id, entry_of(manifest, "big", 0).path)
    await ckpt.store.delete([gone])

    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load(manifest.checkpoint_id)
    first, *others = [info.value, *info.value.others]
    assert [(e.operator, e.partition) for e in [first, *others]] == [
        ("agg", 0),
        ("agg", 2),
        ("big", 0),
    ]
    assert isinstance(others[0], IntegrityMismatchError) and others[0].path == pack
    assert others[0].expected == entry_of(manifest, "agg", 2).sha256
    assert isinstance(others[1], BrokenChainError) and others[1].link == gone
    assert str(others[1]).startswith(
        f"operator 'big', partition 0: broken checkpoint chain at {gone}"
    )
    for key in [("agg", 1), ("agg", 3), ("join", 0)]:
        [link] = await ckpt.load_chain(manifest.checkpoint_id, *key)
        assert bytes(link.data) == SNAPSHOTS[key]

    # The error crosses processes with what it names.
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is IntegrityMismatchError and str(again) == str(info.value)
    assert [(type(e), str(e), e.operator, e.partition) for e in again.others] == [
        (type(e), str(e), e.operator, e.partition) for e in info.value.others
    ]


async def test_a_pack_cut_inside_a_range_fails_that_range_and_those_after_not_the_span() -> None:
    ckpt = make_checkpointer(MemoryStore())
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    cut = entry_of(manifest, "agg", 2)
    pack = ckpt.paths.resolve(manifest.checkpoint_id, cut.path)
    body = bytes((await ckpt.store.get(pack)).data)
    await ckpt.store.put(pack, body[: (cut.offset or 0) + 10])
    after = sorted(
        (entry.offset or 0, op, entry.partition_id)
        for op, entry in manifest.partition_entries()
        if (entry.offset or 0) >= (cut.offset or 0)
    )

    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load(manifest.checkpoint_id)
    damaged = [info.value, *info.value.others]
    assert sorted((e.operator, e.partition) for e in damaged) == sorted(
        (op, p) for _, op, p in after
    )
    [short] = [e for e in damaged if (e.operator, e.partition) == ("agg", 2)]
    assert isinstance(short, IntegrityMismatchError) and short.path == pack
    assert (short.expected, short.actual) == (str(cut.size_bytes), "10")
    assert "size of bytes" in str(short)
    before = [k for k in SNAPSHOTS if (entry_of(manifest, *k).offset or 0) < (cut.offset or 0)]
    assert before, "the cut leaves whole ranges before it"
    for key in before:
        [link] = await ckpt.load_chain(manifest.checkpoint_id, *key)
        assert bytes(link.data) == SNAPSHOTS[key]


async def test_load_latest_falls_back_with_a_warning_naming_the_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ckpt = make_checkpointer(MemoryStore())
    good = await ckpt.save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    bad = await ckpt.save(CheckpointData(epoch=2, snapshots=SNAPSHOTS))
    pack = await flip(ckpt, bad, ("agg", 3))
    with caplog.at_level(logging.WARNING, logger="cairn"):
        loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == good.checkpoint_id
    [warning] = [r.getMessage() for r in caplog.records if str(bad.checkpoint_id) in r.getMessage()]
    assert f"operator 'agg', partition 3: sha256 mismatch at {pack!r}" in warning


async def test_a_compressed_range_that_is_damaged_names_its_partition() -> None:
    ckpt = make_checkpointer(MemoryStore(), compression="zstd")
    snapshots = {key: value * 20 for key, value in SNAPSHOTS.items()}
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    entry = entry_of(manifest, "agg", 1)
    assert entry.codec == "zstd" and entry.offset is not None
    pack = await flip(ckpt, manifest, ("agg", 1))

    with pytest.raises(UndecodableArtifactError) as info:
        await ckpt.load(manifest.checkpoint_id)
    error = info.value
    assert (error.path, error.codec) == (pack, "zstd")
    assert (error.operator, error.partition, error.others) == ("agg", 1, ())
    assert str(error).startswith(f"operator 'agg', partition 1: artifact {pack!r} does not decode")
    for key in [k for k in snapshots if k != ("agg", 1)]:
        [link] = await ckpt.load_chain(manifest.checkpoint_id, *key)
        assert bytes(link.data) == snapshots[key]


def test_cairn_verify_reports_every_damaged_partition(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    files = tmp_path / "db"
    files.mkdir()
    (files / "a.txt").write_bytes(b"file a " * 10)
    (files / "b.txt").write_bytes(b"file b " * 10)
    ckpt = ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths(""))
    data = CheckpointData(epoch=1, snapshots=SNAPSHOTS, directories={("db", 0): files})

    async def save_and_damage() -> tuple[CheckpointManifest, str]:
        manifest = await ckpt.save(data)
        pack = await flip(ckpt, manifest, ("agg", 2))
        await flip(ckpt, manifest, ("join", 0))
        [directory] = manifest.directories
        [file_b] = [f for f in directory.files if f.relative_path == "b.txt"]
        path = ckpt.paths.resolve(manifest.checkpoint_id, file_b.path)
        await ckpt.store.put(path, b"file B " * 10)
        return manifest, pack

    manifest, pack = asyncio.run(save_and_damage())
    cid = str(manifest.checkpoint_id)
    text = cairn("verify", cid, "--store", root.as_uri())
    assert text.code == 1, text.explain()
    line = text.error_line()
    assert line.startswith(f"error: 1 of 1 checkpoint(s) failed verification; {cid}: ")
    for words in (
        f"artifact {pack!r} of operator 'agg', partition 2 is damaged",
        f"artifact {pack!r} of operator 'join', partition 0 is damaged",
        "of operator 'db', partition 0, file 'b.txt' is damaged",
    ):
        assert words in line, text.explain()

    as_json = cairn("verify", cid, "--store", root.as_uri(), "--json")
    assert as_json.code == 1, as_json.explain()
    [checkpoint] = document("verify", as_json)["checkpoints"]
    damaged = checkpoint["damaged"]
    assert [(d["operator"], d["partition"], d["item"], d["file"]) for d in damaged] == [
        ("agg", 2, None, None),
        ("join", 0, None, None),
        ("db", 0, None, "b.txt"),
    ]
    assert [d["path"] for d in damaged[:2]] == [pack, pack]
    assert all("is damaged" in d["error"] for d in damaged)
    assert checkpoint["ok"] is False and "operator 'agg', partition 2" in checkpoint["error"]


async def test_a_damaged_file_of_a_directory_partition_names_it_on_restore(tmp_path: Path) -> None:
    files = tmp_path / "db"
    files.mkdir()
    (files / "a.txt").write_bytes(b"file a " * 10)
    (files / "b.txt").write_bytes(b"file b " * 10)
    ckpt = make_checkpointer(MemoryStore())
    data = CheckpointData(epoch=1, directories={("db", 3): files})
    manifest = await ckpt.save(data)
    [file_b] = [f for f in manifest.directories[0].files if f.relative_path == "b.txt"]
    path = ckpt.paths.resolve(manifest.checkpoint_id, file_b.path)
    await ckpt.store.put(path, b"file B " * 10)
    dest = tmp_path / "restored"
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.restore_directory(manifest.checkpoint_id, "db", 3, dest)
    error = info.value
    assert (error.operator, error.partition, error.file, error.item) == ("db", 3, "b.txt", None)
    assert error.expected == file_b.sha256
    assert str(error).startswith("operator 'db', partition 3, file 'b.txt': sha256 mismatch at ")
    assert not dest.exists()


async def test_a_worker_report_that_does_not_match_the_store_names_its_partition(
    tmp_path: Path,
) -> None:
    ckpt = ObjectStoreCheckpointer(str(tmp_path))
    cid = CheckpointId.now()
    report = await upload_partitions(
        ckpt, cid, [("op", p, False, bytes([p]) * 10) for p in range(2)]
    )
    op, entry = report.entries[1]
    forged = msgspec.structs.replace(entry, sha256="1" * 64)
    bad = msgspec.structs.replace(report, entries=(report.entries[0], (op, forged)))
    with pytest.raises(IntegrityMismatchError) as info:
        await commit_distributed(ckpt, cid, 1, [("op", 0), ("op", 1)], [bad])
    assert (info.value.operator, info.value.partition) == ("op", 1)
    assert str(info.value).startswith("operator 'op', partition 1: sha256 mismatch at ")
