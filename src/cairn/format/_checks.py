"""Validation of manifests: whether a manifest, or one of its entries, is well formed.

Invariant: a manifest that passes :func:`check_manifest` names only paths of the layout
(each inside the checkpoint directory of its owner, at the path of its operator,
partition and kind), with digests, sizes and offsets in range and no two entries over
the same stored bytes; anything else is an :class:`InvalidInputError` naming the
offending value, which decoders turn into damage. See docs/format.md, section
"Validation".
"""

from __future__ import annotations

import re

import msgspec

from cairn.errors import InvalidInputError, KeySpaceMismatchError
from cairn.format._schema import (
    MAX_INT64,
    MAX_TIMESTAMP_MS,
    SUPPORTED_VERSIONS,
    CheckpointManifest,
    DirectoryEntry,
    FileEntry,
    KeyGroupEntry,
    ManifestPart,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SaveStats,
    SourceOffsetEntry,
    StoreRequests,
)
from cairn.format._validate import is_int
from cairn.format.codecs import CODECS
from cairn.format.ids import CheckpointId
from cairn.format.keygroups import MAX_KEY_GROUPS
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
from cairn.format.ranges import (
    COMPRESSED_RECORD_BYTES,
    INDEX_MAGIC,
    INDEX_RECORD_BYTES,
    is_index_size,
)

__all__ = [
    "SHA256_HEX",
    "check_entry",
    "check_key_space",
    "check_manifest",
    "check_part_records",
    "check_relative_file",
    "check_source_offset",
]

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
"""A SHA-256 digest as cairn writes it: 64 lowercase hex digits."""


def _check_int(what: str, value: object, low: int, high: int) -> None:
    if not is_int(value):
        raise InvalidInputError(f"{what} must be an int, got {short_repr(value)}")
    if not low <= value <= high:
        raise InvalidInputError(f"{what} {value} is out of range {low}..{high}")


