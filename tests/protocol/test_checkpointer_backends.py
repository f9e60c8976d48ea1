"""The checkpointer on every backend: each test here runs against every store of
``support.backends.BACKENDS`` (memory, local, S3, Azure, GCS).

It covers what the reference implementation's own tests cover (manifest round trip,
snapshot digest, artifact load, latest pointer absent then present, concurrent upload
with digests, integrity mismatch, a manifest built from saved partitions) and the
behaviour cairn adds on top.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from obstore.store import ObjectStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore
from support.intents import intents_of
from support.policies import FAST_RETRY

from cairn import (
    CheckpointData,
    CheckpointExistsError,
    CheckpointId,
    CheckpointManifest,
    CheckpointNotFoundError,
    CheckpointPaths,
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidNameError,
    ObjectStoreCheckpointer,
    OperatorSnapshotEntry,
    SourceOffsetEntry,
    StoreError,
    TransientStoreError,
    UnsupportedManifestVersionError,
)
from cairn.stores import ObstoreStore


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def all_paths(ckpt: ObjectStoreCheckpointer) -> list[str]:
    return sorted(info.path for info in await ckpt.store.list(""))


# -- what the reference's own tests cover ------------------------------------------------


async def test_manifest_round_trip(ckpt: ObjectStoreCheckpointer) -> None:
    cid = CheckpointId.now()
    manifest = CheckpointManifest.new(cid, 7)
    await ckpt.save_manifest(manifest)
    assert await ckpt.load_manifest(cid) == manifest


async def test_save_snapshot_returns_sha256_of_the_data(ckpt: ObjectStoreCheckpointer) -> None:
    cid = CheckpointId.now()
    data = b"operator state \x00\x01" * 100
    digest = await ckpt.save_snapshot(cid, "agg", 3, data)
    assert digest == sha(data)
    stored = await ckpt.load_artifact(ckpt.paths.snapshot(cid, "agg", 3))
    assert bytes(stored) == data


async def test_save_delta_goes_to_the_delta_path(ckpt: ObjectStoreCheckpointer) -> None:
    cid = CheckpointId.now()
    digest = await ckpt.save_delta(cid, "agg", 0, b"delta")
    assert digest == sha(b"delta")
    # With the lease the upload held (its intent): it lapses unless the checkpoint commits.
    [intent] = await intents_of(ckpt.store, ckpt.paths, cid)
    assert await all_paths(ckpt) == sorted([ckpt.paths.delta(cid, "agg", 0), intent])


async def test_load_artifact_verifies_when_given_a_digest(ckpt: ObjectStoreCheckpointer) -> None:
    cid = CheckpointId.now()
    digest = await ckpt.save_snapshot(cid, "op", 0, b"payload")
    path = ckpt.paths.snapshot(cid, "op", 0)
    assert bytes(await ckpt.load_artifact(path, expected_sha256=digest)) == b"payload"
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load_artifact(path, expected_sha256=sha(b"other"))
    assert info.value.path == path
    assert info.value.expected == sha(b"other")
    assert info.value.actual == digest


async def test_load_artifact_of_missing_path_is_not_found(ckpt: ObjectStoreCheckpointer) -> None:
    with pytest.raises(CheckpointNotFoundError) as info:
        await ckpt.load_artifact("checkpoints/nope/operators/x/partition-0.snap")
    assert isinstance(info.value, FileNotFoundError)
    assert "nope" in str(info.value)


async def test_latest_pointer_absent_then_present(ckpt: ObjectStoreCheckpointer) -> None:
    assert await ckpt.read_latest() is None
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    assert await ckpt.read_latest() == manifest.checkpoint_id


async def test_update_latest_moves_only_forwards(ckpt: ObjectStoreCheckpointer) -> None:
    old = CheckpointManifest.new(CheckpointId.now(), 1)
    new = CheckpointManifest.new(CheckpointId.now(), 2)
    await ckpt.save_manifest(old)
    await ckpt.save_manifest(new)
    assert await ckpt.update_latest(new.checkpoint_id) is True
    assert await ckpt.update_latest(old.checkpoint_id) is False
    assert await ckpt.read_latest() == new.checkpoint_id
    assert await ckpt.update_latest(old.checkpoint_id, force=True) is True
    assert await ckpt.read_latest() == old.checkpoint_id
    with pytest.raises(CheckpointNotFoundError):
        await ckpt.update_latest(CheckpointId.now())


async def test_concurrent_partition_upload_with_digests(ckpt: ObjectStoreCheckpointer) -> None:
    cid = CheckpointId.now()
    uploads = [
        (f"op-{o}", p, p % 2 == 1, f"{o}:{p}".encode() * 1000) for o in range(3) for p in range(5)
    ]
    results = await ckpt.save_partitions_concurrent(cid, uploads)
    assert len(results) == 15
    for (op, part, is_delta, data), (got_op, entry) in zip(uploads, results, strict=True):
        assert got_op == op
        assert entry.partition_id == part and entry.is_delta == is_delta
        assert entry.size_bytes == len(data) and entry.sha256 == sha(data)
        stored = await ckpt.load_artifact(ckpt.paths.resolve(cid, entry.path))
        assert bytes(stored) == data
    assert not await ckpt.list_checkpoints(), "uploading partitions commits nothing"


async def test_build_manifest_from_saved_partitions(ckpt: ObjectStoreCheckpointer) -> None:
    cid = CheckpointId.now()
    results = await ckpt.save_partitions_concurrent(
        cid, [("join", 0, False, b"left"), ("join", 1, False, b"right!")]
    )
    manifest = CheckpointManifest(
        version=2,
        checkpoint_id=cid,
        epoch=5,
        timestamp_ms=1,
        operators={"join": OperatorSnapshotEntry.from_partitions([e for _, e in results])},
        total_size_bytes=10,
    )
    await ckpt.save_manifest(manifest)
    loaded = await ckpt.load(cid)
    assert loaded.manifest.operators["join"].total_bytes == 10
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {
        ("join", 0): b"left",
        ("join", 1): b"right!",
    }


async def test_integrity_mismatch_on_load(ckpt: ObjectStoreCheckpointer) -> None:
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"original"}))
    path = artifact_path(ckpt.paths, manifest, "op", 0)
    await ckpt.store.put(path, b"tampered")
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load(manifest.checkpoint_id)
    assert info.value.path == path
    assert info.value.expected == sha(b"original") and info.value.actual == sha(b"tampered")


# -- what cairn adds ---------------------------------------------------------------------


async def test_save_and_load_everything(ckpt: ObjectStoreCheckpointer) -> None:
    offsets = {"kafka": SourceOffsetEntry("kafka", {"topic-0": "42", "topic-1": "7"}, 3)}
    data = CheckpointData(
        epoch=3,
        snapshots={("agg", 0): b"a" * 100_000, ("agg", 1): bytearray(b"b" * 10), ("win", 0): b""},
        source_offsets=offsets,
        watermark=1234,
    )
    manifest = await ckpt.save(data)
    assert manifest.checkpoint_id == data.id and manifest.epoch == 3
    assert manifest.total_size_bytes == 100_010 and manifest.watermark == 1234
    loaded = await ckpt.load(data.id)
    assert loaded.manifest == manifest
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {
        ("agg", 0): b"a" * 100_000,
        ("agg", 1): b"b" * 10,
        ("win", 0): b"",
    }
    assert loaded.source_offsets == offsets
    manifest_bytes = await ckpt.load_artifact(ckpt.paths.manifest(data.id))
    assert b'"topic-0": "42"' in bytes(manifest_bytes)  # the offsets live in the manifest
    latest = await ckpt.load_latest()
    assert latest is not None and latest.manifest == manifest


async def test_delete_leaves_zero_objects_behind(ckpt: ObjectStoreCheckpointer) -> None:
    keep = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"keep"}))
    gone = await ckpt.save(
        CheckpointData(
            epoch=2,
            snapshots={("op", p): b"x" * p for p in range(5)},
            source_offsets={"src": SourceOffsetEntry("file", {"a": "1"}, 2)},
        )
    )
    before = await all_paths(ckpt)
    await ckpt.delete_checkpoint(gone.checkpoint_id)
    after = await all_paths(ckpt)
    gone_dir = ckpt.paths.checkpoint_dir(gone.checkpoint_id)
    assert not [p for p in after if p.startswith(gone_dir)]
    # The delete reads the store's time as GC does, from the stamp of the `_clock` record.
    assert set(after) - {ckpt.paths.clock()} == {p for p in before if not p.startswith(gone_dir)}
    assert await ckpt.list_checkpoints() == [keep.checkpoint_id]
    await ckpt.delete_checkpoint(gone.checkpoint_id)  # deleting a missing one is fine
    await ckpt.delete_checkpoint(CheckpointId.now())


async def test_listing_is_chronological_and_ignores_uncommitted(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    committed = []
    for epoch in range(4):
        committed.append((await ckpt.save(CheckpointData(epoch=epoch))).checkpoint_id)
        await ckpt.save_snapshot(CheckpointId.now(), "op", 0, b"uncommitted")
    await ckpt.store.put(ckpt.paths.base_prefix + "not-an-id/file", b"junk")
    listed = await ckpt.list_checkpoints()
    assert listed == committed == sorted(committed)


async def test_second_commit_of_same_id_is_refused(ckpt: ObjectStoreCheckpointer) -> None:
    data = CheckpointData(epoch=1, snapshots={("op", 0): b"first"})
    first = await ckpt.save(data)
    again = CheckpointData(epoch=2, snapshots={("op", 0): b"second"}, checkpoint_id=data.id)
    with pytest.raises(CheckpointExistsError) as info:
        await ckpt.save(again)
    assert str(data.id) in str(info.value)
    loaded = await ckpt.load(data.id)
    assert loaded.manifest == first and bytes(loaded.artifacts[("op", 0)]) == b"first"
    with pytest.raises(CheckpointExistsError):
        await ckpt.save_snapshot(data.id, "op", 0, b"overwrite attempt")
    different = CheckpointManifest.new(data.id, 99)
    with pytest.raises(CheckpointExistsError):
        await ckpt.save_manifest(different)
    await ckpt.save_manifest(first)  # the identical manifest: an already-done commit


async def test_load_of_missing_checkpoint(ckpt: ObjectStoreCheckpointer) -> None:
    missing = CheckpointId.now()
    with pytest.raises(CheckpointNotFoundError) as info:
        await ckpt.load(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(CheckpointNotFoundError):
        await ckpt.load_manifest(missing)


async def test_corrupt_and_unsupported_manifests(ckpt: ObjectStoreCheckpointer) -> None:
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    path = ckpt.paths.manifest(manifest.checkpoint_id)
    body = bytes((await ckpt.store.get(path)).data)
    await ckpt.store.put(path, body[: len(body) // 2])
    with pytest.raises(CorruptManifestError) as corrupt:
        await ckpt.load_manifest(manifest.checkpoint_id)
    assert corrupt.value.path == path
    await ckpt.store.put(path, body.replace(b'"version": 2', b'"version": 9'))
    with pytest.raises(UnsupportedManifestVersionError) as unsupported:
        await ckpt.load_manifest(manifest.checkpoint_id)
    assert unsupported.value.version == 9 and unsupported.value.path == path


async def test_manifest_entries_cannot_escape_their_checkpoint(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    path = ckpt.paths.manifest(manifest.checkpoint_id)
    body = bytes((await ckpt.store.get(path)).data)
    body = re.sub(rb',\n  "manifest_sha256": "[0-9a-f]{64}"', b"", body)  # as the reference does
    for evil in ("../../_latest", "/etc/passwd", "operators/../../x"):
        [(_, entry)] = manifest.partition_entries()
        await ckpt.store.put(path, body.replace(entry.path.encode(), evil.encode()))
        with pytest.raises(CorruptManifestError, match="climb out|relative"):
            await ckpt.load(manifest.checkpoint_id)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    operator=st.text(
        st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/\\"),
        min_size=1,
        max_size=20,
    ).filter(lambda s: s not in (".", "..")),
    source=st.sampled_from(["kafka topic", "100%", "ünïcødé", "a b%20c", "~!@#$&*()"]),
    partition=st.integers(0, 2**32 - 1),
)
async def test_names_round_trip_exactly(
    ckpt: ObjectStoreCheckpointer, operator: str, source: str, partition: int
) -> None:
    payload = f"{operator}|{partition}".encode()
    offsets = {source: SourceOffsetEntry("t", {operator: source}, 1)}
    data = CheckpointData(
        epoch=1, snapshots={(operator, partition): payload}, source_offsets=offsets
    )
    await ckpt.save(data)
    assert data.id in await ckpt.list_checkpoints()
    loaded = await ckpt.load(data.id)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {(operator, partition): payload}
    assert loaded.source_offsets == offsets
    await ckpt.delete_checkpoint(data.id)
    assert data.id not in await ckpt.list_checkpoints()


@pytest.mark.parametrize(
    ("operator", "partition"),
    [
        ("", 0),
        (".", 0),
        ("..", 0),
        ("a/b", 0),
        ("a\\b", 0),
        ("tab\there", 0),
        ("x" * 256, 0),
        ("ok", -1),
        ("ok", 2**32),
        ("ok", True),
        ("ok", "0"),
    ],
)
async def test_invalid_names_are_refused_and_write_nothing(
    ckpt: ObjectStoreCheckpointer, operator: str, partition: int
) -> None:
    with pytest.raises(InvalidNameError) as info:
        await ckpt.save_snapshot(CheckpointId.now(), operator, partition, b"x")
    assert isinstance(info.value, ValueError)
    assert repr(operator if info.value.kind == "operator" else partition) in str(info.value)
    assert await all_paths(ckpt) == []


async def test_concurrency_bound_is_observed(raw_store: ObjectStore) -> None:
    counting = FaultyStore(ObstoreStore(raw_store), FaultPlan(latency=0.01))
    ckpt = make_checkpointer(counting, max_concurrent_uploads=3)
    uploads = [("op", p, False, bytes([p]) * 1000) for p in range(20)]
    await ckpt.save_partitions_concurrent(CheckpointId.now(), uploads)
    assert counting.ops["put"] == 20 + 1  # and the lease's intent, beside the uploads
    assert counting.peak_by_op["put"] == 3 + 1


async def test_one_failing_upload_cancels_the_others(raw_store: ObjectStore) -> None:
    faulty = FaultyStore(
        ObstoreStore(raw_store), FaultPlan(latency=0.05, fail_puts_matching="partition-2.")
    )
    ckpt = make_checkpointer(faulty, max_concurrent_uploads=4)
    uploads = [("op", p, False, b"x") for p in range(40)]
    with pytest.raises(StoreError, match="partition-2"):
        await ckpt.save_partitions_concurrent(CheckpointId.now(), uploads)
    # The failing upload is the 3rd; with 4 in flight, the rest of the 40 never start.
    assert faulty.ops["put"] < 10
    assert faulty.in_flight == 0


async def test_failed_save_leaves_nothing_visible(raw_store: ObjectStore) -> None:
    """A pack's upload fails; the partitions uploaded whole (streams) are removed too."""
    faulty = FaultyStore(ObstoreStore(raw_store), FaultPlan(fail_puts_matching="/packs/"))
    ckpt = make_checkpointer(faulty)
    snapshots: dict[tuple[str, int], Any] = {("op", p): b"x" for p in range(6)}
    snapshots.update({("stream", p): io.BytesIO(b"y") for p in range(3)})
    data = CheckpointData(epoch=1, snapshots=snapshots)
    with pytest.raises(StoreError):
        await ckpt.save(data)
    assert await ckpt.list_checkpoints() == []
    assert await ckpt.read_latest() is None
    assert await all_paths(ckpt) == [], "a failed save cleans up what it uploaded"


