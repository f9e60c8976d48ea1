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
  written without them (older writers) still load, and a manifest without one (no
  ``stats``, no ``name``) is encoded byte for byte as before the field existed;
* every manifest cairn writes ends with ``"manifest_sha256"``: the SHA-256 of the exact
  file bytes with that value zeroed. Any changed byte (content, key or white space) is
  detected on read, and unknown fields are refused, so a flipped key cannot hide the
  checksum. Manifests without it (the reference's, or older writers') still load;
* a signed manifest (a writer with keys, see :mod:`cairn.format.signing`) has a ``"signature"``
  member just before ``"manifest_sha256"``, over the same bytes with its value emptied and
  the checksum zeroed; the checksum covers the signature. A reader with keys refuses a
  manifest that is not signed by one of them (:class:`SignatureError`); one without keys
  ignores the member. An unsigned manifest is exactly what cairn wrote before;
* a manifest is at most :data:`MAX_MANIFEST_BYTES`: larger is refused when encoding
  (:class:`InvalidCheckpointDataError`) and, before any parsing, when decoding;
* decoding never raises anything but :class:`CorruptManifestError` (and its subclass;
  with keys, :class:`SignatureError` too, also an :class:`IntegrityError`):
  a JSON value of the wrong type, nesting deep enough to exhaust the parser's stack,
  an integer outside what JSON readers in other languages can hold (epochs, sizes and
  generations are non-negative signed 64-bit integers, watermarks and source epochs
  signed ones), or a time ``datetime`` cannot show (after year 9999) is damage, so a
  reader can skip the checkpoint and fall back;
* an entry's ``path`` is exactly the layout's path for its operator, partition and kind
  (:meth:`CheckpointPaths.relative_artifact`), with or without the token of the save
  attempt that wrote it (the reference's schema documents the name without; cairn's own
  saves write the name with); any other path (one too long for a local file
  system, one through ``manifest.json``) would make a read fail as a store error
  instead of as damage;
* an entry with ``index_size_bytes`` (an object of ranges, :mod:`cairn.format.ranges`) has no
  codec and no offset (compressed ranges are marked in its index), and that many bytes
  at its end are the size of an index of whole records;
* an entry with an ``offset`` is a range of a pack (:meth:`CheckpointPaths.relative_pack`,
  which merges many small artifacts of one save into one object): its stored bytes are
  ``[offset, offset + stored length)`` of the object at ``path`` (stored length:
  ``stored_size_bytes`` when compressed, which such an entry must record, else
  ``size_bytes``), and its ``path`` must be a pack's; an entry without one is the whole
  object at its partition's path, as before packs. Entries share a path only when every
  one of them has an offset and no two of their ranges overlap; ``offset + stored
  length`` is at most :data:`MAX_INT64`. (cairn before packs reads an entry at a pack's
  path as damage, so it skips such a checkpoint and falls back to an older one);
* a manifest with more than :data:`PART_ENTRIES` artifact entries is stored as a root and
  parts (:func:`encode_stored`): each operator's entries, in restore order, go into
  parts of about :data:`PART_ENTRIES` entries each, never splitting one partition's
  chain (an operator of fewer than :data:`INLINE_BELOW` entries keeps them in the
  root), each part a compact JSON object at a path named by its SHA-256
  (:meth:`CheckpointPaths.relative_manifest_part`). The root is the manifest itself, the
  entry lists of its operators in parts empty, with a ``parts`` list of each part's path, operator,
  partition range, entry count, size and SHA-256: the root's checksum and signature
  cover the parts through their digests. :func:`decode_root` checks a root,
  :func:`decode_part` a part against its record in it, and :func:`assemble` puts the
  entries back, checking the whole as :func:`decode_manifest` does. A manifest of up to
  :data:`PART_ENTRIES` entries, or whose every operator stays in the root, is stored
  whole, byte for byte as before parts existed (cairn before parts reads a root as
  damage, so it skips such a checkpoint and falls back to an older one; cairn from
  before :data:`INLINE_BELOW` does the same with a root that holds some operators'
  entries itself);
