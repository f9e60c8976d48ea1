"""The types a manifest is made of: msgspec structs, public as :mod:`cairn.format.manifest`.

Invariant: every optional field has a default and is omitted from the JSON when it has
it, so a manifest without the field decodes to the default, and one that does not use
a field encodes byte for byte the same as a manifest without it. See docs/format.md,
section "The manifest".

``__all__`` names what :mod:`cairn.format.manifest` makes public of this module.
"""

from __future__ import annotations

import time

import msgspec

from cairn.format.ids import CheckpointId

__all__ = [
    "MANIFEST_VERSION",
    "MAX_INT64",
    "MAX_TIMESTAMP_MS",
    "CheckpointManifest",
    "DirectoryEntry",
    "FileEntry",
    "KeyGroupEntry",
    "ManifestPart",
    "OperatorSnapshotEntry",
    "PartitionSnapshotEntry",
    "SaveStats",
    "SourceOffsetEntry",
    "StoreRequests",
]

MANIFEST_VERSION = 2
SUPPORTED_VERSIONS = (2,)

MAX_INT64 = 2**63 - 1
"""The largest epoch, size, generation or watermark: JSON readers in other languages
(Rust's serde, Java's Jackson, Go) hold integers in 64 bits."""

MAX_TIMESTAMP_MS = 253_402_300_799_999
"""The latest ``timestamp_ms``: 9999-12-31T23:59:59.999Z, the last time ``datetime`` shows."""


class KeyGroupEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """The key groups of a keyed partition's object of ranges (see
    :mod:`cairn.format.keygroups`).

    ``count`` is the operator's key-group count, the same in every keyed entry of the
    operator; ``groups`` the groups the object holds, one range each in ascending group
    order, as runs: sorted, disjoint, non-adjacent ``[start, end)`` pairs
    (:func:`cairn.format.keygroups.to_runs`). ``used`` (runs too, within ``groups``) is
    set on an object carried from an earlier checkpoint: the groups of it that this
    entry's partition holds (None: all of them). A partition may have several keyed
    entries: its own object and objects it carries groups from.
    """

    count: int
    groups: tuple[tuple[int, int], ...] = ()
    used: tuple[tuple[int, int], ...] | None = None

    @property
    def held(self) -> tuple[tuple[int, int], ...]:
        """The groups the entry's partition holds in this object, as runs."""
        return self.groups if self.used is None else self.used


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

    ``key_groups`` is set on the object of ranges of a keyed partition
    (:class:`cairn.KeyedSnapshot`): the operator's key-group count and the groups the
    partition holds, its ranges in ascending group order, so each group is read alone.

    Attributes:
        partition_id: The partition, an int >= 0.
        is_delta: True for a delta, False for a snapshot.
        path: Where the bytes are, relative to the directory of ``owner``.
        size_bytes: The size of the bytes the caller handed in.
        sha256: The SHA-256 of those bytes, 64 lowercase hex digits (of the index, for
            an object of ranges).
        owner: The checkpoint whose upload holds the bytes; None for the manifest's own.
        codec: How the bytes are encoded in the store (``"zstd"``); None: as given.
        stored_size_bytes: Their size in the store when encoded, or None.
        offset: Where they start in a pack, or None for a whole object.
        index_size_bytes: The size of an object of ranges' index, or None.
        used_bytes: The bytes of a carried object this checkpoint reads, or None.
        key_groups: The key groups of a keyed partition, or None.
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
    key_groups: KeyGroupEntry | None = None

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
    """The partitions stored for one operator, and their total size in bytes.

    Attributes:
        partitions: Every entry of the operator, each partition's chain in restore order
            (the base snapshot, then deltas oldest first).
        total_bytes: The sum of their ``size_bytes``.
    """

    partitions: tuple[PartitionSnapshotEntry, ...] = ()
    total_bytes: int = 0

    @classmethod
    def from_partitions(cls, partitions: list[PartitionSnapshotEntry]) -> OperatorSnapshotEntry:
        """An entry whose partitions are sorted by id and whose total is their sum.

        Args:
            partitions: The operator's partition entries, in any order.

        Returns:
            The operator's entry.
        """
        return cls(
            partitions=tuple(sorted(partitions, key=chain_order)),
            total_bytes=sum(p.size_bytes for p in partitions),
        )


