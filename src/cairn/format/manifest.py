"""The manifest: the commit record of one checkpoint, its types and its JSON. Pure: no I/O.

A manifest says which artifacts a checkpoint is made of, with their sizes and SHA-256
digests, the source offsets to resume from, and the chain it extends. Its exact
encoding, and what a reader checks, is specified in docs/format.md, section "The
manifest". This module is its public face: the types (from ``_schema``), the codec
(``_codec``), manifest parts (``_parts``) and validation (``_checks``), and the limits
below, which every call reads when it runs.

Invariants:

* decoding is strict: anything that is not a well-formed manifest raises
  :class:`~cairn.errors.CorruptManifestError` (or its subclass
  :class:`~cairn.errors.UnsupportedManifestVersionError`; with keys,
  :class:`~cairn.errors.SignatureError`) naming the path it was read from, so a reader
  can skip the checkpoint and fall back; nothing half-valid is returned;
* the same manifest always encodes to the same bytes, and a manifest that does not use
  an optional field encodes byte for byte the same as one without the field;
* no manifest or part over :data:`MAX_MANIFEST_BYTES` is written, and none is parsed.
"""

from __future__ import annotations

from cairn.errors import InvalidInputError
from cairn.format import _codec, _parts, _schema
from cairn.format._buffer import Buffer

# Explicit re-exports: the types and limits _schema.__all__ names, public here (see
# __all__), and names other modules of cairn import from here, outside __all__.
from cairn.format._checks import check_entry as check_entry
from cairn.format._checks import check_manifest as check_manifest
from cairn.format._checks import check_relative_file as check_relative_file
from cairn.format._checks import check_source_offset as check_source_offset
from cairn.format._codec import HeaderPart, ManifestHeader
from cairn.format._codec import dec_hook as dec_hook
from cairn.format._codec import decode_record as decode_record
from cairn.format._codec import enc_hook as enc_hook
from cairn.format._parts import EncodedManifest, assemble, part_of
from cairn.format._schema import MANIFEST_VERSION as MANIFEST_VERSION
from cairn.format._schema import MAX_INT64 as MAX_INT64
from cairn.format._schema import MAX_TIMESTAMP_MS as MAX_TIMESTAMP_MS
from cairn.format._schema import SUPPORTED_VERSIONS as SUPPORTED_VERSIONS
from cairn.format._schema import CheckpointManifest as CheckpointManifest
from cairn.format._schema import DirectoryEntry as DirectoryEntry
from cairn.format._schema import FileEntry as FileEntry
from cairn.format._schema import KeyGroupEntry as KeyGroupEntry
from cairn.format._schema import ManifestPart as ManifestPart
from cairn.format._schema import OperatorSnapshotEntry as OperatorSnapshotEntry
from cairn.format._schema import PartitionSnapshotEntry as PartitionSnapshotEntry
from cairn.format._schema import SaveStats as SaveStats
from cairn.format._schema import SourceOffsetEntry as SourceOffsetEntry
from cairn.format._schema import StoreRequests as StoreRequests
from cairn.format._schema import chain_order as chain_order
from cairn.format.signing import SigningKeys

__all__ = [
    "MAX_MANIFEST_BYTES",
    "CheckpointManifestV2",
    "EncodedManifest",
    "HeaderPart",
    "ManifestHeader",
    "assemble",
    "decode_header",
    "decode_manifest",
    "decode_part",
    "decode_root",
    "encode_manifest",
    "encode_stored",
    "part_of",
]
__all__ += _schema.__all__

MAX_MANIFEST_BYTES = 64 * 2**20
"""The largest manifest cairn writes or reads: 64 MiB.

An entry takes about 250 bytes (420 for a carried, compressed delta), so this holds
some 150,000 restore-chain links: 20,000 partitions with chains of seven. Decoding one
takes a few times its size in memory at peak (its bytes, then the entries); the bound
keeps a damaged or hostile manifest from costing more, and is checked before any byte
is parsed."""

INLINE_BELOW = 64
"""An operator with fewer entries than this (or than the part size, if smaller) keeps
them in the root of a manifest stored in parts: a part of its own would cost an object
to write, list and read, and its record in the root about as many bytes as an entry. A
DCP save of 4,096 ranks (an operator of one entry per rank) is so stored whole, not as
4,097 parts of one entry."""

PART_ENTRIES = 4096
"""The most artifact entries a manifest holds itself, and about the most a part holds.

A larger manifest is stored as a root and parts (see :func:`encode_stored`), so that a
reader of one partition reads and decodes the root and one part, not every entry of the
checkpoint (``python bench/bench_many_partitions.py`` measures ``load_chain`` of one
partition both ways)."""

