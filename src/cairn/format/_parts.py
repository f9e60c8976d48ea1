"""Manifest parts: a large manifest stored as a root and parts, and put back together.

Invariant: every entry of a manifest stored in parts is in exactly one part, in restore
order, one partition's chain never split across two; the root records each part's
path, size and SHA-256, so the root's checksum and signature cover every entry, and a
part is used only when its bytes are exactly what the root records. See
docs/format.md, section "Manifest parts".
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from cairn.errors import (
    CorruptManifestError,
    InvalidCheckpointDataError,
    InvalidInputError,
    NewerFormatError,
)
from cairn.format._buffer import Buffer
from cairn.format._checks import check_manifest
from cairn.format._codec import (
    dec_hook,
    decode_record,
    enc_hook,
    encode_root,
    newer_features,
    peeked_id,
)
from cairn.format._schema import (
    CheckpointManifest,
    ManifestPart,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    chain_order,
)
from cairn.format.features import VERSION, entry_features, features_of
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.format.signing import SigningKeys

__all__ = ["EncodedManifest", "assemble", "decode_part", "encode_stored", "part_of"]


class EncodedManifest(NamedTuple):
    """A manifest ready to store: ``root`` at the manifest's path, each of ``parts``
    (relative path, bytes) in the checkpoint's directory before it, and ``manifest`` as
    a reader assembles it (entries in restore order, ``parts`` set)."""

    manifest: CheckpointManifest
    root: bytes
    parts: tuple[tuple[str, bytes], ...]


def encode_stored(
    manifest: CheckpointManifest,
    keys: SigningKeys | None,
    *,
    part_entries: int,
    inline_below: int,
    limit: int,
) -> EncodedManifest:
    """``manifest`` as stored: its root and, when it has more than ``part_entries``
    entries, its parts of about that many, an operator of fewer than ``inline_below``
    entries staying in the root; the root or a part over ``limit`` bytes is an
    :class:`InvalidCheckpointDataError`. See :func:`cairn.format.manifest.encode_stored`.
    """
    entries = sum(len(op.partitions) for op in manifest.operators.values())
    if entries <= part_entries:
        whole = msgspec.structs.replace(manifest, parts=()) if manifest.parts else manifest
        return EncodedManifest(whole, encode_root(whole, keys, limit, features_of(whole)), ())
    operators: dict[str, OperatorSnapshotEntry] = {}
    records: list[ManifestPart] = []
    blobs: list[tuple[str, bytes]] = []
    inline_below = min(inline_below, part_entries)
    for operator, entry in sorted(manifest.operators.items()):
        ordered = tuple(sorted(entry.partitions, key=chain_order))
        operators[operator] = OperatorSnapshotEntry(ordered, entry.total_bytes)
        if len(ordered) < inline_below:
            continue  # stays in the root
        for chunk in _chunks(ordered, part_entries):
            body = _encode_part(manifest.checkpoint_id, operator, chunk)
            _check_part_size(manifest, len(body), limit)
            digest = hashlib.sha256(body).hexdigest()
            path = CheckpointPaths.relative_manifest_part(digest)
            records.append(
                ManifestPart(
                    path=path,
                    operator=operator,
                    first_partition=chunk[0].partition_id,
                    last_partition=chunk[-1].partition_id,
                    entries=len(chunk),
                    size_bytes=len(body),
                    sha256=digest,
                )
            )
            blobs.append((path, body))
    if not records:  # every operator stays in the root: the manifest is stored whole
        whole = msgspec.structs.replace(manifest, operators=operators, parts=())
        return EncodedManifest(whole, encode_root(whole, keys, limit, features_of(whole)), ())
    parts = tuple(records)
    parted = {record.operator for record in records}
    root = msgspec.structs.replace(
        manifest,
        operators={
            op: OperatorSnapshotEntry(() if op in parted else e.partitions, e.total_bytes)
            for op, e in operators.items()
        },
        parts=parts,
    )
    assembled = msgspec.structs.replace(manifest, operators=operators, parts=parts)
    encoded = encode_root(root, keys, limit, features_of(assembled))
    return EncodedManifest(assembled, encoded, tuple(blobs))


def _chunks(
    ordered: tuple[PartitionSnapshotEntry, ...], size: int
) -> list[tuple[PartitionSnapshotEntry, ...]]:
    """``ordered`` cut into runs of about ``size`` entries, never inside one partition's
    chain (a chain longer than ``size`` is a run of its own)."""
    chunks: list[tuple[PartitionSnapshotEntry, ...]] = []
    start = 0
    while start < len(ordered):
        end = min(start + size, len(ordered))
        # Back up to the start of the partition the cut would split...
        while (
            end < len(ordered)
            and end > start
            and (ordered[end].partition_id == ordered[end - 1].partition_id)
        ):
            end -= 1
        if end == start:  # ... unless that partition alone is longer: then past its end
            end = start + size
            while end < len(ordered) and ordered[end].partition_id == ordered[end - 1].partition_id:
                end += 1
        chunks.append(ordered[start:end])
        start = end
    return chunks


def _check_part_size(manifest: CheckpointManifest, size: int, limit: int) -> None:
    if size > limit:
        raise InvalidCheckpointDataError(
            f"a manifest part of checkpoint {manifest.checkpoint_id} would be {size} bytes, "
            f"over the limit of {limit} bytes: one partition's chain is too "
            "long; save a full snapshot of it to shorten it"
        )


class _PartBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A manifest part as stored: whose entries, of which operator, and the features
    those entries use, with the version of the cairn that wrote them."""

    checkpoint_id: CheckpointId
    operator: str
    partitions: tuple[PartitionSnapshotEntry, ...]
    requires: tuple[str, ...] = ()
    written_by: str | None = None


