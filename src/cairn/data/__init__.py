"""What a caller hands to ``save`` and gets back from ``load``. Pure: no I/O.

Invariant: a :class:`CheckpointData` that was constructed is consistent — every name
and partition is valid, no ``(operator, partition)`` is both a snapshot and a delta,
deltas come with the parent they apply to, and every number is in the range its
manifest accepts (epoch in 0..2**63-1, timestamp no later than year 9999, see
:mod:`cairn.format.manifest`) — so a save never starts writing for input it would have to
reject half-way, nor commits a manifest that readers would take for damage.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from cairn.data.inputs import ArtifactData, check_artifact_data
from cairn.data.keyed import KeyedSnapshot, check_keyed
from cairn.errors import InvalidCheckpointDataError, InvalidInputError, InvalidNameError
from cairn.format._buffer import Buffer, raw_bytes
from cairn.format._validate import is_int
from cairn.format.ids import CheckpointId
from cairn.format.layout import validate_name, validate_partition
from cairn.format.manifest import (
    MAX_INT64,
    MAX_TIMESTAMP_MS,
    CheckpointManifest,
    FileEntry,
    PartitionSnapshotEntry,
    SourceOffsetEntry,
    check_source_offset,
)

__all__ = ["ArtifactKey", "ChainLink", "CheckpointData", "DirectoryCheck", "LoadedCheckpoint"]

ArtifactKey: TypeAlias = tuple[str, int]
"""``(operator, partition)``."""

DirectoryCheck: TypeAlias = Literal["mtime", "hash"]
"""How an incremental save decides that a directory's file is unchanged (see
:class:`CheckpointData`)."""


def _is_int_in(value: object, low: int, high: int) -> bool:
    return is_int(value) and low <= value <= high


def _check_artifacts(kind: str, artifacts: object) -> dict[ArtifactKey, ArtifactData]:
    if not isinstance(artifacts, Mapping):
        raise InvalidCheckpointDataError(f"{kind} must map (operator, partition) to bytes")
    checked: dict[ArtifactKey, ArtifactData] = {}
    for key, data in artifacts.items():
        checked_key = _checked_key(kind, key)
        try:
            check_artifact_data(f"{kind}[{key!r}]", data)
        except InvalidInputError as exc:
            raise InvalidCheckpointDataError(str(exc)) from None
        checked[checked_key] = data
    return checked


def _checked_key(kind: str, key: object) -> ArtifactKey:
    """``key`` as an (operator, partition) pair, both valid, or a typed error naming it."""
    if not isinstance(key, tuple) or len(key) != 2:
        raise InvalidCheckpointDataError(f"{kind} key must be (operator, partition), got {key!r}")
    operator, partition = key
    validate_name("operator", operator)
    validate_partition(partition)
    return (operator, partition)


def _check_directories(directories: object) -> dict[ArtifactKey, Path]:
    if not isinstance(directories, Mapping):
        raise InvalidCheckpointDataError("directories must map (operator, partition) to a path")
    checked: dict[ArtifactKey, Path] = {}
    for key, path in directories.items():
        checked_key = _checked_key("directories", key)
        if not isinstance(path, str | os.PathLike):
            raise InvalidCheckpointDataError(
                f"directories[{key!r}] must be a path, got {type(path).__name__}"
            )
        checked[checked_key] = Path(path)
    return checked


@dataclass(frozen=True, slots=True)
class CheckpointData:
    """One checkpoint to save.

    A directory partition is saved file by file: every regular file under it,
    recursively, with its relative path, size and SHA-256 (empty subdirectories are not
    kept). With a ``parent_id``, a file the parent's partition already holds is carried
    by reference instead of uploaded.

    Args:
        epoch: The epoch the checkpoint records, an int in 0..2**63-1.
        snapshots: ``(operator, partition)`` to the full state of that partition:
            bytes-like, a :class:`pathlib.Path`, a binary file, an iterable of chunks,
            or a :class:`~cairn.data.keyed.KeyedSnapshot` (keyed state by key group).
        deltas: ``(operator, partition)`` to a delta on the parent's state, in the same
            forms; needs ``parent_id``. A partition is a snapshot or a delta, not both.
        source_offsets: A source name to its :class:`SourceOffsetEntry`.
        watermark: The watermark the checkpoint records (a signed 64-bit int), or None.
        parent_id: The checkpoint this one builds on (deltas, carried files), or None.
        checkpoint_id: The id to save under; None (the default) generates a new one.
        timestamp_ms: The commit time to record, in ms since the Unix epoch; None (the
            default) is now. For copies that keep their original's commit time.
        directories: ``(operator, partition)`` to a local directory to save, file by file.
        directory_check: How "the parent already holds this file" is decided:
            ``"mtime"`` (the default) trusts an equal relative path, size and
            modification time (ns) without reading the file, as rsync does, so a file
            rewritten in place with its size and mtime unchanged is carried stale;
            ``"hash"`` reads and hashes every file and carries only one whose SHA-256
            and size are equal.

    Raises:
        InvalidCheckpointDataError: A value is out of range or inconsistent (a delta
            without parent, a partition given twice, its own parent, ...); the message
            names it.
        InvalidNameError: An operator or source name, or a partition, is not allowed.
        KeySpaceMismatchError: The keyed partitions of an operator overlap in key
            groups, disagree on the key-group count, or mix with other state.
        SpecialFileError: A directory to save holds a symbolic link or special file.
    """

    epoch: int
    snapshots: Mapping[ArtifactKey, ArtifactData] = field(default_factory=dict)
    deltas: Mapping[ArtifactKey, ArtifactData] = field(default_factory=dict)
    source_offsets: Mapping[str, SourceOffsetEntry] = field(default_factory=dict)
    watermark: int | None = None
    parent_id: CheckpointId | None = None
    checkpoint_id: CheckpointId | None = None
    timestamp_ms: int | None = None
    directories: Mapping[ArtifactKey, str | os.PathLike[str]] = field(default_factory=dict)
    directory_check: DirectoryCheck = "mtime"
    generated_id: bool = field(default=False, init=False, compare=False)
    """Whether the id was generated here (a new UUIDv7: no checkpoint can hold it yet),
    not given."""

    def __post_init__(self) -> None:
        if not _is_int_in(self.epoch, 0, MAX_INT64):
            raise InvalidCheckpointDataError(
                f"epoch must be an int in 0..{MAX_INT64}, got {self.epoch!r}"
            )
        snapshots = _check_artifacts("snapshots", self.snapshots)
        deltas = _check_artifacts("deltas", self.deltas)
        both = sorted(set(snapshots) & set(deltas))
        if both:
            raise InvalidCheckpointDataError(
                f"(operator, partition) {both[0]!r} is given both as snapshot and as delta"
            )
        check_keyed(
            [(op, p, False, d) for (op, p), d in snapshots.items()]
            + [(op, p, True, d) for (op, p), d in deltas.items()]
        )
        directories = _check_directories(self.directories)
        overlap = sorted(set(directories) & (set(snapshots) | set(deltas)))
        if overlap:
            raise InvalidCheckpointDataError(
                f"(operator, partition) {overlap[0]!r} is given both as a directory and as "
                "an artifact"
            )
        if self.directory_check not in ("mtime", "hash"):
            raise InvalidCheckpointDataError(
                f"directory_check must be 'mtime' or 'hash', got {self.directory_check!r}"
            )
        if deltas and self.parent_id is None:
            raise InvalidCheckpointDataError(
                f"delta {min(deltas)!r} needs a parent_id: a delta applies to a parent's state"
            )
        if not isinstance(self.source_offsets, Mapping):
            raise InvalidCheckpointDataError("source_offsets must map a source name to an entry")
        for source, entry in self.source_offsets.items():
            validate_name("source", source)
            if not isinstance(entry, SourceOffsetEntry):
                raise InvalidCheckpointDataError(
                    f"source_offsets[{source!r}] must be a SourceOffsetEntry, got {entry!r}"
                )
            try:
                check_source_offset(source, entry)
            except InvalidNameError:
                raise
            except InvalidInputError as exc:
                raise InvalidCheckpointDataError(str(exc)) from None
        if self.watermark is not None and not _is_int_in(self.watermark, -MAX_INT64 - 1, MAX_INT64):
            raise InvalidCheckpointDataError(
                f"watermark must be a signed 64-bit int, got {self.watermark!r}"
            )
        if self.timestamp_ms is not None and not _is_int_in(self.timestamp_ms, 0, MAX_TIMESTAMP_MS):
            raise InvalidCheckpointDataError(
                f"timestamp_ms must be an int in 0..{MAX_TIMESTAMP_MS} (up to year 9999), "
                f"got {self.timestamp_ms!r}"
            )
        for name in ("parent_id", "checkpoint_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, CheckpointId):
                raise InvalidCheckpointDataError(f"{name} must be a CheckpointId, got {value!r}")
        if self.checkpoint_id is None:
            object.__setattr__(self, "checkpoint_id", CheckpointId.now())
            object.__setattr__(self, "generated_id", True)
        if self.parent_id is not None and self.parent_id == self.checkpoint_id:
            raise InvalidCheckpointDataError(f"checkpoint {self.checkpoint_id} is its own parent")
        object.__setattr__(self, "snapshots", snapshots)
        object.__setattr__(self, "deltas", deltas)
        object.__setattr__(self, "directories", directories)
        object.__setattr__(self, "source_offsets", dict(self.source_offsets))

    @property
    def id(self) -> CheckpointId:
        """The checkpoint id (generated at construction when none was given)."""
        assert self.checkpoint_id is not None
        return self.checkpoint_id

    def copied(self) -> CheckpointData:
        """The same checkpoint (same id) whose buffer artifacts are private copies.

        For :meth:`~cairn.ObjectStoreCheckpointer.save_async` with ``copy=True``: the
        caller may then reuse its buffers at once. Files and streams are not copied (they
        are read while the save runs).

        Returns:
            A copy of this checkpoint data.
        """

        def own(artifacts: Mapping[ArtifactKey, ArtifactData]) -> dict[ArtifactKey, ArtifactData]:
            return {
                key: bytes(view)
                if (view := raw_bytes(data, f"artifact {key!r}")) is not None
                else data.copied()
                if isinstance(data, KeyedSnapshot)
                else data
                for key, data in artifacts.items()
            }

        copy = dataclasses.replace(self, snapshots=own(self.snapshots), deltas=own(self.deltas))
        object.__setattr__(copy, "generated_id", self.generated_id)
        return copy


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One verified artifact of a partition's restore chain.

    Attributes:
        entry: The artifact's manifest entry.
        owner: The checkpoint whose directory stores it.
        data: Its bytes, digest checked.
    """

    entry: PartitionSnapshotEntry
    owner: CheckpointId
    data: Buffer


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """A checkpoint read back from the store, every digest checked (unless told not to).

    Attributes:
        manifest: The checkpoint's manifest.
        artifacts: ``(operator, partition)`` to the newest bytes stored for it (its
            snapshot, or its latest delta).
        source_offsets: A source name to its offsets.
        chains: Per partition, the base snapshot and then every delta in order, which is
            what an engine applies to restore.
        directories: Per partition saved as a directory, its files (none of their bytes
            is read by ``load``: restore one with ``restore_directory``).
    """

    manifest: CheckpointManifest
    artifacts: dict[ArtifactKey, Buffer]
    source_offsets: dict[str, SourceOffsetEntry]
    chains: dict[ArtifactKey, list[ChainLink]]
    directories: dict[ArtifactKey, list[FileEntry]] = field(default_factory=dict)

    @property
    def checkpoint_id(self) -> CheckpointId:
        """The id of the loaded checkpoint."""
        return self.manifest.checkpoint_id

    @property
    def epoch(self) -> int:
        """The epoch of the loaded checkpoint."""
        return self.manifest.epoch
