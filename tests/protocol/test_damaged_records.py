"""Damaged records never block recovery.

Every damaged manifest, ``_latest``, ``_writer`` or worker report (a number where an id
belongs, nesting too deep, an entry path outside the layout, an unknown codec, a number
out of range, a manifest over the size limit) raises a typed cairn error naming it, at
decode time; names at their limits save and load, and one byte over is refused before
any I/O; and after the damage is put straight into a store,
``load_latest`` still finds the older good checkpoint (or the damage is a fence that
``take_over`` repairs), and ``save``, ``take_over`` and ``gc`` still work through the API.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from obstore.store import LocalStore, MemoryStore, ObjectStore
from rich.console import Console
from support.backends import make_checkpointer
from support.records import read_generation

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointManifest,
    CorruptManifestError,
    FencedError,
    InvalidCheckpointDataError,
    InvalidInputError,
    InvalidNameError,
    ObjectStoreCheckpointer,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    RetentionPolicy,
    SourceOffsetEntry,
)
from cairn.cli import views
from cairn.cli.catalog import MARK_VERIFIES_OBJECTS_UP_TO, Latest, Listed, latest_mark
from cairn.format import manifest as manifest_module
from cairn.format.layout import MAX_NAME_BYTES, MAX_SOURCE_NAME_BYTES
from cairn.format.manifest import (
    MAX_INT64,
    MAX_MANIFEST_BYTES,
    MAX_TIMESTAMP_MS,
    decode_manifest,
    encode_manifest,
    encode_stored,
)
from cairn.integrations.distributed import WorkerReport
from cairn.protocol._pointer import MAX_GENERATION, decode_pointer, decode_writer
from cairn.stores import Store

DEEP = b"[" * 100_000
DIGEST = "ab" * 32


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "local"])
def raw(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty store: in memory, and a local directory (where path limits bite)."""
    if request.param == "memory":
        return MemoryStore()
    root = tmp_path / "store"
    root.mkdir()
    return LocalStore(root)


def checkpointer(store: ObjectStore | Store) -> ObjectStoreCheckpointer:
    return make_checkpointer(store)


def data(epoch: int) -> CheckpointData:
    return CheckpointData(
        epoch=epoch,
        snapshots={("op", p): f"state {epoch} {p}".encode() for p in range(2)},
        source_offsets={"events": SourceOffsetEntry("kafka", {"0": str(epoch)}, epoch)},
    )


