"""Manifest types and their JSON codec. Pure: no I/O.

A manifest is the commit record of one checkpoint: which artifacts it is made of, with
their sizes and SHA-256 digests, the source offsets to resume from, and the chain it
extends. Invariants kept here:

* decoding is strict: anything that is not a well-formed version-2 manifest raises
  :class:`CorruptManifestError` (or :class:`UnsupportedManifestVersionError`) naming the
  path it was read from; nothing half-valid is returned;
* every entry path is relative to the checkpoint directory of the checkpoint that owns
  the bytes (``owner``, or this checkpoint when ``owner`` is None) and cannot climb out;
* optional fields have defaults and are omitted from the JSON when unset, so manifests
  written without them (older writers) still load;
* every manifest cairn writes ends with ``"manifest_sha256"``: the SHA-256 of the exact
  file bytes with that value zeroed. Any changed byte (content, key or white space) is
  detected on read, and unknown fields are refused, so a flipped key cannot hide the
  checksum. Manifests without it (the reference's, or older writers') still load.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

import msgspec

from cairn._buffer import Buffer
from cairn.errors import CorruptManifestError, InvalidInputError, UnsupportedManifestVersionError
from cairn.ids import CheckpointId
from cairn.layout import validate_name, validate_partition, validate_relative_path

__all__ = [
    "MANIFEST_VERSION",
    "CheckpointManifest",
    "CheckpointManifestV2",
    "OperatorSnapshotEntry",
    "PartitionSnapshotEntry",
    "SourceOffsetEntry",
    "decode_manifest",
    "encode_manifest",
]

MANIFEST_VERSION = 2
SUPPORTED_VERSIONS = (2,)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class PartitionSnapshotEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One stored artifact of an operator partition.

    ``path`` is relative to the checkpoint directory of ``owner`` (the checkpoint whose
    upload holds the bytes; None means the manifest's own checkpoint). ``sha256`` and
    ``size_bytes`` describe the bytes the caller handed in; ``codec`` names how they are
    encoded in the store (None: stored as given).
    """

    partition_id: int
    is_delta: bool
    path: str
    size_bytes: int
    sha256: str
    owner: CheckpointId | None = None
    codec: str | None = None
    stored_size_bytes: int | None = None


def chain_order(entry: PartitionSnapshotEntry) -> tuple[int, bool, int]:
    """Sort key putting each partition's chain in restore order.

    By partition, then the base snapshot before the deltas, then deltas oldest first: an
    entry owned by an earlier checkpoint (a smaller, time-ordered id) comes first, and
    the manifest's own entry (``owner`` None) last.
    """
    owner_order = entry.owner.uuid.int if entry.owner is not None else 1 << 128
    return (entry.partition_id, entry.is_delta, owner_order)


class OperatorSnapshotEntry(msgspec.Struct, frozen=True):
    """The partitions stored for one operator, and their total size in bytes."""

    partitions: tuple[PartitionSnapshotEntry, ...] = ()
    total_bytes: int = 0

    @classmethod
    def from_partitions(cls, partitions: list[PartitionSnapshotEntry]) -> OperatorSnapshotEntry:
        """An entry whose partitions are sorted by id and whose total is their sum."""
        return cls(
            partitions=tuple(sorted(partitions, key=chain_order)),
            total_bytes=sum(p.size_bytes for p in partitions),
        )


class SourceOffsetEntry(msgspec.Struct, frozen=True):
    """Where a source should resume: its type, per-split offsets, and the epoch they match."""

    source_type: str
    offsets: dict[str, str] = {}
    epoch: int = 0


class CheckpointManifest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The commit record of one checkpoint (schema version 2)."""

    version: int
    checkpoint_id: CheckpointId
    epoch: int
    timestamp_ms: int
    operators: dict[str, OperatorSnapshotEntry] = {}
    source_offsets: dict[str, SourceOffsetEntry] = {}
    parent_id: CheckpointId | None = None
    watermark: int | None = None
    total_size_bytes: int = 0
    writer_generation: int | None = None

    @classmethod
    def new(cls, checkpoint_id: CheckpointId, epoch: int) -> CheckpointManifest:
        """An empty manifest for ``checkpoint_id`` at ``epoch``, stamped with the current time."""
        return cls(
            version=MANIFEST_VERSION,
            checkpoint_id=checkpoint_id,
            epoch=epoch,
            timestamp_ms=time.time_ns() // 10**6,
        )

    def partition_entries(self) -> list[tuple[str, PartitionSnapshotEntry]]:
        """Every ``(operator, entry)`` pair of this manifest, in a stable order."""
        return [(op, p) for op, entry in sorted(self.operators.items()) for p in entry.partitions]


CheckpointManifestV2 = CheckpointManifest
"""The reference's name for the version-2 manifest."""

_ZERO_DIGEST = "0" * 64