async def test_retries_stop_at_the_policy_bound(raw_store: ObjectStore) -> None:
    faulty = FaultyStore(ObstoreStore(raw_store), FaultPlan(transient_burst=100))
    # Paths given: the one call is read_latest's (choosing a layout lists twice).
    ckpt = ObjectStoreCheckpointer(faulty, CheckpointPaths(""), retry=FAST_RETRY)
    with pytest.raises(TransientStoreError):
        await ckpt.read_latest()
    assert faulty.calls == FAST_RETRY.attempts


async def test_transient_faults_within_the_bound_are_invisible(raw_store: ObjectStore) -> None:
    faulty = FaultyStore(ObstoreStore(raw_store), FaultPlan(transient_burst=2))
    ckpt = make_checkpointer(faulty)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    assert (await ckpt.load(manifest.checkpoint_id)).manifest == manifest


async def test_concurrent_saves_on_one_checkpointer(ckpt: ObjectStoreCheckpointer) -> None:
    datas = [CheckpointData(epoch=e, snapshots={("op", 0): bytes([e])}) for e in range(6)]
    await asyncio.gather(*(ckpt.save(d) for d in datas))
    assert await ckpt.list_checkpoints() == sorted(d.id for d in datas)
    assert await ckpt.read_latest() == datas[-1].id


async def test_exists_and_a_kept_timestamp(ckpt: ObjectStoreCheckpointer) -> None:
    data = CheckpointData(epoch=1, timestamp_ms=1_600_000_000_000)
    assert not await ckpt.exists(data.id)
    manifest = await ckpt.save(data)
    assert await ckpt.exists(data.id)
    assert manifest.timestamp_ms == 1_600_000_000_000
    assert (await ckpt.load_manifest(data.id)).timestamp_ms == 1_600_000_000_000