class _PartPeek(msgspec.Struct):
    """The members of a part a reader looks at before decoding it strictly, any type."""

    checkpoint_id: Any = None
    requires: Any = ()
    written_by: Any = None


_part_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
_part_decoder = msgspec.json.Decoder(_PartBody, dec_hook=dec_hook)
_part_peek_decoder = msgspec.json.Decoder(_PartPeek)


def _encode_part(
    checkpoint_id: CheckpointId, operator: str, entries: tuple[PartitionSnapshotEntry, ...]
) -> bytes:
    """Compact JSON of a part holding ``entries`` of ``operator``, with a final newline."""
    requires = tuple(sorted(entry_features(entries)))
    written_by = VERSION if requires else None
    body = _PartBody(checkpoint_id, operator, entries, requires, written_by)
    return _part_encoder.encode(body) + b"\n"


def decode_part(
    root: CheckpointManifest, record: ManifestPart, path: str, data: Buffer, limit: int
) -> tuple[PartitionSnapshotEntry, ...]:
    """The entries of the part ``record`` of ``root`` describes, from ``data`` read at
    store ``path``: exactly its recorded size and digest, of the root's checkpoint and
    the record's operator, as many entries as recorded, in restore order within its
    partition range. Anything else is a :class:`CorruptManifestError` naming ``path``,
    but a part that requires features this cairn does not know: :class:`NewerFormatError`
    (its bytes are those the root records)."""
    size = memoryview(data).nbytes
    if size != record.size_bytes:
        raise CorruptManifestError(
            path, f"it is {size} bytes, not the {record.size_bytes} recorded"
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != record.sha256:
        raise CorruptManifestError(path, f"part checksum mismatch: {digest} != {record.sha256}")
    peek = decode_record(_part_peek_decoder, path, data, "manifest part", limit)
    unknown, written_by = newer_features(path, peek.requires, peek.written_by)
    if unknown:
        raise NewerFormatError(path, peeked_id(peek.checkpoint_id), unknown, written_by)
    body = decode_record(_part_decoder, path, data, "manifest part", limit)
    entries = body.partitions
    if body.checkpoint_id != root.checkpoint_id or body.operator != record.operator:
        raise CorruptManifestError(
            path,
            f"it holds entries of {body.operator!r} in {body.checkpoint_id}, not of "
            f"{record.operator!r} in {root.checkpoint_id}",
        )
    if (
        len(entries) != record.entries
        or entries[0].partition_id != record.first_partition
        or entries[-1].partition_id != record.last_partition
        or any(chain_order(a) > chain_order(b) for a, b in itertools.pairwise(entries))
    ):
        raise CorruptManifestError(
            path,
            f"its entries are not the {record.entries} of partitions "
            f"{record.first_partition}..{record.last_partition} in restore order",
        )
    return entries


def part_of(root: CheckpointManifest, operator: str, partition: int) -> ManifestPart | None:
    """The part of ``root`` that holds ``partition`` of ``operator``; None if none does."""
    for part in root.parts:
        if part.operator == operator and part.first_partition <= partition <= part.last_partition:
            return part
    return None


def assemble(
    path: str,
    root: CheckpointManifest,
    entries: Sequence[tuple[ManifestPart, tuple[PartitionSnapshotEntry, ...]]],
) -> CheckpointManifest:
    """``root`` (read at ``path``) with the entries of its parts put back, each as
    :func:`decode_part` returned it, checked as a whole (:class:`CorruptManifestError`
    naming ``path`` otherwise). Given every part, that is the manifest that was
    written; given some, a manifest of those parts' partitions and of the operators
    the root holds itself."""
    gathered: dict[str, list[PartitionSnapshotEntry]] = {}
    for record, part_entries in entries:
        gathered.setdefault(record.operator, []).extend(part_entries)
    whole = len(entries) == len(root.parts)
    operators = {
        op: OperatorSnapshotEntry(tuple(gathered.get(op, entry.partitions)), entry.total_bytes)
        for op, entry in root.operators.items()
        if whole or op in gathered or entry.partitions
    }
    manifest = msgspec.structs.replace(root, operators=operators)
    try:
        check_manifest(manifest, stored=True)
    except InvalidInputError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    return manifest