* an entry's ``codec`` is one this cairn knows (:data:`cairn.format.codecs.CODECS`). A name it
  does not know (a newer writer's codec, or damage) makes the manifest unreadable here,
  like an unsupported schema version: :class:`CorruptManifestError`, so readers fall back.
  A known codec whose library is missing is not damage: the read raises
  :class:`CodecError` (install the extra) and the checkpoint is not skipped.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec

from cairn.errors import (
    CorruptManifestError,
    InvalidCheckpointDataError,
    InvalidInputError,
    SignatureError,
    UnsupportedManifestVersionError,
)
from cairn.format._buffer import Buffer
from cairn.format._validate import is_int
from cairn.format.codecs import CODECS
from cairn.format.ids import CheckpointId
from cairn.format.layout import (
    MAX_NAME_BYTES,
    MAX_PARTITION,
    CheckpointPaths,
    short_repr,
    validate_checkpoint_name,
    validate_name,
    validate_partition,
    validate_relative_path,
)
from cairn.format.ranges import is_index_size
from cairn.format.signing import ManifestSignature, SigningKeys, signature_field, well_formed

__all__ = [
    "MANIFEST_VERSION",
    "MAX_INT64",
    "MAX_MANIFEST_BYTES",
    "MAX_TIMESTAMP_MS",
    "CheckpointManifest",
    "CheckpointManifestV2",
    "DirectoryEntry",
    "EncodedManifest",
    "FileEntry",
    "ManifestPart",
    "OperatorSnapshotEntry",
    "PartitionSnapshotEntry",
    "SaveStats",
    "SourceOffsetEntry",
    "StoreRequests",
    "assemble",
    "decode_manifest",
    "decode_part",
    "decode_root",
    "encode_manifest",
    "encode_stored",
    "part_of",
]

_Record = TypeVar("_Record")

MANIFEST_VERSION = 2
SUPPORTED_VERSIONS = (2,)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

MAX_MANIFEST_BYTES = 64 * 2**20
"""The largest manifest cairn writes or reads: 64 MiB.

An entry takes about 250 bytes (420 for a carried, compressed delta), so this holds
some 150,000 restore-chain links: 20,000 partitions with chains of seven. Decoding one
takes about three times its size in memory at peak (its bytes, then the entries:
190 MiB for 63 MiB, measured); the bound keeps a damaged or hostile manifest from
costing more, and is checked before any byte is parsed."""

INLINE_BELOW = 64
"""An operator with fewer entries than this (or than the part size, if smaller) keeps
them in the root of a manifest stored in parts: a part of its own would cost an object
to write, list and read, and its record in the root about as many bytes as an entry. A
DCP save of 4,096 ranks (an operator of one entry per rank) is so stored whole, not as
4,097 parts of one entry."""

PART_ENTRIES = 4096
"""The most artifact entries a manifest holds itself, and about the most a part holds.

A larger manifest is stored as a root and parts (see the module docstring), so that a
reader of one partition reads the root and one part: ``load_chain`` of one of 100,000
partitions took 0.033 s, against 1.67 s with the same entries in one 27 MiB manifest
(``python bench/bench_many_partitions.py``, memory store). The root of that checkpoint
is 9 KiB and lists 25 parts."""

MAX_INT64 = 2**63 - 1
"""The largest epoch, size, generation or watermark: JSON readers in other languages
(Rust's serde, Java's Jackson, Go) hold integers in 64 bits."""

MAX_TIMESTAMP_MS = 253_402_300_799_999
"""The latest ``timestamp_ms``: 9999-12-31T23:59:59.999Z, the last time ``datetime`` shows."""


class PartitionSnapshotEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One stored artifact of an operator partition.

    ``path`` is relative to the checkpoint directory of ``owner`` (the checkpoint whose
    upload holds the bytes; None means the manifest's own checkpoint). ``sha256`` and
    ``size_bytes`` describe the bytes the caller handed in; ``codec`` names how they are
    encoded in the store (None: stored as given), and ``stored_size_bytes`` their size
    there when encoded. ``offset`` (None: the artifact is the whole object at ``path``)
    places it in a pack: its stored bytes are the :attr:`stored_length` bytes from
    ``offset`` of the object at ``path``, read with one ranged request.

    ``index_size_bytes`` is set on an object of ranges (:mod:`cairn.format.ranges`, a DCP
    rank's tensors): its last ``index_size_bytes`` bytes are an index of the ranges
    before them, each with its own SHA-256, and ``sha256`` is the digest of that index.

    ``used_bytes`` is set on an uncompressed entry carried from another checkpoint
    (``owner`` set) whose items this checkpoint reads as ranges of it (a DCP save that
    carried some of a parent's tensors): how many of its ``size_bytes`` those ranges
    take. It only
    informs the space report of GC (:attr:`~cairn.protocol.retention.GcPlan.pack_bytes`); the
    object is kept whole, and verified whole, whatever it says.
    """

    partition_id: int
    is_delta: bool
    path: str
    size_bytes: int
    sha256: str
    owner: CheckpointId | None = None
    codec: str | None = None
    stored_size_bytes: int | None = None
    offset: int | None = None
    index_size_bytes: int | None = None
    used_bytes: int | None = None

    @property
    def stored_length(self) -> int:
        """The bytes it takes in the store: ``stored_size_bytes`` when it is encoded and
        records it, else ``size_bytes``."""
        if self.codec is not None and self.stored_size_bytes is not None:
            return self.stored_size_bytes
        return self.size_bytes


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


class StoreRequests(msgspec.Struct, frozen=True, kw_only=True):
    """The store requests a save made, by kind (see :attr:`SaveStats.requests`).

    Each attempt the store saw counts, retried ones included; one call is one request of
    its kind: a multipart upload (``put_stream``) one ``put``, a delete of many paths
    (a batch) one ``delete``, and the HTTP retries obstore makes inside one call are not
    seen. Every key is written (no default is omitted), so a manifest shows all five.
    """

    put: int = 0
    get: int = 0
    head: int = 0
    list: int = 0
    delete: int = 0


class SaveStats(msgspec.Struct, frozen=True, kw_only=True):
    """How a checkpoint was made, as its save measured it (written in its manifest).

    ``duration_ms`` runs from the start of the save to just before its manifest write;
    ``upload_ms`` is the upload phase within it (artifacts and offsets, concurrently), and
    ``commit_ms`` what follows it up to the manifest write (the check that every artifact
    is present, the fence check, and for a background save its wait for the save before
    it, which keeps commits in call order). The manifest write and the pointer swap that follow
    cannot be measured in the record they write. ``uploaded_*`` count what this save
    sent (stored bytes, after compression); ``carried_*`` what it references from earlier
    checkpoints without sending it again (an artifact in a pack counts as one, with the
    bytes of its range; a DCP object carried in part, with the bytes of the ranges used);
    ``retries`` the store calls it retried.

    ``stored_bytes`` is what the save put in the store and left there: its own objects
    as stored (a pack once), plus its manifest and the manifest's parts. ``requests``
    counts the store requests it made up to its commit point: every request before the
    manifest is written, and the manifest's own writes (its parts and itself, one each).
    What follows cannot be in the record it follows (a retried manifest write, the
    intent's delete, the ``_latest`` swap), nor can a lease renewal that races the
    manifest write. A DCP save counts every rank's requests and retries.

    Both are :data:`msgspec.UNSET` (falsy) in manifests written before cairn recorded
    them, and then not written: UNSET, unlike a default, is omitted whatever the
    others do, so such statistics encode byte for byte as they were written (``retries``
    included, even 0). A reader ignores fields of the statistics it does not know
    (nothing here forbids them), so older cairn reads newer statistics.
    """

    duration_ms: int
    upload_ms: int
    commit_ms: int
    uploaded_bytes: int
    uploaded_artifacts: int
    carried_bytes: int
    carried_artifacts: int
    retries: int = 0
    stored_bytes: int | msgspec.UnsetType = msgspec.UNSET
    requests: StoreRequests | msgspec.UnsetType = msgspec.UNSET


class FileEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One regular file of a directory partition (see :class:`DirectoryEntry`).

    ``relative_path`` is the file's path inside the directory (``/``-separated);
    ``size_bytes`` and ``sha256`` describe its bytes, stored as they are (no codec) at
    ``path``, relative to the checkpoint directory of ``owner`` (None: this checkpoint;
    another id: carried from an earlier checkpoint by reference). ``mtime_ns`` is the
    file's modification time when it was saved: the hint by which a later incremental
    save carries it without reading it.
    """

    relative_path: str
    size_bytes: int
    sha256: str
    mtime_ns: int
    path: str
    owner: CheckpointId | None = None


class DirectoryEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """A partition saved as a directory: every regular file under it, by relative path."""

    operator: str
    partition_id: int
    files: tuple[FileEntry, ...] = ()

    @property
    def total_bytes(self) -> int:
        """The sum of its files' sizes."""
        return sum(f.size_bytes for f in self.files)


class ManifestPart(msgspec.Struct, frozen=True, kw_only=True):
    """Where some of a large manifest's entries are stored (see :func:`encode_stored`).

    ``path`` (relative to the checkpoint's directory) holds ``entries`` entries of
    ``operator``, every entry of each partition from ``first_partition`` to
    ``last_partition`` it has; ``size_bytes`` and ``sha256`` describe the part's bytes.
    """

    path: str
    operator: str
    first_partition: int
    last_partition: int
    entries: int
    size_bytes: int
    sha256: str


class CheckpointManifest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The commit record of one checkpoint (schema version 2).

    ``stats`` (optional; absent in manifests written before it existed) says how the
    checkpoint was made: see :class:`SaveStats`. ``name`` (optional) is a label the
    writer gave the checkpoint besides its id, such as the ``checkpoint_id`` a DCP save
    was given (``step-100``; see :mod:`cairn.torch`): several checkpoints may carry one
    name, and a name never replaces the id in the store's layout.
    """

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
    stats: SaveStats | None = None
    name: str | None = None
    directories: tuple[DirectoryEntry, ...] = ()
    parts: tuple[ManifestPart, ...] = ()

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

    def file_entries(self) -> list[tuple[DirectoryEntry, FileEntry]]:
        """Every file of every directory partition, with its directory."""
        return [(d, f) for d in self.directories for f in d.files]

    def own_objects(self) -> list[str]:
        """What this manifest names in its own checkpoint's directory, relative to it: its
        own uploads (each once) and the parts it is stored in."""
        own = [path for owner, path, _ in self.stored_objects() if owner is None]
        return own + [part.path for part in self.parts]

    def stored_objects(self) -> list[tuple[CheckpointId | None, str, int]]:
        """Every object this manifest names, once: ``(owner, path, stored size)``,
        partition artifacts first, then directory files (``owner`` None: this
        checkpoint's own).

        A pack that several entries name is listed once, where its first entry is, with
        the end of its furthest range as its size: the least it must hold (a pack carried
        from an earlier checkpoint may hold ranges this manifest does not name). Tell
        one from a whole object with :meth:`CheckpointPaths.is_pack`.
        """
        objects: list[tuple[CheckpointId | None, str, int]] = []
        packs: dict[tuple[CheckpointId | None, str], int] = {}
        for _, entry in self.partition_entries():
            if entry.offset is None:
                objects.append((entry.owner, entry.path, entry.stored_length))
                continue
            key = (entry.owner, entry.path)
            end = entry.offset + entry.stored_length
            if key not in packs:
                packs[key] = len(objects)
                objects.append((entry.owner, entry.path, end))
            elif end > objects[packs[key]][2]:
                objects[packs[key]] = (entry.owner, entry.path, end)
        objects += [(f.owner, f.path, f.size_bytes) for _, f in self.file_entries()]
        return objects


CheckpointManifestV2 = CheckpointManifest
"""The reference's name for the version-2 manifest."""

_ZERO_DIGEST = "0" * 64


class _StoredManifest(CheckpointManifest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The manifest as stored: with its signature, if signed, and the checksum of its
    own bytes, which are not public. (Fields are written in this order: the checksum last.)"""

    signature: ManifestSignature | None = None
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
    """msgspec decoding of the types cairn adds; an invalid id is a validation error.

    Anything but a string where an id belongs (a number, a list, an object) is a
    ``TypeError``, and a malformed string an :class:`InvalidInputError` (a ``ValueError``):
    msgspec turns both into a ``ValidationError`` naming the JSON path.
    """
    if kind is CheckpointId:
        if not isinstance(value, str):
            raise TypeError(f"Expected a checkpoint id string, got `{type(value).__name__}`")
        return _parse_id(value)
    raise NotImplementedError(f"cannot decode {kind!r}")  # a type cairn never declares


_parse_id = functools.lru_cache(maxsize=1024)(CheckpointId.parse)
"""CheckpointId.parse, remembered: a manifest names few owners many times (each carried
entry names its own), and parsing one takes 11 µs, most of decoding 100,000 entries."""


_encoder = msgspec.json.Encoder(enc_hook=enc_hook, order="deterministic")
_decoder = msgspec.json.Decoder(_StoredManifest, dec_hook=dec_hook)
_probe_decoder = msgspec.json.Decoder(_VersionProbe)


class EncodedManifest(NamedTuple):
    """A manifest ready to store: ``root`` at the manifest's path, each of ``parts``
    (relative path, bytes) in the checkpoint's directory before it, and ``manifest`` as
    a reader assembles it (entries in restore order, ``parts`` set)."""

    manifest: CheckpointManifest
    root: bytes
    parts: tuple[tuple[str, bytes], ...]


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
    (:data:`PART_ENTRIES` unless given), its parts.

    Deterministic: the same manifest gives the same bytes. Raises
    :class:`InvalidCheckpointDataError` if the root or a part would exceed
    :data:`MAX_MANIFEST_BYTES`.
    """
    if part_entries is None:
        part_entries = PART_ENTRIES
    entries = sum(len(op.partitions) for op in manifest.operators.values())
    if entries <= part_entries:
        whole = msgspec.structs.replace(manifest, parts=()) if manifest.parts else manifest
        return EncodedManifest(whole, _encode_root(whole, keys), ())
    operators: dict[str, OperatorSnapshotEntry] = {}
    records: list[ManifestPart] = []
    blobs: list[tuple[str, bytes]] = []
    inline_below = min(INLINE_BELOW, part_entries)
    for operator, entry in sorted(manifest.operators.items()):
        ordered = tuple(sorted(entry.partitions, key=chain_order))
        operators[operator] = OperatorSnapshotEntry(ordered, entry.total_bytes)
        if len(ordered) < inline_below:
            continue  # stays in the root
        for chunk in _chunks(ordered, part_entries):
            body = _part_encoder.encode(_PartBody(manifest.checkpoint_id, operator, chunk)) + b"\n"
            _check_part_size(manifest, len(body))
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
        return EncodedManifest(whole, _encode_root(whole, keys), ())
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
    return EncodedManifest(assembled, _encode_root(root, keys), tuple(blobs))


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


def _check_part_size(manifest: CheckpointManifest, size: int) -> None:
    if size > MAX_MANIFEST_BYTES:
        raise InvalidCheckpointDataError(
            f"a manifest part of checkpoint {manifest.checkpoint_id} would be {size} bytes, "
            f"over the limit of {MAX_MANIFEST_BYTES} bytes: one partition's chain is too "
            "long; save a full snapshot of it to shorten it"
        )


class _PartBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A manifest part as stored: whose entries, of which operator."""

    checkpoint_id: CheckpointId
    operator: str
    partitions: tuple[PartitionSnapshotEntry, ...]


_part_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
_part_decoder = msgspec.json.Decoder(_PartBody, dec_hook=dec_hook)


def _encode_root(manifest: CheckpointManifest, keys: SigningKeys | None) -> bytes:
    """Human-readable, deterministic JSON of ``manifest`` as it is, ending with its own
    checksum; signed when ``keys`` are given."""
    fields = msgspec.structs.asdict(manifest)
    placeholder = None if keys is None else keys.placeholder()
    stored = _StoredManifest(**fields, signature=placeholder, manifest_sha256=_ZERO_DIGEST)
    body = msgspec.json.format(_encoder.encode(stored), indent=2) + b"\n"
    if keys is not None and placeholder is not None:
        body = _sign(body, keys, placeholder)
    if len(body) > MAX_MANIFEST_BYTES:
        entries = sum(len(op.partitions) for op in manifest.operators.values())
        held = (
            f"{entries} artifact entries"
            if not manifest.parts
            else f"{len(manifest.parts)} parts of {len(manifest.operators)} operator(s)"
        )
        files = len(manifest.file_entries())
        raise InvalidCheckpointDataError(
            f"the manifest of checkpoint {manifest.checkpoint_id} would be {len(body)} bytes "
            f"({held}, {files} directory files, {len(manifest.source_offsets)} sources), "
            f"over the limit of {MAX_MANIFEST_BYTES} bytes: save fewer partitions or "
            "directory files per checkpoint, or a full snapshot to shorten the chains"
        )
    zeroed = _checksum_field(_ZERO_DIGEST)
    return body.replace(zeroed, _checksum_field(hashlib.sha256(body).hexdigest()))


def _sign(body: bytes, keys: SigningKeys, placeholder: ManifestSignature) -> bytes:
    """``body`` (its signature's value empty, its checksum zeroed) with the value put in."""
    field = signature_field(placeholder)
    start = body.find(field)
    # The member is top-level (two spaces in, after a newline that no JSON string holds):
    # nothing else in a manifest cairn encodes can spell it.
    assert start >= 0, "the signature member"
    assert body.find(field, start + 1) < 0, "one signature member"
    value = keys.sign(body)
    signed = signature_field(msgspec.structs.replace(placeholder, value=value))
    return body[:start] + signed + body[start + len(field) :]


def decode_record(
    decoder: msgspec.json.Decoder[_Record], path: str, data: Buffer, what: str, limit: int
) -> _Record:
    """Decode one small JSON record read from ``path`` (a pointer, a writer record, ...).

    Anything damaged — over ``limit`` bytes (refused unparsed), not JSON, nested too
    deeply, of the wrong shape — is a :class:`CorruptManifestError` naming ``path``.
    """
    size = memoryview(data).nbytes
    if size > limit:
        raise CorruptManifestError(path, f"{what} of {size} bytes is not one")
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"unreadable {what}: {exc}") from None
    except RecursionError:
        raise CorruptManifestError(path, f"unreadable {what}: nested too deeply") from None


def decode_manifest(path: str, data: Buffer, keys: SigningKeys | None = None) -> CheckpointManifest:
    """Parse and check the manifest bytes read from ``path``.

    Raises :class:`UnsupportedManifestVersionError` for another schema version and
    :class:`CorruptManifestError` for anything else that is not a valid manifest,
    including one over :data:`MAX_MANIFEST_BYTES` (refused before it is parsed). With
    ``keys``, a valid manifest that is not signed by one of them (unsigned, another key,
    a signature that does not verify) raises :class:`SignatureError`; without, the
    signature is not looked at. A root whose entries are in parts is not a whole
    manifest: :class:`InvalidInputError` (read it with :func:`decode_root` and
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
    size = memoryview(data).nbytes
    if size > MAX_MANIFEST_BYTES:
        raise CorruptManifestError(
            path, f"it is {size} bytes, over the limit of {MAX_MANIFEST_BYTES} bytes"
        )
    try:
        probe = _probe_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"not a JSON object: {exc}") from None
    except RecursionError:
        raise CorruptManifestError(path, "its JSON is nested too deeply") from None
    if probe.version is msgspec.UNSET:
        raise CorruptManifestError(path, "no 'version' field")
    if probe.version not in SUPPORTED_VERSIONS or isinstance(probe.version, bool):
        raise UnsupportedManifestVersionError(path, probe.version, SUPPORTED_VERSIONS)
    try:
        stored = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    except RecursionError:
        raise CorruptManifestError(path, "its JSON is nested too deeply") from None
    checksum = None
    if stored.manifest_sha256 is not None:
        checksum = _verify_checksum(path, data, stored.manifest_sha256)
    fields = msgspec.structs.asdict(stored)
    del fields["manifest_sha256"], fields["signature"]
    manifest = CheckpointManifest(**fields)
    try:
        check_manifest(manifest, stored=True)
        _check_part_records(manifest)
    except InvalidInputError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    if keys is not None:
        _verify_signature(path, data, stored.signature, checksum, keys)
    return manifest


def _check_part_records(root: CheckpointManifest) -> None:
    """A root's ``parts``: each at its digest's path, of an operator the root lists
    (whose entry list is then empty: an operator's entries are all in the root or all
    in parts), with sizes in bounds, and the parts of one operator in ascending,
    disjoint partition ranges."""
    if not root.parts:
        return
    if not isinstance(root.parts, tuple | list):
        raise InvalidInputError("parts must be a list")
    reach: dict[str, int] = {}
    for part in root.parts:
        if not isinstance(part, ManifestPart):
            raise InvalidInputError(f"expected a ManifestPart, got {short_repr(part)}")
        if not isinstance(part.sha256, str) or not _SHA256_HEX.fullmatch(part.sha256):
            raise InvalidInputError(f"not a SHA-256 hex digest for part {short_repr(part.path)}")
        if part.path != CheckpointPaths.relative_manifest_part(part.sha256):
            raise InvalidInputError(f"part {short_repr(part.path)} is not at its digest's path")
        where = f"part {part.path!r}"
        _check_int(f"size_bytes of {where}", part.size_bytes, 1, MAX_MANIFEST_BYTES)
        _check_int(f"entries of {where}", part.entries, 1, MAX_MANIFEST_BYTES)
        _check_int(f"first_partition of {where}", part.first_partition, 0, MAX_PARTITION)
        _check_int(f"last_partition of {where}", part.last_partition, 0, MAX_PARTITION)
        operator = root.operators.get(part.operator) if isinstance(part.operator, str) else None
        if operator is None or operator.partitions:
            raise InvalidInputError(
                f"{where} is of {short_repr(part.operator)}, which the root "
                "does not list with its entries in parts"
            )
        if part.last_partition < part.first_partition or part.first_partition < reach.get(
            part.operator, 0
        ):
            raise InvalidInputError(f"{where} overlaps or precedes another part of its operator")
        reach[part.operator] = part.last_partition + 1


def decode_part(
    root: CheckpointManifest, record: ManifestPart, path: str, data: Buffer
) -> tuple[PartitionSnapshotEntry, ...]:
    """The entries of the part ``record`` of ``root`` describes, from ``data`` read at
    store ``path``: exactly its recorded size and digest, of the root's checkpoint and
    the record's operator, as many entries as recorded, in restore order within its
    partition range. Anything else is a :class:`CorruptManifestError` naming ``path``."""
    size = memoryview(data).nbytes
    if size != record.size_bytes:
        raise CorruptManifestError(
            path, f"it is {size} bytes, not the {record.size_bytes} recorded"
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != record.sha256:
        raise CorruptManifestError(path, f"part checksum mismatch: {digest} != {record.sha256}")
    body = decode_record(_part_decoder, path, data, "manifest part", MAX_MANIFEST_BYTES)
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


_CHECKSUM_FIELD = re.compile(rb'"manifest_sha256": "([^"]*)"')
"""Any ``manifest_sha256`` field: compiled once (a pattern per digest missed re's cache
and cost a compile, 0.1 ms, per manifest decoded: a tenth of a GC plan's time)."""


def _verify_checksum(path: str, data: Buffer, digest: str) -> tuple[int, int]:
    """Check the manifest checksum ``digest``; the span of its member in ``data``."""
    # On the caller's buffer, without a copy: a manifest may be tens of megabytes.
    body = memoryview(data)
    wanted = digest.encode()
    fields = (m for m in _CHECKSUM_FIELD.finditer(body) if m.group(1) == wanted)
    found = [m.span() for m, _ in zip(fields, range(2), strict=False)]
    if not _SHA256_HEX.fullmatch(digest) or len(found) != 1:
        raise CorruptManifestError(path, "its manifest_sha256 field is damaged")
    start, end = found[0]
    hasher = hashlib.sha256(body[:start])
    hasher.update(_checksum_field(_ZERO_DIGEST))
    hasher.update(body[end:])
    actual = hasher.hexdigest()
    if actual != digest:
        raise CorruptManifestError(path, f"manifest checksum mismatch: {actual} != {digest}")
    return start, end


def _verify_signature(
    path: str,
    data: Buffer,
    signature: ManifestSignature | None,
    checksum: tuple[int, int] | None,
    keys: SigningKeys,
) -> None:
    """Raise :class:`SignatureError` unless ``signature`` is one of ``keys``' over ``data``.

    What was signed is ``data`` with the signature's value emptied and the checksum
    zeroed: the signature member must be exactly as cairn spells it (top-level, once),
    and before the checksum, which cairn always writes with it.
    """
    held = ", ".join(keys.key_ids)
    if signature is None:
        raise SignatureError(
            path, f"it is not signed; this reader requires a signature by one of its keys ({held})"
        )
    if checksum is None or not well_formed(signature):
        raise SignatureError(path, "its signature member is not one cairn writes")
    signer = keys.find(signature)
    if signer is None:
        raise SignatureError(
            path,
            f"it is signed by key {signature.key_id!r} ({signature.alg}), which is not one "
            f"of this reader's ({held})",
        )
    body = bytes(data)  # the signer takes bytes: one copy, whatever the buffer
    field = signature_field(signature)
    start = body.find(field)
    end = start + len(field)
    if start < 0 or body.find(field, start + 1) >= 0 or end > checksum[0]:
        raise SignatureError(path, "its signature member is not one cairn writes")
    signed = b"".join(
        (
            body[:start],
            signature_field(msgspec.structs.replace(signature, value="")),
            body[end : checksum[0]],
            _checksum_field(_ZERO_DIGEST),
            body[checksum[1] :],
        )
    )
    if not signer.verify(signed, bytes.fromhex(signature.value)):
        raise SignatureError(
            path,
            f"its signature by key {signature.key_id!r} does not verify: it was not written "
            "by a holder of that key, or was changed since",
        )


def _check_int(what: str, value: object, low: int, high: int) -> None:
    if not is_int(value):
        raise InvalidInputError(f"{what} must be an int, got {short_repr(value)}")
    if not low <= value <= high:
        raise InvalidInputError(f"{what} {value} is out of range {low}..{high}")


def check_source_offset(source: str, offset: object, *, stored: bool = False) -> None:
    """Raise :class:`InvalidInputError` unless ``offset`` is a valid entry for ``source``.

    ``stored`` accepts the longer source names older writers allowed (see
    :func:`check_manifest`).
    """
    validate_name("source", source, max_bytes=MAX_NAME_BYTES if stored else None)
    if not isinstance(offset, SourceOffsetEntry):
        raise InvalidInputError(
            f"source {source!r}: expected a SourceOffsetEntry, got {short_repr(offset)}"
        )
    if not isinstance(offset.source_type, str):
        raise InvalidInputError(f"source {source!r} has no source_type")
    if not isinstance(offset.offsets, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in offset.offsets.items()
    ):
        raise InvalidInputError(f"source {source!r}: offsets must map str to str")
    _check_int(f"source {source!r} epoch", offset.epoch, -MAX_INT64 - 1, MAX_INT64)


def check_entry(operator: str, part: object, checkpoint_id: CheckpointId | None = None) -> None:
    """Raise :class:`InvalidInputError` unless ``part`` is a valid entry of ``operator``.

    Its path must be the layout's path for its partition and kind (with an ``offset``: a
    pack's path, the offset in 0..:data:`MAX_INT64`, the range ending there at the
    latest, and a stored size recorded if it is encoded), its sizes in
    0..:data:`MAX_INT64`, its digest a SHA-256 hex digest, its codec a known one, its
    owner another checkpoint than ``checkpoint_id``, and ``used_bytes`` (if set) on a
    whole, uncompressed object carried from another checkpoint, at most its size.
    """
    if not isinstance(part, PartitionSnapshotEntry):
        raise InvalidInputError(
            f"operator {operator!r}: expected a PartitionSnapshotEntry, got {short_repr(part)}"
        )
    validate_partition(part.partition_id)
    if not isinstance(part.is_delta, bool):
        raise InvalidInputError(f"is_delta must be a bool, got {short_repr(part.is_delta)}")
    expected = CheckpointPaths.relative_artifact(operator, part.partition_id, part.is_delta)
    if part.offset is not None:
        _check_range(operator, part)
    elif not isinstance(part.path, str) or not CheckpointPaths.is_artifact_of(
        part.path, operator, part.partition_id, part.is_delta
    ):
        validate_relative_path(part.path)  # its more precise reason first, if it has one
        kind = "delta" if part.is_delta else "snapshot"
        raise InvalidInputError(
            f"entry {short_repr(part.path)} of operator {operator!r} is not at the layout's "
            f"path for partition {part.partition_id}'s {kind}: {expected!r} (or that name "
            "with an attempt token)"
        )
    where = repr(part.path)  # the layout's path: as short as the operator's name
    _check_int(f"size_bytes of {where}", part.size_bytes, 0, MAX_INT64)
    if part.stored_size_bytes is not None:
        _check_int(f"stored_size_bytes of {where}", part.stored_size_bytes, 0, MAX_INT64)
    if not isinstance(part.sha256, str) or not _SHA256_HEX.fullmatch(part.sha256):
        raise InvalidInputError(f"not a SHA-256 hex digest for {where}")
    if part.owner is not None:
        if not isinstance(part.owner, CheckpointId):
            raise InvalidInputError(f"owner of {where} must be a CheckpointId")
        if part.owner == checkpoint_id:
            raise InvalidInputError(f"entry {where} names its own checkpoint as owner")
    if part.codec is not None and part.codec not in CODECS:
        raise InvalidInputError(
            f"entry {where} is stored with codec {short_repr(part.codec)}, "
            f"which this cairn does not know (known: {', '.join(CODECS)})"
        )
    if part.index_size_bytes is not None:
        _check_index(where, part)
    if part.used_bytes is not None:
        if part.owner is None or part.offset is not None or part.codec is not None:
            raise InvalidInputError(
                f"entry {where} has used_bytes: only a whole, uncompressed object carried "
                "from another checkpoint has"
            )
        _check_int(f"used_bytes of {where}", part.used_bytes, 0, part.size_bytes)


def _check_index(where: str, part: PartitionSnapshotEntry) -> None:
    """An object of ranges: no codec of the whole (its ranges say whether each is a frame
    of its own, :mod:`cairn.format.ranges`), with an index of whole records inside it."""
    _check_int(f"index_size_bytes of {where}", part.index_size_bytes, 0, part.size_bytes)
    assert part.index_size_bytes is not None
    if not is_index_size(part.index_size_bytes):
        raise InvalidInputError(
            f"index_size_bytes of {where} is {part.index_size_bytes}: not the size of a range index"
        )
    if part.codec is not None or part.offset is not None:
        raise InvalidInputError(
            f"entry {where} is an object of ranges: it cannot have a codec or an offset"
        )


def _check_range(operator: str, part: PartitionSnapshotEntry) -> None:
    """The part of :func:`check_entry` for an entry with an offset: a pack's range."""
    if not CheckpointPaths.is_pack(part.path):
        validate_relative_path(part.path)
        raise InvalidInputError(
            f"entry {short_repr(part.path)} of operator {operator!r} (partition "
            f"{short_repr(part.partition_id)}) has an offset, so it must be a range of a "
            "pack (packs/pack-{n}.{attempt}.pack), and is not"
        )
    where = repr(part.path)
    _check_int(f"offset of partition {part.partition_id} in {where}", part.offset, 0, MAX_INT64)
    if part.codec is not None and part.stored_size_bytes is None:
        raise InvalidInputError(
            f"entry of partition {part.partition_id} in {where} is encoded ({part.codec!r}) "
            "and has an offset, but no stored_size_bytes: its range has no length"
        )
    length = part.stored_size_bytes if part.codec is not None else part.size_bytes
    if is_int(length) and is_int(part.offset) and part.offset + length > MAX_INT64:
        raise InvalidInputError(
            f"the range of partition {part.partition_id} in {where} ends past {MAX_INT64}"
        )


def _check_shared_paths(
    entries: list[PartitionSnapshotEntry], seen_paths: set[tuple[CheckpointId | None, str]]
) -> None:
    """No two entries at one path, unless all of those have offsets and their ranges do
    not overlap (empty ranges overlap nothing). Adds the paths to ``seen_paths``."""
    ranges: dict[tuple[CheckpointId | None, str], list[tuple[int, int]]] = {}
    for part in entries:
        key = (part.owner, part.path)
        if part.offset is None:
            if key in seen_paths or key in ranges:
                raise InvalidInputError(f"two entries share the path {part.path!r}")
            seen_paths.add(key)
        else:
            if key in seen_paths:
                raise InvalidInputError(f"two entries share the path {part.path!r}")
            ranges.setdefault(key, []).append((part.offset, part.offset + part.stored_length))
    for key, spans in ranges.items():
        reach = 0
        for start, end in sorted(spans):
            if start < end:
                if start < reach:
                    raise InvalidInputError(
                        f"two entries overlap in {key[1]!r}: bytes {start}..{end} and a "
                        f"range ending at {reach}"
                    )
                reach = max(reach, end)
        seen_paths.add(key)


def check_manifest(manifest: CheckpointManifest, *, stored: bool = False) -> None:
    """Raise :class:`InvalidInputError` if ``manifest`` is not internally consistent.

    ``stored`` is for a manifest read from a store: it accepts source names up to 255
    bytes, which writers allowed before :data:`cairn.format.layout.MAX_SOURCE_NAME_BYTES`, so
    their checkpoints still load.
    """
    if isinstance(manifest.version, bool) or manifest.version not in SUPPORTED_VERSIONS:
        raise InvalidInputError(
            f"unsupported manifest version {short_repr(manifest.version)} "
            f"(supported: {SUPPORTED_VERSIONS})"
        )
    if not isinstance(manifest.checkpoint_id, CheckpointId):
        raise InvalidInputError(
            f"checkpoint_id must be a CheckpointId, got {manifest.checkpoint_id!r}"
        )
    if manifest.parent_id is not None:
        if not isinstance(manifest.parent_id, CheckpointId):
            raise InvalidInputError(f"parent_id must be a CheckpointId, got {manifest.parent_id!r}")
        if manifest.parent_id == manifest.checkpoint_id:
            raise InvalidInputError(f"checkpoint {manifest.checkpoint_id} is its own parent")
    if isinstance(manifest.epoch, int) and manifest.epoch < 0:
        raise InvalidInputError(f"negative epoch {manifest.epoch}")
    _check_int("epoch", manifest.epoch, 0, MAX_INT64)
    _check_int("timestamp_ms", manifest.timestamp_ms, 0, MAX_TIMESTAMP_MS)
    _check_int("total_size_bytes", manifest.total_size_bytes, 0, MAX_INT64)
    if manifest.watermark is not None:
        _check_int("watermark", manifest.watermark, -MAX_INT64 - 1, MAX_INT64)
    if manifest.writer_generation is not None:
        _check_int("writer_generation", manifest.writer_generation, 0, MAX_INT64)
    if manifest.name is not None:
        validate_checkpoint_name(manifest.name)
    if manifest.stats is not None:
        _check_stats(manifest.stats)
    if not isinstance(manifest.source_offsets, dict) or not isinstance(manifest.operators, dict):
        raise InvalidInputError("operators and source_offsets must be dicts")
    for source, offset in manifest.source_offsets.items():
        check_source_offset(source, offset, stored=stored)
    seen_paths: set[tuple[CheckpointId | None, str]] = set()
    checked: list[PartitionSnapshotEntry] = []
    for operator, entry in manifest.operators.items():
        validate_name("operator", operator)
        if not isinstance(entry, OperatorSnapshotEntry) or not isinstance(
            entry.partitions, tuple | list
        ):
            raise InvalidInputError(f"operator {operator!r}: expected an OperatorSnapshotEntry")
        _check_int(f"total_bytes of operator {operator!r}", entry.total_bytes, 0, MAX_INT64)
        snapshots: set[int] = set()
        for part in entry.partitions:
            if isinstance(part, PartitionSnapshotEntry) and part.is_delta is False:
                if part.partition_id in snapshots:
                    raise InvalidInputError(
                        f"operator {operator!r} has two snapshots of partition {part.partition_id}"
                    )
                snapshots.add(part.partition_id)
            check_entry(operator, part, manifest.checkpoint_id)
            checked.append(part)
    _check_shared_paths(checked, seen_paths)
    _check_directories(manifest, seen_paths)


def _check_stats(stats: object) -> None:
    """Every count of ``stats`` (a :class:`SaveStats`) is an int in ``[0, MAX_INT64]``;
    ``stored_bytes`` and ``requests`` may be UNSET (written before they existed)."""
    if not isinstance(stats, SaveStats):
        raise InvalidInputError(f"stats must be a SaveStats, got {short_repr(stats)}")
    for field in SaveStats.__struct_fields__:
        value = getattr(stats, field)
        if value is msgspec.UNSET and field in ("stored_bytes", "requests"):
            continue
        if field == "requests":
            if not isinstance(value, StoreRequests):
                raise InvalidInputError(
                    f"stats.requests must be a StoreRequests, got {short_repr(value)}"
                )
            for kind in StoreRequests.__struct_fields__:
                _check_int(f"stats.requests.{kind}", getattr(value, kind), 0, MAX_INT64)
        else:
            _check_int(f"stats.{field}", value, 0, MAX_INT64)


def check_relative_file(path: object) -> str:
    """``path`` if it is a file's path inside a directory partition: ``/``-separated,
    relative, without empty, ``.`` or ``..`` parts; else :class:`InvalidInputError`."""
    if not isinstance(path, str) or not path or path.startswith("/"):
        raise InvalidInputError(f"not a relative file path: {short_repr(path)}")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts) or _CONTROL.search(path):
        raise InvalidInputError(f"not a relative file path: {short_repr(path)}")
    return path


_CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def _check_directories(
    manifest: CheckpointManifest, seen_paths: set[tuple[CheckpointId | None, str]]
) -> None:
    """The directory partitions of ``manifest``: well-formed, no partition twice (nor
    also among ``operators``), each file's object at the layout's path."""
    if not isinstance(manifest.directories, tuple | list):
        raise InvalidInputError("directories must be a list")
    keys: set[tuple[str, int]] = set()
    artifact_keys = {(op, e.partition_id) for op, e in manifest.partition_entries()}
    for directory in manifest.directories:
        if not isinstance(directory, DirectoryEntry):
            raise InvalidInputError("expected a DirectoryEntry in directories")
        validate_name("operator", directory.operator)
        validate_partition(directory.partition_id)
        key = (directory.operator, directory.partition_id)
        if key in keys or key in artifact_keys:
            raise InvalidInputError(f"partition {key!r} is listed twice")
        keys.add(key)
        names: set[str] = set()
        for file in directory.files:
            _check_file(directory, file, manifest.checkpoint_id)
            if file.relative_path in names:
                raise InvalidInputError(f"directory {key!r} lists {file.relative_path!r} twice")
            names.add(file.relative_path)
            if (file.owner, file.path) in seen_paths:
                raise InvalidInputError(f"two entries share the path {file.path!r}")
            seen_paths.add((file.owner, file.path))


def _check_file(directory: DirectoryEntry, file: object, cid: CheckpointId) -> None:
    if not isinstance(file, FileEntry):
        raise InvalidInputError(f"expected a FileEntry, got {short_repr(file)}")
    check_relative_file(file.relative_path)
    where = repr(file.relative_path)
    if not isinstance(file.path, str) or not CheckpointPaths.is_file_of(
        file.path, directory.operator, directory.partition_id
    ):
        raise InvalidInputError(
            f"file {where} of partition ({directory.operator!r}, {directory.partition_id}) "
            f"is not stored at a layout's path: {short_repr(file.path)}"
        )
    _check_int(f"size_bytes of {where}", file.size_bytes, 0, MAX_INT64)
    _check_int(f"mtime_ns of {where}", file.mtime_ns, -MAX_INT64 - 1, MAX_INT64)
    if not isinstance(file.sha256, str) or not _SHA256_HEX.fullmatch(file.sha256):
        raise InvalidInputError(f"not a SHA-256 hex digest for {where}")
    if file.owner is not None and (not isinstance(file.owner, CheckpointId) or file.owner == cid):
        raise InvalidInputError(f"file {where} names an invalid owner")