CheckpointManifestV2 = CheckpointManifest
"""The reference's name for the version-2 manifest."""


def encode_manifest(manifest: CheckpointManifest, keys: SigningKeys | None = None) -> bytes:
    """The bytes stored at the manifest's path: :func:`encode_stored`'s ``root``.

    For a manifest of up to :data:`PART_ENTRIES` entries that is the whole manifest; a
    larger one also needs the parts that :func:`encode_stored` returns.
    """
    return encode_stored(manifest, keys).root


def encode_stored(
    manifest: CheckpointManifest,
    keys: SigningKeys | None = None,
    *,
    part_entries: int | None = None,
) -> EncodedManifest:
    """``manifest`` as stored: its root (human-readable, deterministic JSON ending with
    its own checksum, signed with the first of ``keys`` when given, see
    :mod:`cairn.format.signing`) and, when it has more than ``part_entries`` entries
    (:data:`PART_ENTRIES` unless given), its parts: each operator of at least
    :data:`INLINE_BELOW` entries has them cut into parts, in restore order, never
    splitting one partition's chain.

    Deterministic: the same manifest gives the same bytes. Raises
    :class:`~cairn.errors.InvalidCheckpointDataError` if the root or a part would exceed
    :data:`MAX_MANIFEST_BYTES`.
    """
    return _parts.encode_stored(
        manifest,
        keys,
        part_entries=PART_ENTRIES if part_entries is None else part_entries,
        inline_below=INLINE_BELOW,
        limit=MAX_MANIFEST_BYTES,
    )


def decode_manifest(path: str, data: Buffer, keys: SigningKeys | None = None) -> CheckpointManifest:
    """Parse and check the manifest bytes read from ``path``.

    Raises :class:`~cairn.errors.UnsupportedManifestVersionError` for another schema
    version and :class:`~cairn.errors.CorruptManifestError` for anything else that is
    not a valid manifest, including one over :data:`MAX_MANIFEST_BYTES` (refused before
    it is parsed). With ``keys``, a valid manifest that is not signed by one of them
    (unsigned, another key, a signature that does not verify) raises
    :class:`~cairn.errors.SignatureError`; without, the signature is not looked at. A
    root whose entries are in parts is not a whole manifest:
    :class:`~cairn.errors.InvalidInputError` (read it with :func:`decode_root` and
    :func:`assemble`, or :meth:`cairn.ObjectStoreCheckpointer.load_manifest`).
    """
    manifest = decode_root(path, data, keys)
    if manifest.parts:
        raise InvalidInputError(
            f"the manifest at {path!r} keeps its entries in {len(manifest.parts)} parts: "
            "decode it with decode_root and assemble (load_manifest does)"
        )
    return manifest


def decode_root(path: str, data: Buffer, keys: SigningKeys | None = None) -> CheckpointManifest:
    """:func:`decode_manifest` of the bytes at a manifest's path, as stored: a root
    with ``parts`` is returned with its operators' entry lists empty, once its part
    records are checked (see :func:`assemble`)."""
    return _codec.decode_root(path, data, keys, MAX_MANIFEST_BYTES)


def decode_header(path: str, data: Buffer, keys: SigningKeys | None = None) -> ManifestHeader:
    """The :class:`ManifestHeader` of the manifest bytes read from ``path``: the members
    that rank it, decoded alone, nothing else checked.

    Raises :class:`~cairn.errors.NewerFormatError` as :func:`decode_root` does (a
    manifest that requires a feature this cairn does not know, its checksum and, with
    ``keys``, its signature verified), and :class:`~cairn.errors.CorruptManifestError`
    when the header does not decode or the bytes are over :data:`MAX_MANIFEST_BYTES`.
    """
    return _codec.decode_header(path, data, keys, MAX_MANIFEST_BYTES)


def decode_part(
    root: CheckpointManifest, record: ManifestPart, path: str, data: Buffer
) -> tuple[PartitionSnapshotEntry, ...]:
    """The entries of the part ``record`` of ``root`` describes, from ``data`` read at
    store ``path``: exactly its recorded size and digest, of the root's checkpoint and
    the record's operator, as many entries as recorded, in restore order within its
    partition range. Anything else is a :class:`~cairn.errors.CorruptManifestError`
    naming ``path``."""
    return _parts.decode_part(root, record, path, data, MAX_MANIFEST_BYTES)
