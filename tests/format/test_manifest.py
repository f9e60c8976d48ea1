"""Manifest types and their JSON codec."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cairn import (
    CheckpointId,
    CheckpointManifest,
    CorruptManifestError,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SourceOffsetEntry,
    UnsupportedManifestVersionError,
)
from cairn.format.manifest import CheckpointManifestV2, decode_manifest, encode_manifest

CID = CheckpointId.parse("01900000-0000-7000-8000-000000000001")
PARENT = CheckpointId.parse("01900000-0000-7000-8000-000000000000")
DIGEST = "ab" * 32


def full_manifest() -> CheckpointManifest:
    part = PartitionSnapshotEntry(0, False, "operators/agg/partition-0.snap", 10, DIGEST)
    return CheckpointManifest(
        version=2,
        checkpoint_id=CID,
        epoch=4,
        timestamp_ms=1_700_000_000_000,
        operators={"agg": OperatorSnapshotEntry((part,), 10)},
        source_offsets={"kafka": SourceOffsetEntry("kafka", {"p0": "12"}, 4)},
        parent_id=PARENT,
        watermark=99,
        total_size_bytes=10,
    )


def editable(manifest: CheckpointManifest) -> dict[str, Any]:
    """The manifest as a JSON dict without its checksum, to test the other checks."""
    body: dict[str, Any] = json.loads(encode_manifest(manifest))
    del body["manifest_sha256"]
    return body


def test_round_trip_is_exact_and_human_readable() -> None:
    manifest = full_manifest()
    body = encode_manifest(manifest)
    assert decode_manifest("m", body) == manifest
    assert b'\n  "epoch": 4' in body, "indented, one field a line"
    assert json.loads(body)["checkpoint_id"] == str(CID)
    assert CheckpointManifestV2 is CheckpointManifest


def test_new_fills_version_and_timestamp() -> None:
    manifest = CheckpointManifest.new(CID, 3)
    assert manifest.version == 2 and manifest.epoch == 3 and manifest.timestamp_ms > 0
    assert manifest.operators == {} and manifest.parent_id is None


def test_manifest_without_optional_fields_still_loads() -> None:
    minimal = {
        "version": 2,
        "checkpoint_id": str(CID),
        "epoch": 1,
        "timestamp_ms": 5,
        "operators": {
            "op": {
                "partitions": [
                    {
                        "partition_id": 0,
                        "is_delta": False,
                        "path": "operators/op/partition-0.snap",
                        "size_bytes": 3,
                        "sha256": DIGEST,
                    }
                ],
                "total_bytes": 3,
            }
        },
    }
    manifest = decode_manifest("m", json.dumps(minimal).encode())
    assert manifest.source_offsets == {} and manifest.watermark is None
    assert manifest.parent_id is None and manifest.total_size_bytes == 0


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"", "not a JSON"),
        (b"{", "not a JSON"),
        (b"[]", "not a JSON"),
        (b"{}", "version"),
        (b'{"version": 2}', "checkpoint_id"),
        (b'{"version": 2, "checkpoint_id": "nope", "epoch": 1, "timestamp_ms": 1}', "checkpoint"),
        (
            b'{"version": 2, "checkpoint_id": "01900000-0000-7000-8000-000000000001",'
            b' "epoch": -1, "timestamp_ms": 1}',
            "negative epoch",
        ),
    ],
)
def test_corrupt_manifests_raise_naming_the_path(body: bytes, match: str) -> None:
    with pytest.raises(CorruptManifestError, match=match) as info:
        decode_manifest("ckpt/x/manifest.json", body)
    assert info.value.path == "ckpt/x/manifest.json"


def test_truncated_manifest_is_corrupt() -> None:
    body = encode_manifest(full_manifest())
    for cut in range(1, len(body) - 2, 7):
        with pytest.raises(CorruptManifestError):
            decode_manifest("m", body[:cut])


@pytest.mark.parametrize("version", [1, 3, "2", None, True])
def test_other_versions_are_unsupported(version: object) -> None:
    body = editable(full_manifest())
    body["version"] = version
    with pytest.raises(UnsupportedManifestVersionError) as info:
        decode_manifest("m", json.dumps(body).encode())
    assert info.value.version == version


@pytest.mark.parametrize("path", ["../../_latest", "/abs/path", "operators/../../../x", "a//b"])
def test_entry_paths_that_escape_are_rejected(path: str) -> None:
    body = editable(full_manifest())
    body["operators"]["agg"]["partitions"][0]["path"] = path
    with pytest.raises(CorruptManifestError, match="relative|climb out"):
        decode_manifest("m", json.dumps(body).encode())


def test_bad_digest_and_duplicate_snapshots_are_rejected() -> None:
    body = editable(full_manifest())
    body["operators"]["agg"]["partitions"][0]["sha256"] = "xyz"
    with pytest.raises(CorruptManifestError, match="SHA-256"):
        decode_manifest("m", json.dumps(body).encode())
    body = editable(full_manifest())
    part = body["operators"]["agg"]["partitions"][0]
    body["operators"]["agg"]["partitions"].append(dict(part, path="operators/agg/other.snap"))
    with pytest.raises(CorruptManifestError, match="two snapshots"):
        decode_manifest("m", json.dumps(body).encode())


def test_types_are_frozen() -> None:
    manifest = full_manifest()
    with pytest.raises(AttributeError):
        manifest.epoch = 5  # type: ignore[misc]


def test_any_changed_byte_of_a_manifest_is_detected() -> None:
    body = encode_manifest(full_manifest())
    for index in range(len(body)):
        for replacement in {body[index] ^ 0x01, ord(" "), ord("\t"), ord("0")} - {body[index]}:
            damaged = bytearray(body)
            damaged[index] = replacement
            with pytest.raises(CorruptManifestError):
                decode_manifest("m", bytes(damaged))


def test_unknown_fields_are_refused() -> None:
    body = editable(full_manifest())
    body["surprise"] = 1
    with pytest.raises(CorruptManifestError, match="surprise"):
        decode_manifest("m", json.dumps(body).encode())


PUBLIC_MANIFEST_NAMES = {
    "MANIFEST_VERSION",
    "MAX_INT64",
    "MAX_MANIFEST_BYTES",
    "MAX_TIMESTAMP_MS",
    "CheckpointManifest",
    "CheckpointManifestV2",
    "DirectoryEntry",
    "EncodedManifest",
    "FileEntry",
    "KeyGroupEntry",
    "HeaderPart",
    "ManifestHeader",
    "ManifestPart",
    "OperatorSnapshotEntry",
    "PartitionSnapshotEntry",
    "SaveStats",
    "SourceOffsetEntry",
    "StoreRequests",
    "assemble",
    "decode_header",
    "decode_manifest",
    "decode_part",
    "decode_root",
    "encode_manifest",
    "encode_stored",
    "part_of",
}


def test_the_manifest_module_exports_each_type_of_its_schema_bound_to_the_same_object() -> None:
    from cairn.format import _schema, manifest

    assert set(manifest.__all__) == PUBLIC_MANIFEST_NAMES
    assert len(manifest.__all__) == len(PUBLIC_MANIFEST_NAMES)
    for name in _schema.__all__:
        assert getattr(manifest, name) is getattr(_schema, name), name
    for name in manifest.__all__:
        assert hasattr(manifest, name), name