def bare_json(manifest: CheckpointManifest, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``manifest`` as JSON without its checksum (as the reference writes it), then changed.

    Without the checksum nothing but the decoder's own checks stands between the damage
    and the reader, which is what these tests are about.
    """
    body: dict[str, Any] = json.loads(encode_manifest(manifest))
    del body["manifest_sha256"]
    change(body)
    return json.dumps(body, indent=2).encode()


def first_entry(body: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = body["operators"]["op"]["partitions"][0]
    return entry


async def objects(ckpt: ObjectStoreCheckpointer) -> dict[str, bytes]:
    return {i.path: bytes((await ckpt.store.get(i.path)).data) for i in await ckpt.store.list("")}


async def good_then_newer(ckpt: ObjectStoreCheckpointer) -> tuple[CheckpointManifest, str]:
    """Save a good checkpoint and a newer one; returns the good one and the newer's manifest
    path, for the test to damage (``_latest`` names the newer)."""
    good = await ckpt.save(data(1))
    newer = await ckpt.save(data(2))
    assert await ckpt.read_latest() == newer.checkpoint_id
    return good, ckpt.paths.manifest(newer.checkpoint_id)


async def assert_recovers(ckpt: ObjectStoreCheckpointer, good: CheckpointManifest) -> None:
    """``load_latest`` finds ``good``; a new writer takes over, saves and collects garbage."""
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == good.checkpoint_id
    assert bytes(loaded.artifacts[("op", 1)]) == f"state {good.epoch} 1".encode()
    await assert_writes(ckpt)


async def assert_writes(ckpt: ObjectStoreCheckpointer) -> None:
    """A new writer of the store can take over, save, collect garbage, and load its save."""
    writer = checkpointer(ckpt.store)
    generation = await writer.take_over()
    assert generation >= 1
    saved = await writer.save(data(10))
    assert await writer.read_latest() == saved.checkpoint_id
    result = await writer.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert saved.checkpoint_id in result.retained
    loaded = await writer.load_latest()
    assert loaded is not None and loaded.checkpoint_id == saved.checkpoint_id


def cairn_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "AWS_"))}
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- a JSON number where a checkpoint id belongs -------------------------------------------


def test_a_number_for_an_id_is_a_corrupt_record_naming_the_field() -> None:
    manifest = CheckpointManifest.new(CheckpointId.now(), 1)
    for field in ("checkpoint_id", "parent_id"):
        body = bare_json(manifest, lambda b, f=field: b.__setitem__(f, 7))  # type: ignore[misc]
        with pytest.raises(CorruptManifestError, match=rf"checkpoint id string.*\$\.{field}") as e:
            decode_manifest("ckpt/x/manifest.json", body)
        assert e.value.path == "ckpt/x/manifest.json"
    with pytest.raises(CorruptManifestError, match=r"got `int`.*\$\.checkpoint_id") as info:
        decode_pointer("checkpoints/_latest", b'{"checkpoint_id": 5}')
    assert info.value.path == "checkpoints/_latest"
    with pytest.raises(CorruptManifestError, match=r"got `list`"):
        decode_pointer("checkpoints/_latest", b'{"checkpoint_id": [1]}')
    with pytest.raises(InvalidInputError, match=r"not a worker report.*\$\.checkpoint_id"):
        WorkerReport.from_json(b'{"checkpoint_id": 5, "worker": "a", "entries": []}')
    entry = msgspec.json.encode(
        PartitionSnapshotEntry(0, False, "operators/op/partition-0.snap", 1, DIGEST)
    )
    owned = entry[:-1] + b', "owner": 7}'
    report = b'{"checkpoint_id": "%s", "worker": "a", "entries": [["op", %s]]}' % (
        str(CheckpointId.now()).encode(),
        owned,
    )
    with pytest.raises(
        InvalidInputError, match=r"not a worker report.*\$\.entries\[0\]\[1\]\.owner"
    ):
        WorkerReport.from_json(report)


@pytest.mark.parametrize(
    "damage",
    [
        b'{"checkpoint_id": 5}',
        b'{"checkpoint_id": null, "writer_generation": -1}',
        b'{"checkpoint_id": null, "writer_generation": %d}' % (MAX_GENERATION + 1),
        b'{"checkpoint_id": null, "epoch": -2}',
        b"\xff garbage",
    ],
    ids=["number-id", "negative-generation", "huge-generation", "negative-epoch", "garbage"],
)
async def test_a_number_in_latest_blocks_nothing(raw: ObjectStore, damage: bytes) -> None:
    ckpt = checkpointer(raw)
    good = await ckpt.save(data(1))
    with pytest.raises(CorruptManifestError, match="latest pointer"):
        decode_pointer(ckpt.paths.latest_pointer(), damage)
    await ckpt.store.put(ckpt.paths.latest_pointer(), damage)
    assert await ckpt.read_latest() is None, "an unreadable pointer is no pointer"
    saved = await ckpt.save(data(2))  # the pointer swap replaces the damaged record
    assert await ckpt.read_latest() == saved.checkpoint_id
    await ckpt.store.put(ckpt.paths.latest_pointer(), damage)
    await ckpt.delete_checkpoint(saved.checkpoint_id)
    await assert_recovers(ckpt, good)


async def test_a_number_for_a_parent_in_a_manifest_falls_back(raw: ObjectStore) -> None:
    ckpt = checkpointer(raw)
    good, newer_path = await good_then_newer(ckpt)
    newer = decode_manifest(newer_path, (await ckpt.store.get(newer_path)).data)
    await ckpt.store.put(newer_path, bare_json(newer, lambda b: b.__setitem__("parent_id", 7)))
    with pytest.raises(CorruptManifestError, match=r"\$\.parent_id") as info:
        await ckpt.load_manifest(newer.checkpoint_id)
    assert info.value.path == newer_path
    await assert_recovers(ckpt, good)


# -- JSON nested 100,000 deep --------------------------------------------------------------


def test_deep_nesting_is_a_corrupt_record_in_every_decoder() -> None:
    with pytest.raises(CorruptManifestError, match="not a JSON object"):
        decode_manifest("m/manifest.json", DEEP)  # refused at its first byte
    for body in (b'{"version": 2, "operators": ' + DEEP, b'{"extra": ' + DEEP):
        with pytest.raises(CorruptManifestError, match="nested too deeply") as info:
            decode_manifest("m/manifest.json", body)
        assert info.value.path == "m/manifest.json"
    # Records over 64 KiB are refused unread; the parser's stack runs out far sooner, in
    # a field it skips or one typed as an id (a typed int fails at the first bracket).
    for deep in (DEEP, b"[" * 10_000):
        for body in (b'{"checkpoint_id": ' + deep, b'{"epoch": 1, "x": ' + deep):
            with pytest.raises(CorruptManifestError) as info:
                decode_pointer("checkpoints/_latest", body)
            assert info.value.path == "checkpoints/_latest"
        for body in (b'{"generation": ' + deep, b'{"other": ' + deep):
            with pytest.raises(CorruptManifestError) as info:
                decode_writer("checkpoints/_writer", body)
            assert info.value.path == "checkpoints/_writer"
    for body in (b'{"checkpoint_id": ' + b"[" * 10_000, b'{"x": ' + b"[" * 10_000):
        with pytest.raises(CorruptManifestError, match="nested too deeply"):
            decode_pointer("_latest", body)
    with pytest.raises(CorruptManifestError, match="nested too deeply"):
        decode_writer("_writer", b'{"generation": 1, "other": ' + b"[" * 10_000)
    with pytest.raises(CorruptManifestError, match="writer record of 100010 bytes is not one"):
        decode_writer("_writer", b'{"other": ' + DEEP)
    for body in (b'{"checkpoint_id": ' + DEEP, b'{"worker": "a", "x": ' + DEEP):
        with pytest.raises(InvalidInputError, match="not a worker report: .*nested too deeply"):
            WorkerReport.from_json(body)


async def test_a_deeply_nested_manifest_falls_back(raw: ObjectStore) -> None:
    ckpt = checkpointer(raw)
    good, newer_path = await good_then_newer(ckpt)
    await ckpt.store.put(newer_path, b'{"version": 2, "operators": ' + DEEP)
    await assert_recovers(ckpt, good)


async def test_a_deeply_nested_latest_blocks_nothing(raw: ObjectStore) -> None:
    ckpt = checkpointer(raw)
    good = await ckpt.save(data(1))
    await ckpt.store.put(ckpt.paths.latest_pointer(), b'{"checkpoint_id": ' + DEEP)
    assert await ckpt.read_latest() is None
    await assert_recovers(ckpt, good)


# -- entry paths that no store could hold, or that pass through a file ---------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("operators/op/" + "x" * 300 + ".snap", "segment over 255"),
        ("operators/op/partition-0.snap" + "/x" * 600_000, "over 1024"),
        ("manifest.json/x", "not at the layout's path"),
        ("intent.json/operators/op/partition-0.snap", "not at the layout's path"),
        ("operators/op/partition-1.snap", "not at the layout's path for partition 0"),
        ("operators/other/partition-0.snap", "not at the layout's path"),
        ("operators/op/partition-0.delta", "not at the layout's path"),
    ],
)
def test_entry_paths_must_be_the_layouts(path: str, reason: str) -> None:
    part = PartitionSnapshotEntry(0, False, "operators/op/partition-0.snap", 3, DIGEST)
    manifest = msgspec.structs.replace(
        CheckpointManifest.new(CheckpointId.now(), 1),
        operators={"op": OperatorSnapshotEntry((part,), 3)},
    )
    body = bare_json(manifest, lambda b: first_entry(b).__setitem__("path", path))
    with pytest.raises(CorruptManifestError, match=reason) as info:
        decode_manifest("m", body)
    assert repr(path)[:40] in str(info.value), "the message names the entry"
    assert len(str(info.value)) < 500, "a megabyte path is not copied into the message"


async def test_an_impossible_entry_path_is_damage_not_a_store_failure(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = checkpointer(LocalStore(root))
    good, newer_path = await good_then_newer(ckpt)
    newer = decode_manifest(newer_path, (await ckpt.store.get(newer_path)).data)
    for path in ("operators/op/" + "x" * 300 + ".snap", "manifest.json/x"):
        damaged = bare_json(newer, lambda b, p=path: first_entry(b).__setitem__("path", p))  # type: ignore[misc]
        await ckpt.store.put(newer_path, damaged)
        with pytest.raises(CorruptManifestError) as info:
            await ckpt.load(newer.checkpoint_id)
        assert info.value.path == newer_path
        loaded = await ckpt.load_latest()
        assert loaded is not None and loaded.checkpoint_id == good.checkpoint_id
    # The command line reports the checkpoint as damaged (1), not the store as failing (3).
    run = cairn_cli("verify", "--all", "--store", root.as_uri(), "--json")
    assert run.returncode == 1, run.stdout + run.stderr
    results = {c["id"]: c for c in json.loads(run.stdout)["checkpoints"]}
    assert results[str(good.checkpoint_id)]["ok"] is True
    bad = results[str(newer.checkpoint_id)]
    assert bad["ok"] is False and "manifest.json/x" in bad["error"], bad
    await assert_recovers(ckpt, good)


# -- an unknown codec; a damaged writer record ---------------------------------------------


def test_an_unknown_codec_is_damage_and_a_known_one_is_not() -> None:
    part = PartitionSnapshotEntry(0, False, "operators/op/partition-0.snap", 3, DIGEST)
    manifest = msgspec.structs.replace(
        CheckpointManifest.new(CheckpointId.now(), 1),
        operators={"op": OperatorSnapshotEntry((part,), 3)},
    )

    def codec(name: str) -> Callable[[dict[str, Any]], None]:
        return lambda b: first_entry(b).update(codec=name, stored_size_bytes=2)

    with pytest.raises(CorruptManifestError, match="codec 'lz4', which this cairn does not know"):
        decode_manifest("m", bare_json(manifest, codec("lz4")))
    decoded = decode_manifest("m", bare_json(manifest, codec("zstd")))
    assert decoded.operators["op"].partitions[0].codec == "zstd"


async def test_an_unknown_codec_falls_back(raw: ObjectStore) -> None:
    ckpt = checkpointer(raw)
    good, newer_path = await good_then_newer(ckpt)
    newer = decode_manifest(newer_path, (await ckpt.store.get(newer_path)).data)
    await ckpt.store.put(
        newer_path, bare_json(newer, lambda b: first_entry(b).update(codec="brotli"))
    )
    await assert_recovers(ckpt, good)


DAMAGED_WRITERS = [
    b"\x00not json",
    b'{"generation": -1}',
    b'{"generation": "7"}',
    b'{"generation": 1.5}',
    b'{"generation": %d}' % (MAX_GENERATION + 1),
    b'{"generation": 2, "acquired_ms": -5}',
    b"[]",
    b'{"generation": ' + DEEP,
]


@pytest.mark.parametrize("damage", DAMAGED_WRITERS, ids=lambda d: d[:24].decode("latin-1"))
async def test_a_damaged_writer_record_fences_everyone_until_a_takeover_repairs_it(
    raw: ObjectStore, damage: bytes
) -> None:
    old = checkpointer(raw)
    assert await old.take_over() == 1
    kept = await old.save(data(1))
    writer_path = old.paths.writer_record()
    await old.store.put(writer_path, damage)
    with pytest.raises(CorruptManifestError) as info:
        await read_generation(old.store, writer_path)
    assert info.value.path == writer_path
    # A fence of unknown height stops every writer: nothing of the save is written.
    before = await objects(old)
    with pytest.raises(CorruptManifestError, match="writer record"):
        await old.save(data(2))
    assert await objects(old) == before
    # take_over repairs it: one above the generation _latest records (1).
    new = checkpointer(raw)
    assert await new.take_over() == 2
    assert await read_generation(new.store, writer_path) == (
        2,
        (await new.store.head(writer_path)).e_tag,
    )
    with pytest.raises(FencedError) as fenced:
        await old.save(data(3))
    assert (fenced.value.own_generation, fenced.value.current_generation) == (1, 2)
    assert await new.read_latest() == kept.checkpoint_id
    await assert_writes(new)


async def test_a_damaged_writer_record_without_a_pointer_is_repaired_from_the_clock(
    raw: ObjectStore,
) -> None:
    ckpt = checkpointer(raw)
    await ckpt.store.put((await ckpt.resolve_paths()).writer_record(), b'{"generation": -3}')
    before = time.time_ns() // 10**6
    generation = await ckpt.take_over()
    assert before < generation <= time.time_ns() // 10**6 + 1
    saved = await ckpt.save(data(1))
    assert saved.writer_generation == generation
    await assert_writes(ckpt)


async def test_a_lost_writer_record_cannot_leave_take_over_below_the_pointer(
    raw: ObjectStore,
) -> None:
    ckpt = checkpointer(raw)
    for _ in range(3):
        await ckpt.take_over()
    await ckpt.save(data(1))
    await ckpt.store.delete([ckpt.paths.writer_record()])
    new = checkpointer(raw)
    assert await new.take_over() == 4, "above the generation _latest records"
    with pytest.raises(FencedError):
        await ckpt.save(data(2))
    await assert_writes(new)


# -- names at the limit of a local file system ---------------------------------------------


async def test_names_at_the_limit_save_load_and_restore_on_a_local_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = checkpointer(LocalStore(root))
    assert MAX_SOURCE_NAME_BYTES == 236
    source = "é" * (MAX_SOURCE_NAME_BYTES // 2)  # two bytes a character: exactly at the limit
    operator = "o" * MAX_NAME_BYTES
    offsets = {source: SourceOffsetEntry("kafka", {"0": "1"}, 1), "s" * 236: SourceOffsetEntry("t")}
    saved = await ckpt.save(
        CheckpointData(epoch=1, snapshots={(operator, 4294967295): b"x"}, source_offsets=offsets)
    )
    loaded = await ckpt.load(saved.checkpoint_id)
    assert loaded.source_offsets == offsets
    assert bytes(loaded.artifacts[(operator, 4294967295)]) == b"x"
    target = tmp_path / "restored"
    run = cairn_cli("restore", "latest", "--to", str(target), "--store", root.as_uri())
    assert run.returncode == 0, run.stdout + run.stderr
    restored = target / str(saved.checkpoint_id) / "offsets" / f"{source}.json"
    assert json.loads(restored.read_bytes())["offsets"] == {"0": "1"}


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("source", lambda n: CheckpointData(epoch=1, source_offsets={n: SourceOffsetEntry("t")})),
        ("operator", lambda n: CheckpointData(epoch=1, snapshots={(n, 0): b"x"})),
    ],
)
def test_names_one_byte_over_the_limit_are_refused_before_any_io(
    kind: str, make: Callable[[str], CheckpointData]
) -> None:
    limit = MAX_SOURCE_NAME_BYTES if kind == "source" else MAX_NAME_BYTES
    make("n" * limit)
    with pytest.raises(InvalidNameError, match=f"is {limit + 1} UTF-8 bytes, the limit is {limit}"):
        make("n" * (limit + 1))


def test_a_stored_manifest_keeps_source_names_longer_than_new_ones_may_be() -> None:
    source = "s" * MAX_NAME_BYTES
    body = bare_json(
        CheckpointManifest.new(CheckpointId.now(), 1),
        lambda b: b.__setitem__(
            "source_offsets", {source: {"source_type": "t", "offsets": {}, "epoch": 1}}
        ),
    )
    assert source in decode_manifest("m", body).source_offsets
    with pytest.raises(CorruptManifestError, match="is 256 UTF-8 bytes"):
        decode_manifest("m", body.replace(source.encode(), source.encode() + b"s"))


# -- epochs and times every reader can hold ------------------------------------------------


def test_epochs_times_and_watermarks_are_bounded_when_constructed() -> None:
    CheckpointData(epoch=MAX_INT64, timestamp_ms=MAX_TIMESTAMP_MS, watermark=-MAX_INT64 - 1)
    cases: list[dict[str, Any]] = [
        {"epoch": MAX_INT64 + 1},
        {"epoch": 2**64},
        {"timestamp_ms": MAX_TIMESTAMP_MS + 1},
        {"timestamp_ms": -1},
        {"watermark": MAX_INT64 + 1},
        {"source_offsets": {"s": SourceOffsetEntry("t", {}, 2**64)}},
    ]
    for bad in cases:
        with pytest.raises(InvalidCheckpointDataError, match="out of range|must be"):
            CheckpointData(**{"epoch": 1, **bad})


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("epoch", 2**64, "epoch"),
        ("epoch", MAX_INT64 + 1, "epoch"),
        ("timestamp_ms", MAX_TIMESTAMP_MS + 1, "timestamp_ms"),
        ("timestamp_ms", -1, "timestamp_ms"),
        ("total_size_bytes", -1, "total_size_bytes"),
        ("writer_generation", 2**63, "writer_generation"),
        ("watermark", -(2**63) - 1, "watermark"),
    ],
)
def test_a_manifest_out_of_range_is_damage(field: str, value: int, reason: str) -> None:
    manifest = CheckpointManifest.new(CheckpointId.now(), 1)
    with pytest.raises(CorruptManifestError, match=reason):
        decode_manifest("m", bare_json(manifest, lambda b: b.__setitem__(field, value)))
    edge = bare_json(manifest, lambda b: b.update(epoch=MAX_INT64, timestamp_ms=MAX_TIMESTAMP_MS))
    assert decode_manifest("m", edge).epoch == MAX_INT64


async def test_the_largest_epoch_and_time_round_trip(raw: ObjectStore) -> None:
    ckpt = checkpointer(raw)
    saved = await ckpt.save(
        CheckpointData(epoch=MAX_INT64, snapshots={("op", 0): b"x"}, timestamp_ms=MAX_TIMESTAMP_MS)
    )
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.manifest == saved and loaded.epoch == MAX_INT64


async def test_a_manifest_from_after_year_9999_falls_back_and_the_cli_lists_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = checkpointer(LocalStore(root))
    good, newer_path = await good_then_newer(ckpt)
    newer = decode_manifest(newer_path, (await ckpt.store.get(newer_path)).data)
    future = bare_json(newer, lambda b: b.__setitem__("timestamp_ms", 10**17))
    await ckpt.store.put(newer_path, future)
    with pytest.raises(CorruptManifestError, match="timestamp_ms 100000000000000000 is out"):
        await ckpt.load_manifest(newer.checkpoint_id)
    listed = cairn_cli("list", "--store", root.as_uri(), "--json")
    shown = cairn_cli("show", str(newer.checkpoint_id), "--store", root.as_uri())
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = {c["id"]: c for c in json.loads(listed.stdout)["checkpoints"]}
    assert "timestamp_ms" in rows[str(newer.checkpoint_id)]["error"]
    assert rows[str(good.checkpoint_id)]["epoch"] == 1
    assert shown.returncode == 1 and "integrity failure" in shown.stderr, shown.stderr
    assert "Traceback" not in shown.stderr + listed.stderr
    await assert_recovers(ckpt, good)


def test_views_never_crash_on_a_time_with_no_date() -> None:
    far = 10**18  # some 31 million years: no datetime holds it
    manifest = msgspec.structs.replace(
        CheckpointManifest.new(CheckpointId.now(), 1), timestamp_ms=far
    )
    doc = views.manifest_doc(manifest)
    assert doc["created"] is None and doc["timestamp_ms"] == far
    console = Console(file=io.StringIO(), width=200)
    mark = Latest(manifest.checkpoint_id, manifest.checkpoint_id)
    console.print(views.show_table(manifest, mark))
    console.print(views.list_table([Listed(manifest.checkpoint_id, manifest)], mark))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"{far} ms after 1970 (not a date)" in text and "in the future" in text


# -- a bound on the size of a manifest -----------------------------------------------------


def big_manifest(entries: int, operators: int = 1) -> CheckpointManifest:
    per_op = entries // operators
    ops = {
        f"operator-{o}": OperatorSnapshotEntry.from_partitions(
            [
                PartitionSnapshotEntry(
                    p, False, f"operators/operator-{o}/partition-{p}.snap", 9, DIGEST
                )
                for p in range(per_op)
            ]
        )
        for o in range(operators)
    }
    return msgspec.structs.replace(
        CheckpointManifest.new(CheckpointId.now(), 1),
        operators=ops,
        total_size_bytes=sum(op.total_bytes for op in ops.values()),
    )


def test_a_manifest_over_the_limit_is_refused_on_read_before_parsing() -> None:
    body = bare_json(CheckpointManifest.new(CheckpointId.now(), 1), lambda b: None)
    padded = bytearray(body)
    padded.extend(b" " * (MAX_MANIFEST_BYTES - len(body)))  # white space: still valid JSON
    assert decode_manifest("m", padded).epoch == 1, "exactly at the limit reads"
    padded.extend(b" ")
    with pytest.raises(
        CorruptManifestError, match=f"{MAX_MANIFEST_BYTES + 1} bytes, over the limit of"
    ):
        decode_manifest("m", padded)


def test_a_manifest_over_the_limit_is_refused_on_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_module, "PART_ENTRIES", 10**9)  # stored whole, as one object
    manifest = big_manifest(260_000)
    with pytest.raises(
        InvalidCheckpointDataError, match="260000 artifact entries.*limit of 67108864"
    ):
        encode_manifest(manifest)


def test_a_root_or_a_part_over_the_limit_is_refused_on_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(manifest_module, "PART_ENTRIES", 8)
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 8192)
    assert len(encode_stored(big_manifest(96)).parts) == 12  # 96 entries: parts of 8
    with pytest.raises(InvalidCheckpointDataError, match=r"200 parts of 100 operator\(s\).*8192"):
        encode_stored(big_manifest(1600, operators=100))  # the root's records: over
    delta = PartitionSnapshotEntry(0, True, "operators/op/partition-0.delta", 9, DIGEST)
    chain = [PartitionSnapshotEntry(0, False, "operators/op/partition-0.snap", 9, DIGEST)]
    chain += [msgspec.structs.replace(delta, owner=CheckpointId.now()) for _ in range(200)]
    long_chain = msgspec.structs.replace(
        CheckpointManifest.new(CheckpointId.now(), 1),
        operators={"op": OperatorSnapshotEntry.from_partitions(chain)},
    )
    with pytest.raises(InvalidCheckpointDataError, match="a manifest part .* too long"):
        encode_stored(long_chain)


async def test_an_oversized_manifest_falls_back_and_a_save_over_the_limit_writes_nothing(
    raw: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = checkpointer(raw)
    good, newer_path = await good_then_newer(ckpt)
    body = bytes((await ckpt.store.get(newer_path)).data)
    await ckpt.store.put(newer_path, body + b" " * MAX_MANIFEST_BYTES)
    with pytest.raises(CorruptManifestError, match="over the limit"):
        await ckpt.load_manifest(decode_manifest("m", body).checkpoint_id)
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == good.checkpoint_id
    await ckpt.store.put(newer_path, body)

    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 4096)
    before = await ckpt.list_checkpoints()
    too_big = CheckpointData(epoch=5, snapshots={("op", p): b"x" for p in range(30)})
    with pytest.raises(InvalidCheckpointDataError, match="over the limit of 4096 bytes"):
        await ckpt.save(too_big)
    assert await ckpt.list_checkpoints() == before
    assert not [p for p in await objects(ckpt) if str(too_big.id) in p], "uploads removed"
    monkeypatch.undo()
    await assert_writes(ckpt)


async def write_manifest_alone(ckpt: ObjectStoreCheckpointer, manifest: CheckpointManifest) -> int:
    """Write ``manifest`` as it is stored, root and parts, and nothing it names
    (``save_manifest`` would refuse it: its artifacts are absent); its number of parts."""
    stored = encode_stored(manifest)
    paths = await ckpt.resolve_paths()
    for relative, body in stored.parts:
        await ckpt.store.put(paths.resolve(manifest.checkpoint_id, relative), body)
    await ckpt.store.put(ckpt.paths.manifest(manifest.checkpoint_id), stored.root)
    return len(stored.parts)


async def test_show_summarises_a_checkpoint_of_20000_partitions(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = checkpointer(LocalStore(root))
    manifest = big_manifest(20_000, operators=2)
    # show reads nothing but the manifest: 2 operators of 10,000 entries, in parts of 4,096.
    assert await write_manifest_alone(ckpt, manifest) == 6
    show = ["show", "newest", "--store", root.as_uri()]
    with ThreadPoolExecutor(3) as pool:
        human, summary, full = pool.map(
            lambda args: cairn_cli(*args),
            [show, [*show, "--json"], [*show, "--partitions", "--json"]],
        )
    for run in (human, summary, full):
        assert run.returncode == 0, run.stdout + run.stderr
    lines = human.stdout.splitlines()
    assert len(lines) < 30, human.stdout
    assert "20000 artifacts in 2 operators" in human.stdout
    assert lines[-1] == "--partitions lists every artifact", human.stdout
    assert "operator-0" in human.stdout and "10000" in human.stdout
    doc = json.loads(summary.stdout)
    assert doc["listed"] is False and "entries" not in doc
    assert doc["operators"][1] == {
        "operator": "operator-1",
        "partitions": 10000,
        "artifacts": 10000,
        "snapshots": 10000,
        "deltas": 0,
        "carried": 0,
        "size_bytes": 90000,
    }
    doc = json.loads(full.stdout)
    assert doc["listed"] is True and len(doc["entries"]) == 20_000
    # 20,000 objects are more than show reads to find the latest: none of them is read.
    assert "newest (too large to" in human.stdout, human.stdout


async def test_a_newest_of_more_objects_than_a_listing_reads_is_left_unverified(
    tmp_path: Path,
) -> None:
    # Finding the latest reads the newest whole: a request per object. Past the bound,
    # list and show mark it newest, unverified, as they do one of too many bytes.
    for count, verified in (
        (MARK_VERIFIES_OBJECTS_UP_TO, True),
        (MARK_VERIFIES_OBJECTS_UP_TO + 1, False),
    ):
        root = tmp_path / str(count)
        root.mkdir()
        ckpt = checkpointer(LocalStore(root))
        manifest = big_manifest(count)
        await write_manifest_alone(ckpt, manifest)  # its artifacts are absent
        mark = await latest_mark(ckpt)
        assert mark.newest == manifest.checkpoint_id and mark.verified is verified, count
        # Read, it does not load (its artifacts are absent); unread, it is unknown.
        assert mark.latest is None


def test_a_summary_caps_each_table_and_partitions_lists_everything() -> None:
    manifest = msgspec.structs.replace(
        big_manifest(300, operators=60),
        source_offsets={f"source-{s}": SourceOffsetEntry("t", {"0": str(s)}) for s in range(60)},
    )
    assert not views.show_lists_entries(manifest, partitions=False)
    assert views.show_lists_entries(manifest, partitions=True)
    small = big_manifest(views.SHOW_ENTRIES_LIMIT)
    assert views.show_lists_entries(small, partitions=False)
    assert not views.show_lists_entries(big_manifest(views.SHOW_ENTRIES_LIMIT + 1), False)

    def render(listed: bool) -> str:
        console = Console(file=io.StringIO(), width=200)
        console.print(views.show_table(manifest, Latest(None, None), listed=listed))
        return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]

    summary = render(False)
    assert "10 more sources not shown; --partitions lists every one" in summary
    assert "10 more operators not shown; --partitions lists every artifact" in summary
    assert "source-9 " not in summary and "operator-9 " not in summary  # sorted: 9 is last
    assert summary.count("\n") < 2 * views.SHOW_ROWS_LIMIT + 30
    full = render(True)
    assert "source-9 " in full and full.count("operator-59") == 5 and "not shown" not in full
    doc = views.show_doc(manifest, Latest(None, None), listed=False)
    assert len(doc["operators"]) == 60 and len(doc["source_offsets"]) == 60