def check_source_offset(source: str, offset: object, *, stored: bool = False) -> None:
    """Raise :class:`InvalidInputError` unless ``offset`` is a valid entry for ``source``.

    ``stored`` accepts source names of up to :data:`MAX_NAME_BYTES`, as a stored
    manifest may hold them (see :func:`check_manifest`); a new one is held to
    :data:`~cairn.format.layout.MAX_SOURCE_NAME_BYTES`.
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
    elif not isinstance(part.path, str) or not (
        CheckpointPaths.is_artifact_of(part.path, operator, part.partition_id, part.is_delta)
        or _is_carried_keyed(operator, part)
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
    if not isinstance(part.sha256, str) or not SHA256_HEX.fullmatch(part.sha256):
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
    if part.key_groups is not None:
        _check_key_groups(where, part)
    if part.used_bytes is not None:
        if part.owner is None or part.offset is not None or part.codec is not None:
            raise InvalidInputError(
                f"entry {where} has used_bytes: only a whole, uncompressed object carried "
                "from another checkpoint has"
            )
        _check_int(f"used_bytes of {where}", part.used_bytes, 0, part.size_bytes)


def _is_carried_keyed(operator: str, part: PartitionSnapshotEntry) -> bool:
    """A keyed snapshot carried from another checkpoint may be the object of another
    partition of its operator (groups saved by another worker before a rescale)."""
    if part.key_groups is None or part.owner is None or part.is_delta:
        return False
    stem = CheckpointPaths.relative_artifact(operator, 0, False).rpartition("partition-0.")[0]
    number = part.path[len(stem) :].removeprefix("partition-").partition(".")[0]
    if not part.path.startswith(stem) or not number.isdigit() or number != str(int(number)):
        return False
    return int(number) <= MAX_PARTITION and CheckpointPaths.is_artifact_of(
        part.path, operator, int(number), False
    )


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


def _check_key_groups(where: str, part: PartitionSnapshotEntry) -> None:
    """A keyed partition: a snapshot that is an object of ranges, one range per group,
    its groups as canonical runs inside its count."""
    record = part.key_groups
    if not isinstance(record, KeyGroupEntry):
        raise InvalidInputError(f"key_groups of {where} must be a KeyGroupEntry")
    _check_int(f"key-group count of {where}", record.count, 1, MAX_KEY_GROUPS)
    if part.is_delta or part.index_size_bytes is None:
        raise InvalidInputError(
            f"entry {where} has key_groups: only a snapshot that is an object of ranges has"
        )
    held = len(_check_runs(f"key groups of {where}", record.groups, record.count))
    if record.used is not None:
        if part.owner is None:
            raise InvalidInputError(
                f"entry {where} has used key groups: only an object carried from another "
                "checkpoint has"
            )
        used = _check_runs(f"used key groups of {where}", record.used, record.count)
        if not used <= _check_runs("", record.groups, record.count):
            raise InvalidInputError(f"used key groups of {where} are not all in its groups")
    body = part.index_size_bytes - len(INDEX_MAGIC)
    if body not in (held * INDEX_RECORD_BYTES, held * COMPRESSED_RECORD_BYTES):
        raise InvalidInputError(
            f"entry {where} holds {held} key groups but its index is of "
            f"{part.index_size_bytes} bytes: not one range per group"
        )


def _check_runs(what: str, runs: object, count: int) -> set[int]:
    """The groups ``runs`` hold, if they are sorted, disjoint, non-adjacent runs inside
    ``0..count``; else :class:`InvalidInputError` naming ``what``."""
    if not isinstance(runs, tuple | list):
        raise InvalidInputError(f"{what} must be a list of runs")
    reach = -1
    groups: set[int] = set()
    for run in runs:
        if not isinstance(run, tuple | list) or len(run) != 2:
            raise InvalidInputError(f"{what}: a run is [start, end), got {short_repr(run)}")
        start, end = run
        _check_int(f"a run start of {what}", start, 0, count - 1)
        _check_int(f"a run end of {what}", end, 1, count)
        if end <= start or start <= reach:
            raise InvalidInputError(f"{what} are not sorted, disjoint, non-adjacent runs: {run!r}")
        reach = end
        groups.update(range(start, end))
    return groups


def check_key_space(operator: str, entries: list[PartitionSnapshotEntry]) -> None:
    """Raise :class:`KeySpaceMismatchError` unless the keyed entries of ``operator`` make
    one key space: all of its entries keyed or none, one key-group count, no group held
    by two partitions.

    Args:
        operator: The operator's name, for errors.
        entries: Its entries, each already checked by :func:`check_entry`.

    Raises:
        KeySpaceMismatchError: They do not.
    """
    keyed = [part for part in entries if part.key_groups is not None]
    if not keyed:
        return
    if len(keyed) != len(entries):
        other = next(part for part in entries if part.key_groups is None)
        raise KeySpaceMismatchError(
            operator,
            f"partition {other.partition_id} is not keyed state while partition "
            f"{keyed[0].partition_id} is: an operator's partitions are all keyed or none",
        )
    first = keyed[0]
    assert first.key_groups is not None
    owners: dict[int, int] = {}
    for number, part in enumerate(keyed):
        assert part.key_groups is not None
        if part.key_groups.count != first.key_groups.count:
            raise KeySpaceMismatchError(
                operator,
                f"partition {part.partition_id} has {part.key_groups.count} key groups, "
                f"partition {first.partition_id} {first.key_groups.count}",
            )
        for start, end in part.key_groups.held:
            for group in range(start, end):
                holder = owners.setdefault(group, number)
                if holder == number:
                    continue
                before = keyed[holder].partition_id
                raise KeySpaceMismatchError(
                    operator,
                    f"partitions {before} and {part.partition_id} both hold key group {group}"
                    if before != part.partition_id
                    else f"partition {before} holds key group {group} twice",
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
    not overlap (empty ranges overlap nothing), or all are keyed objects carried from
    another checkpoint (partitions after a rescale may each carry groups of one object:
    :func:`check_key_space` sees that they hold different ones). Adds the paths to
    ``seen_paths``."""
    ranges: dict[tuple[CheckpointId | None, str], list[tuple[int, int]]] = {}
    keyed: set[tuple[CheckpointId | None, str]] = set()
    for part in entries:
        key = (part.owner, part.path)
        if part.key_groups is not None and part.owner is not None:
            if key in seen_paths or key in ranges:
                raise InvalidInputError(f"two entries share the path {part.path!r}")
            keyed.add(key)
        elif part.offset is None:
            if key in seen_paths or key in ranges or key in keyed:
                raise InvalidInputError(f"two entries share the path {part.path!r}")
            seen_paths.add(key)
        else:
            if key in seen_paths or key in keyed:
                raise InvalidInputError(f"two entries share the path {part.path!r}")
            ranges.setdefault(key, []).append((part.offset, part.offset + part.stored_length))
    seen_paths.update(keyed)
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
            if (
                isinstance(part, PartitionSnapshotEntry)
                and part.is_delta is False
                and part.key_groups is None  # a keyed partition may carry groups of others
            ):
                if part.partition_id in snapshots:
                    raise InvalidInputError(
                        f"operator {operator!r} has two snapshots of partition {part.partition_id}"
                    )
                snapshots.add(part.partition_id)
            check_entry(operator, part, manifest.checkpoint_id)
            checked.append(part)
        check_key_space(operator, list(entry.partitions))
    _check_shared_paths(checked, seen_paths)
    _check_directories(manifest, seen_paths)


def _check_stats(stats: object) -> None:
    """Every count of ``stats`` (a :class:`SaveStats`) is an int in ``[0, MAX_INT64]``;
    ``stored_bytes`` and ``requests`` may be UNSET (absent from the stored record)."""
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
    if not isinstance(file.sha256, str) or not SHA256_HEX.fullmatch(file.sha256):
        raise InvalidInputError(f"not a SHA-256 hex digest for {where}")
    if file.owner is not None and (not isinstance(file.owner, CheckpointId) or file.owner == cid):
        raise InvalidInputError(f"file {where} names an invalid owner")


def check_part_records(root: CheckpointManifest, limit: int) -> None:
    """A root's ``parts``: each at its digest's path, of an operator the root lists
    (whose entry list is then empty: an operator's entries are all in the root or all
    in parts), with sizes (and entry counts) in 1..``limit``, and the parts of one
    operator in ascending, disjoint partition ranges."""
    if not root.parts:
        return
    if not isinstance(root.parts, tuple | list):
        raise InvalidInputError("parts must be a list")
    reach: dict[str, int] = {}
    for part in root.parts:
        if not isinstance(part, ManifestPart):
            raise InvalidInputError(f"expected a ManifestPart, got {short_repr(part)}")
        if not isinstance(part.sha256, str) or not SHA256_HEX.fullmatch(part.sha256):
            raise InvalidInputError(f"not a SHA-256 hex digest for part {short_repr(part.path)}")
        if part.path != CheckpointPaths.relative_manifest_part(part.sha256):
            raise InvalidInputError(f"part {short_repr(part.path)} is not at its digest's path")
        where = f"part {part.path!r}"
        _check_int(f"size_bytes of {where}", part.size_bytes, 1, limit)
        _check_int(f"entries of {where}", part.entries, 1, limit)
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
