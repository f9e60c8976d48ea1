"""Restoring at another parallelism: which worker reads which bytes. Pure: no I/O.

A :class:`RestorePlan` says, for each of ``workers`` new workers, which key groups of
each keyed operator it gets (:meth:`cairn.KeyGroups.groups_of`), which byte range of
which object holds each of them (:class:`GroupRead`, with the digest to check it
against), and which old partitions of each other operator it gets. It is plain data: an
engine computes it once (:meth:`~cairn.ObjectStoreCheckpointer.restore_plan` reads the
manifest and each keyed partition's range index) and ships each worker its part.

Non-keyed state is redistributed as Flink redistributes list state, in a mode the
caller names (:data:`NonKeyedMode`): ``"union"``, every worker gets every old
partition; ``"split"``, the old partitions, in ascending order, are dealt round-robin
to the new workers (the k-th to worker ``k % workers``).

Invariants: for every keyed operator, the groups of the workers are disjoint and cover
its whole key space; every group some partition holds is read by exactly the worker
whose range holds it, from exactly its range (no other bytes); a group no partition
holds has no read (it has no state).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from cairn.errors import InvalidInputError, KeyGroupError, KeySpaceMismatchError
from cairn.format._validate import is_int
from cairn.format.ids import CheckpointId
from cairn.format.keygroups import KeyGroups, from_runs
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.format.ranges import StoredRange

__all__ = [
    "NON_KEYED_MODES",
    "GroupRead",
    "KeyedAssignment",
    "KeyedObject",
    "NonKeyedMode",
    "RestorePlan",
    "WorkerRestore",
    "group_reads",
    "keyed_objects",
    "keyed_operators",
    "plan_restore",
]

NonKeyedMode: TypeAlias = Literal["union", "split"]
"""How old partitions of non-keyed state go to new workers: ``"union"`` (all to every
worker) or ``"split"`` (dealt round-robin)."""

NON_KEYED_MODES: tuple[str, ...] = ("union", "split")
"""The values of :data:`NonKeyedMode`."""


@dataclass(frozen=True, slots=True)
class GroupRead:
    """Where one key group's state is stored: ``length`` bytes from ``offset`` of the
    object at store ``path`` (partition ``partition``'s object of ranges), whose
    SHA-256 is ``sha256`` (of the decoded bytes, when ``decoded_size`` says the range is
    a compressed frame of that many bytes).

    Attributes:
        group: The key group.
        partition: The old partition whose object holds it.
        path: The object's store path.
        offset: Where its range starts in the object.
        length: Its range's length, as stored.
        sha256: The hex digest of its bytes (decoded).
        decoded_size: Its decoded length when the range is compressed, else None.
    """

    group: int
    partition: int
    path: str
    offset: int
    length: int
    sha256: str
    decoded_size: int | None = None


@dataclass(frozen=True, slots=True)
class KeyedObject:
    """One object of ranges a keyed partition reads groups from.

    Attributes:
        partition: The partition.
        path: The object's store path.
        entry: Its manifest entry.
        groups: The groups of its ranges, in index order.
        held: The groups of it the partition holds.
    """

    partition: int
    path: str
    entry: PartitionSnapshotEntry
    groups: tuple[int, ...]
    held: frozenset[int]


@dataclass(frozen=True, slots=True)
class KeyedAssignment:
    """One keyed operator's part of a new worker: its ``groups`` (contiguous) out of
    ``count``, and the ``reads`` of those that hold state, in path and offset order.

    Attributes:
        operator: The keyed operator.
        count: Its key-group count.
        groups: The groups the worker gets.
        reads: Where each of them that holds state is stored.
    """

    operator: str
    count: int
    groups: range
    reads: tuple[GroupRead, ...] = ()

    @property
    def bytes(self) -> int:
        """The stored bytes its reads take."""
        return sum(read.length for read in self.reads)


@dataclass(frozen=True, slots=True)
class WorkerRestore:
    """What new worker ``worker`` restores: per keyed operator its
    :class:`KeyedAssignment`, per other operator the old partitions it gets (artifact
    and directory partitions alike: restore them with ``load_chain`` or
    ``restore_directory``).

    Attributes:
        worker: The new worker's index.
        keyed: Keyed operator to the worker's part of it.
        partitions: Non-keyed operator to the old partitions the worker gets.
    """

    worker: int
    keyed: dict[str, KeyedAssignment] = field(default_factory=dict)
    partitions: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """How checkpoint ``checkpoint_id`` restores onto ``workers`` workers (see the
    module docstring): ``assignments[i]`` is worker ``i``'s part.

    Attributes:
        checkpoint_id: The checkpoint to restore.
        workers: How many new workers.
        non_keyed: Each non-keyed operator's mode.
        assignments: Each worker's part, by index.
    """

    checkpoint_id: CheckpointId
    workers: int
    non_keyed: Mapping[str, NonKeyedMode]
    assignments: tuple[WorkerRestore, ...]

    def worker(self, index: int) -> WorkerRestore:
        """Worker ``index``'s part.

        Args:
            index: A worker, in ``0..workers-1``.

        Returns:
            Its part of the plan.
        """
        return self.assignments[index]


def keyed_operators(manifest: CheckpointManifest) -> dict[str, KeyGroups]:
    """Each keyed operator of ``manifest`` (one whose entries record key groups) and its
    key space.

    Args:
        manifest: A checked manifest (whole: a root's parts assembled).

    Returns:
        Operator name to its key groups.
    """
    found: dict[str, KeyGroups] = {}
    for operator, entry in manifest.partition_entries():
        if entry.key_groups is not None:
            found[operator] = KeyGroups(entry.key_groups.count)
    return found


def keyed_objects(
    manifest: CheckpointManifest, paths: CheckpointPaths, operator: str
) -> list[KeyedObject]:
    """The objects of ranges the keyed partitions of ``operator`` read groups from: each
    partition's own, and those it carries groups of (an object shared by partitions
    after a rescale is listed once per partition).

    Args:
        manifest: A checked manifest.
        paths: The layout its checkpointer uses.
        operator: A keyed operator of it.

    Returns:
        The objects, by partition.

    Raises:
        KeySpaceMismatchError: ``operator`` has no keyed state in ``manifest``.
    """
    entries = manifest.operators.get(operator)
    found = [
        KeyedObject(
            entry.partition_id,
            paths.resolve(entry.owner or manifest.checkpoint_id, entry.path),
            entry,
            tuple(from_runs(entry.key_groups.groups)),
            frozenset(from_runs(entry.key_groups.held)),
        )
        for entry in (entries.partitions if entries is not None else ())
        if entry.key_groups is not None
    ]
    if not found:
        raise KeySpaceMismatchError(
            operator, f"checkpoint {manifest.checkpoint_id} holds no keyed state of it"
        )
    return found


def group_reads(
    objects: Sequence[KeyedObject],
    indexes: Mapping[str, Sequence[StoredRange]],
    groups: Iterable[int],
) -> list[GroupRead]:
    """The reads of ``groups`` (those some partition holds), given the range index of
    each object that holds one of them.

    Args:
        objects: The operator's :func:`keyed_objects`.
        indexes: An object's store path to its decoded range index
            (:func:`cairn.format.ranges.decode_index`).
        groups: Key groups of the operator, each in its key space.

    Returns:
        One read per group held, in path and offset order.

    Raises:
        InvalidInputError: An index needed is not in ``indexes``, or does not have one
            range per group of its object.
    """
    wanted = set(groups)
    reads: list[GroupRead] = []
    for held in objects:
        if wanted.isdisjoint(held.held):
            continue
        index = indexes.get(held.path)
        if index is None or len(index) != len(held.groups):
            raise InvalidInputError(
                f"{held.path!r}: its range index is "
                + (
                    "missing"
                    if index is None
                    else f"of {len(index)} ranges, not {len(held.groups)}"
                )
            )
        for group, stored in zip(held.groups, index, strict=True):
            if group in wanted and group in held.held:
                reads.append(
                    GroupRead(
                        group,
                        held.partition,
                        held.path,
                        stored.offset,
                        stored.length,
                        stored.sha256,
                        stored.decoded_size,
                    )
                )
    reads.sort(key=lambda read: (read.path, read.offset))
    return reads


def plan_restore(
    manifest: CheckpointManifest,
    paths: CheckpointPaths,
    indexes: Mapping[str, Sequence[StoredRange]],
    workers: int,
    non_keyed: NonKeyedMode | Mapping[str, NonKeyedMode] = "split",
) -> RestorePlan:
    """The plan to restore ``manifest`` onto ``workers`` workers.

    Args:
        manifest: A checked manifest (whole: a root's parts assembled).
        paths: The layout its checkpointer uses.
        indexes: The store path of every keyed object (:func:`keyed_objects`) to its
            decoded range index.
        workers: How many new workers, an int >= 1.
        non_keyed: How non-keyed state is redistributed: one mode for every operator,
            or a mode per operator (every non-keyed operator named).

    Returns:
        The plan.

    Raises:
        KeyGroupError: ``workers`` is below 1.
        InvalidInputError: ``non_keyed`` names a mode that is not one of
            :data:`NON_KEYED_MODES`, or leaves out a non-keyed operator.
    """
    keyed = keyed_operators(manifest)
    objects = {operator: keyed_objects(manifest, paths, operator) for operator in keyed}
    other: dict[str, set[int]] = {}
    for operator, entry in manifest.partition_entries():
        if operator not in keyed:
            other.setdefault(operator, set()).add(entry.partition_id)
    for directory in manifest.directories:
        other.setdefault(directory.operator, set()).add(directory.partition_id)
    modes = _modes(non_keyed, sorted(other))
    assignments = []
    if not is_int(workers) or workers < 1:
        raise KeyGroupError("worker count", workers, "1 or more")
    for worker in range(workers):
        assigned: dict[str, KeyedAssignment] = {}
        for operator, space in sorted(keyed.items()):
            groups = space.groups_of(worker, workers)
            reads = group_reads(objects[operator], indexes, groups)
            assigned[operator] = KeyedAssignment(operator, space.count, groups, tuple(reads))
        partitions = {
            operator: _deal(sorted(held), worker, workers, modes[operator])
            for operator, held in sorted(other.items())
        }
        assignments.append(WorkerRestore(worker, assigned, partitions))
    return RestorePlan(manifest.checkpoint_id, workers, modes, tuple(assignments))


def _modes(non_keyed: object, operators: list[str]) -> dict[str, NonKeyedMode]:
    if isinstance(non_keyed, str):
        chosen: Mapping[str, object] = dict.fromkeys(operators, non_keyed)
        if non_keyed not in NON_KEYED_MODES:
            raise InvalidInputError(
                f"non_keyed must be one of {', '.join(NON_KEYED_MODES)}, got {non_keyed!r}"
            )
    elif isinstance(non_keyed, Mapping):
        chosen = non_keyed
    else:
        raise InvalidInputError(
            f"non_keyed must be a mode or map operators to modes, got {type(non_keyed).__name__}"
        )
    modes: dict[str, NonKeyedMode] = {}
    for operator in operators:
        mode = chosen.get(operator)
        if mode == "union" or mode == "split":
            modes[operator] = mode
        else:
            raise InvalidInputError(
                f"non-keyed operator {operator!r} needs a mode ({', '.join(NON_KEYED_MODES)}), "
                f"got {mode!r}"
            )
    return modes


def _deal(partitions: list[int], worker: int, workers: int, mode: NonKeyedMode) -> tuple[int, ...]:
    if mode == "union":
        return tuple(partitions)
    return tuple(partitions[worker::workers])