class SourceOffsetEntry(msgspec.Struct, frozen=True):
    """Where a source should resume: its type, per-split offsets, and the epoch they match.

    ``SourceOffsetEntry("kafka", {"events-0": "1234", "events-1": "980"}, 42)``: resume
    partition 0 of topic ``events`` at offset 1234 and partition 1 at 980, the position
    of epoch 42. cairn stores the values as given and never interprets them.

    Attributes:
        source_type: What kind of source it is (``"kafka"``, ``"kinesis"``, ...).
        offsets: Each split (partition, shard) of the source to its position, as text.
        epoch: The epoch these offsets belong to.
    """

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

    Both are :data:`msgspec.UNSET` (falsy) in statistics stored without them, and then
    not written: UNSET, unlike a default, is omitted whatever the others do, so such
    statistics encode byte for byte as they were stored (``retries`` included, even 0).
    A reader ignores fields of the statistics it does not know (nothing here forbids
    them), so a reader reads statistics with fields it lacks.
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
    """Where some of a large manifest's entries are stored (see
    :func:`cairn.format.manifest.encode_stored`).

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

    ``stats`` (optional: a manifest may lack it) says how the
    checkpoint was made: see :class:`SaveStats`. ``name`` (optional) is a label the
    writer gave the checkpoint besides its id, such as the ``checkpoint_id`` a DCP save
    was given (``step-100``; see :mod:`cairn.torch`): several checkpoints may carry one
    name, and a name never replaces the id in the store's layout.

    Attributes:
        version: The manifest schema version, 2.
        checkpoint_id: The checkpoint's id.
        epoch: The epoch the checkpoint records.
        timestamp_ms: When it was made, in milliseconds since the Unix epoch, by the
            saving process's clock (a copy keeps the original's); ``keep_within`` uses it.
        operators: Each operator's partitions: every partition's whole restore chain.
        source_offsets: Each source's offsets to resume from.
        parent_id: The checkpoint it builds on, or None.
        watermark: The watermark the writer gave, or None.
        total_size_bytes: The size of every artifact the manifest names.
        writer_generation: The writer generation that wrote it (None: 0).
        stats: How its save went, or None.
        name: A label besides the id (``step-100``), or None.
        directories: Its directory partitions, file by file.
        parts: Where its entries are stored when the manifest is in parts.
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
        """An empty manifest for ``checkpoint_id`` at ``epoch``, stamped with the current time.

        Args:
            checkpoint_id: The checkpoint's id.
            epoch: The epoch it records.

        Returns:
            The manifest, naming no partition, offset or directory.
        """
        return cls(
            version=MANIFEST_VERSION,
            checkpoint_id=checkpoint_id,
            epoch=epoch,
            timestamp_ms=time.time_ns() // 10**6,
        )

    def partition_entries(self) -> list[tuple[str, PartitionSnapshotEntry]]:
        """Every partition of this manifest, in a stable order.

        Returns:
            ``(operator, entry)`` pairs, by operator name, then in each operator's order.
        """
        return [(op, p) for op, entry in sorted(self.operators.items()) for p in entry.partitions]

    def file_entries(self) -> list[tuple[DirectoryEntry, FileEntry]]:
        """Every file of every directory partition, with its directory.

        Returns:
            ``(directory, file)`` pairs, in the manifest's order.
        """
        return [(d, f) for d in self.directories for f in d.files]

    def own_objects(self) -> list[str]:
        """What this manifest names in its own checkpoint's directory, relative to it: its
        own uploads (each once) and the parts it is stored in.

        Returns:
            The relative paths: the uploads, then the manifest parts.
        """
        own = [path for owner, path, _ in self.stored_objects() if owner is None]
        return own + [part.path for part in self.parts]

    def stored_objects(self) -> list[tuple[CheckpointId | None, str, int]]:
        """Every object this manifest names, once: ``(owner, path, stored size)``,
        partition artifacts first, then directory files (``owner`` None: this
        checkpoint's own).

        A pack that several entries name is listed once, where its first entry is, with
        the end of its furthest range as its size: the least it must hold (a pack carried
        from an earlier checkpoint may hold ranges this manifest does not name). Tell
        one from a whole object with :meth:`cairn.format.layout.CheckpointPaths.is_pack`.

        Returns:
            ``(owner, path, stored size)`` triples, each object once.
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
