"""The statistics a save records in its manifest: what it stored and what it asked of
the store.

``stored_bytes`` is checked against the objects the save left in its directory, and
``requests`` against the calls a recording store wrapper saw, one by one, up to and
including the manifest's write (the commit point: what follows cannot be in the record).
Manifests whose statistics lack these fields load, and fields of the statistics a
reader does not know do not stop it.
"""

from __future__ import annotations

import collections
import json

import msgspec
import pytest
from obstore.store import MemoryStore
from support.faults import FaultPlan, FaultyStore, PutFault
from support.paths import DATA
from support.recording import KIND_OF, RecordingStore, requests_up_to_commit

import cairn.format.manifest
from cairn import CheckpointData, CheckpointPaths, ObjectStoreCheckpointer, RetryPolicy
from cairn.errors import CorruptManifestError
from cairn.format.ids import CheckpointId
from cairn.format.manifest import (
    CheckpointManifest,
    SaveStats,
    StoreRequests,
    decode_manifest,
    encode_manifest,
)
from cairn.stores import ObstoreStore

PREFIX = "ckpt/"
NO_WAIT = RetryPolicy(initial_delay=0, max_delay=0)


async def stored_under(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> int:
    """The bytes of every object in the checkpoint's directory."""
    return sum(info.size for info in await ckpt.store.list(ckpt.paths.checkpoint_dir(cid)))


def some_data(epoch: int = 1) -> CheckpointData:
    """Small partitions (packed together) and one too large for a pack."""
    return CheckpointData(
        epoch=epoch,
        snapshots={
            ("agg", 0): b"a" * 100,
            ("agg", 1): b"b" * 200,
            ("join", 0): b"c" * 50,
            ("big", 0): bytes(range(256)) * 8192,  # 2 MiB: an object of its own
        },
    )


async def test_a_save_counts_every_request_the_store_saw_up_to_its_commit() -> None:
    """A save of known partitions, one artifact upload failing once (retried): the
    manifest's requests are exactly the calls the store saw, the failed attempt too."""
    fault = PutFault("/operators/big/", steps=("fail",), kinds=frozenset({"overwrite"}))
    recording = FaultyStore(ObstoreStore(MemoryStore()), FaultPlan(put_faults=[fault]))
    ckpt = ObjectStoreCheckpointer(recording, CheckpointPaths(PREFIX), retry=NO_WAIT)
    first = await ckpt.save(some_data())
    assert [what for *_, what in fault.fired] == ["failed", "passed"]
    stats = first.stats
    assert stats is not None and isinstance(stats.requests, StoreRequests)
    path = ckpt.paths.manifest(first.checkpoint_id)
    assert stats.requests == requests_up_to_commit(recording, path)
    # Intent, a pack, the big object twice (one failed attempt), the manifest.
    assert stats.requests.put == 5
    assert stats.retries == 1

    # A second save builds on the first: it reads the parent, and counts only its own.
    recording.log.clear()
    data = CheckpointData(epoch=2, deltas={("agg", 0): b"+1"}, parent_id=first.checkpoint_id)
    second = await ckpt.save(data)
    assert second.stats is not None and isinstance(second.stats.requests, StoreRequests)
    path = ckpt.paths.manifest(second.checkpoint_id)
    assert second.stats.requests == requests_up_to_commit(recording, path)
    assert second.stats.requests.get >= 1  # the parent's manifest
    assert second.stats.retries == 0


async def test_requests_after_the_commit_point_are_not_in_the_record() -> None:
    """The check after the create, the intent's delete and the pointer swap come after
    the manifest: not counted. (The pointer is read beside the uploads: counted.)"""
    recording = RecordingStore(ObstoreStore(MemoryStore()))
    ckpt = ObjectStoreCheckpointer(recording, CheckpointPaths(PREFIX))
    manifest = await ckpt.save(some_data())
    assert manifest.stats is not None and isinstance(manifest.stats.requests, StoreRequests)
    total = collections.Counter(KIND_OF.get(op, op) for op, _ in recording.log)
    after = total - collections.Counter(msgspec.structs.asdict(manifest.stats.requests))
    assert +after == collections.Counter({"list": 1, "delete": 1, "put": 1})
    assert manifest.stats.requests.delete == 0


@pytest.mark.parametrize("variant", ["plain", "compressed", "signed", "in parts"])
async def test_stored_bytes_are_what_the_save_left_in_the_store(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    options: dict[str, object] = {}
    data = some_data()
    if variant == "compressed":
        options["compression"] = "zstd"
    elif variant == "signed":
        options["signing_key"] = b"k" * 32
    elif variant == "in parts":
        monkeypatch.setattr(cairn.format.manifest, "PART_ENTRIES", 8)
        data = CheckpointData(
            epoch=1, snapshots={("many", p): f"state {p}".encode() * 9 for p in range(30)}
        )
    recording = RecordingStore(ObstoreStore(MemoryStore()))
    ckpt = ObjectStoreCheckpointer(recording, CheckpointPaths(PREFIX), **options)  # type: ignore[arg-type]
    manifest = await ckpt.save(data)
    stats = manifest.stats
    assert stats is not None and isinstance(stats.requests, StoreRequests)
    assert stats.stored_bytes == await stored_under(ckpt, manifest.checkpoint_id)
    assert stats.requests == requests_up_to_commit(
        recording, ckpt.paths.manifest(manifest.checkpoint_id)
    )
    if variant == "in parts":
        assert len(manifest.parts) >= 3
        assert stats.requests.put == 1 + 1 + len(manifest.parts) + 1  # intent, pack, parts
    if variant == "compressed":
        assert stats.uploaded_bytes < manifest.total_size_bytes  # as stored, compressed
    loaded = await ckpt.load_manifest(manifest.checkpoint_id)
    assert loaded.stats == stats


async def test_carried_bytes_and_what_an_incremental_save_stored() -> None:
    ckpt = ObjectStoreCheckpointer(MemoryStore(), CheckpointPaths(PREFIX))
    first = await ckpt.save(some_data())
    second = await ckpt.save(
        CheckpointData(epoch=2, deltas={("agg", 1): b"+x"}, parent_id=first.checkpoint_id)
    )
    stats = second.stats
    assert stats is not None and first.stats is not None
    assert (stats.uploaded_bytes, stats.uploaded_artifacts) == (2, 1)
    assert stats.carried_artifacts == 4
    assert stats.carried_bytes == first.stats.uploaded_bytes
    assert stats.stored_bytes == await stored_under(ckpt, second.checkpoint_id)


def test_manifests_written_before_the_new_statistics_still_load() -> None:
    old = DATA / "store-unpacked" / "checkpoints"
    for path in sorted(old.glob("*/manifest.json")):
        manifest = decode_manifest(str(path), path.read_bytes())
        assert manifest.stats is not None, path
        assert manifest.stats.stored_bytes is msgspec.UNSET
        assert manifest.stats.requests is msgspec.UNSET
        assert manifest.stats.uploaded_artifacts > 0


class _OlderSaveStats(msgspec.Struct, frozen=True, kw_only=True):
    """SaveStats as cairn declared it before ``stored_bytes`` and ``requests``."""

    duration_ms: int
    upload_ms: int
    commit_ms: int
    uploaded_bytes: int
    uploaded_artifacts: int
    carried_bytes: int
    carried_artifacts: int
    retries: int = 0


class _OlderManifest(msgspec.Struct, forbid_unknown_fields=False):
    stats: _OlderSaveStats | None = None


async def test_an_older_reader_reads_the_new_statistics() -> None:
    """Older cairn decodes a manifest's statistics with its own SaveStats, which does
    not forbid unknown fields: the new ones are skipped, the rest read as written."""
    assert not SaveStats.__struct_config__.forbid_unknown_fields
    assert not StoreRequests.__struct_config__.forbid_unknown_fields
    ckpt = ObjectStoreCheckpointer(MemoryStore(), CheckpointPaths(PREFIX))
    manifest = await ckpt.save(some_data())
    body = encode_manifest(manifest)
    assert b'"stored_bytes"' in body and b'"requests"' in body
    older = msgspec.json.decode(body, type=_OlderManifest)
    stats = manifest.stats
    assert stats is not None and older.stats is not None
    assert older.stats.uploaded_bytes == stats.uploaded_bytes
    assert older.stats.duration_ms == stats.duration_ms


def test_statistics_written_before_the_new_fields_encode_byte_for_byte() -> None:
    """Their ``retries`` stays written, 0 included; the fields they lack stay absent."""
    old = DATA / "store-unpacked" / "checkpoints"
    for path in sorted(old.glob("*/manifest.json")):
        data = path.read_bytes()
        assert b'"retries": 0' in data
        assert encode_manifest(decode_manifest(str(path), data)) == data, path


def test_unset_new_statistics_are_not_written() -> None:
    stats = SaveStats(
        duration_ms=1,
        upload_ms=1,
        commit_ms=0,
        uploaded_bytes=3,
        uploaded_artifacts=1,
        carried_bytes=0,
        carried_artifacts=0,
        retries=2,
    )
    manifest = msgspec.structs.replace(CheckpointManifest.new(CheckpointId.now(), 1), stats=stats)
    written = json.loads(encode_manifest(manifest))
    assert set(written["stats"]) == {
        "duration_ms",
        "upload_ms",
        "commit_ms",
        "uploaded_bytes",
        "uploaded_artifacts",
        "carried_bytes",
        "carried_artifacts",
        "retries",
    }
    assert decode_manifest("m", encode_manifest(manifest)).stats == stats


@pytest.mark.parametrize(
    ("stats", "message"),
    [
        ({"stored_bytes": -1}, "stats.stored_bytes -1 is out of range"),
        ({"requests": {"put": -2}}, "stats.requests.put -2 is out of range"),
        ({"requests": {"get": 2**63}}, "stats.requests.get 9223372036854775808 is out of range"),
    ],
)
async def test_damaged_statistics_are_damage(stats: dict[str, object], message: str) -> None:
    ckpt = ObjectStoreCheckpointer(MemoryStore(), CheckpointPaths(PREFIX))
    manifest = await ckpt.save(some_data())
    doc = json.loads(encode_manifest(manifest))
    doc["stats"].update(stats)
    del doc["manifest_sha256"]  # no checksum to match: the checks alone decide
    with pytest.raises(CorruptManifestError, match=message):
        decode_manifest("damaged/manifest.json", json.dumps(doc).encode())