class _StoredManifest(CheckpointManifest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The manifest as stored: with the checksum of its own bytes, which is not public."""

    manifest_sha256: str | None = None


def _checksum_field(digest: str) -> bytes:
    return b'"manifest_sha256": "' + digest.encode() + b'"'


class _VersionProbe(msgspec.Struct):
    version: Any = msgspec.UNSET


def enc_hook(value: object) -> object:
    """msgspec encoding of the types cairn adds (a CheckpointId is its text)."""
    if isinstance(value, CheckpointId):
        return str(value)
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def dec_hook(kind: type, value: object) -> object:
    """msgspec decoding of the types cairn adds; an invalid id is a validation error."""
    if kind is CheckpointId and isinstance(value, str):
        return CheckpointId.parse(value)  # InvalidInputError is a ValueError: msgspec reports it
    raise NotImplementedError(f"cannot decode {kind!r}")


_encoder = msgspec.json.Encoder(enc_hook=enc_hook, order="deterministic")
_decoder = msgspec.json.Decoder(_StoredManifest, dec_hook=dec_hook)
_probe_decoder = msgspec.json.Decoder(_VersionProbe)


def encode_manifest(manifest: CheckpointManifest) -> bytes:
    """Human-readable, deterministic JSON of ``manifest``, ending with its own checksum."""
    fields = msgspec.structs.asdict(manifest)
    stored = _StoredManifest(**fields, manifest_sha256=_ZERO_DIGEST)
    body = msgspec.json.format(_encoder.encode(stored), indent=2) + b"\n"
    placeholder = _checksum_field(_ZERO_DIGEST)
    return body.replace(placeholder, _checksum_field(hashlib.sha256(body).hexdigest()))


def decode_manifest(path: str, data: Buffer) -> CheckpointManifest:
    """Parse and check the manifest bytes read from ``path``.

    Raises :class:`UnsupportedManifestVersionError` for another schema version and
    :class:`CorruptManifestError` for anything else that is not a valid manifest.
    """
    try:
        probe = _probe_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"not a JSON object: {exc}") from None
    if probe.version is msgspec.UNSET:
        raise CorruptManifestError(path, "no 'version' field")
    if probe.version not in SUPPORTED_VERSIONS or isinstance(probe.version, bool):
        raise UnsupportedManifestVersionError(path, probe.version, SUPPORTED_VERSIONS)
    try:
        stored = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    if stored.manifest_sha256 is not None:
        _verify_checksum(path, bytes(data), stored.manifest_sha256)
    fields = msgspec.structs.asdict(stored)
    del fields["manifest_sha256"]
    manifest = CheckpointManifest(**fields)
    try:
        check_manifest(manifest)
    except InvalidInputError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    return manifest


def _verify_checksum(path: str, body: bytes, digest: str) -> None:
    field = _checksum_field(digest)
    if not _SHA256_HEX.fullmatch(digest) or body.count(field) != 1:
        raise CorruptManifestError(path, "its manifest_sha256 field is damaged")
    actual = hashlib.sha256(body.replace(field, _checksum_field(_ZERO_DIGEST))).hexdigest()
    if actual != digest:
        raise CorruptManifestError(path, f"manifest checksum mismatch: {actual} != {digest}")


def check_manifest(manifest: CheckpointManifest) -> None:
    """Raise :class:`InvalidInputError` if ``manifest`` is not internally consistent."""
    if manifest.epoch < 0:
        raise InvalidInputError(f"negative epoch {manifest.epoch}")
    for source, offset in manifest.source_offsets.items():
        validate_name("source", source)
        if not isinstance(offset.source_type, str):
            raise InvalidInputError(f"source {source!r} has no source_type")
    seen_paths: set[tuple[CheckpointId | None, str]] = set()
    for operator, entry in manifest.operators.items():
        validate_name("operator", operator)
        snapshots: set[int] = set()
        for part in entry.partitions:
            validate_partition(part.partition_id)
            validate_relative_path(part.path)
            if not part.is_delta:
                if part.partition_id in snapshots:
                    raise InvalidInputError(
                        f"operator {operator!r} has two snapshots of partition {part.partition_id}"
                    )
                snapshots.add(part.partition_id)
            if (part.owner, part.path) in seen_paths:
                raise InvalidInputError(f"two entries share the path {part.path!r}")
            seen_paths.add((part.owner, part.path))
            if part.size_bytes < 0 or (part.stored_size_bytes or 0) < 0:
                raise InvalidInputError(f"negative size for {part.path!r}")
            if not _SHA256_HEX.fullmatch(part.sha256):
                raise InvalidInputError(f"not a SHA-256 hex digest for {part.path!r}")
            if part.owner is not None and part.owner == manifest.checkpoint_id:
                raise InvalidInputError(f"entry {part.path!r} names its own checkpoint as owner")
