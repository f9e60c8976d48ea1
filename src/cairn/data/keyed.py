"""Keyed state to save: one partition's key groups, each its own range of one object.

A :class:`KeyedSnapshot` is the state of the key groups one worker held (see
:class:`~cairn.format.keygroups.KeyGroups`). Saved, it is one object of ranges
(:mod:`cairn.format.ranges`) with one range per group, in ascending group order, each
with its own SHA-256, and its manifest entry records the key-group count and the groups
(:class:`~cairn.format.manifest.KeyGroupEntry`), so a restore at any parallelism reads
any group alone with one ranged read.

Invariants:

* a constructed :class:`KeyedSnapshot` is consistent: every group is in its key space
  and every value bytes-like, checked before anything is uploaded;
* each group is hashed once per snapshot, over the caller's bytes, the first time the
  save reads it; an upload retried reads the same digests (the buffers must not change
  while the save runs, as for any buffer given to ``save``);
* a save with a parent leaves out of its upload exactly the groups it carries
  (:meth:`KeyedSnapshot.carry`, decided for that checkpoint id by
  :mod:`cairn.protocol._keyed`), and lists them as ranges of the objects that hold them;
* :func:`check_keyed` refuses, before any upload, keyed data that cannot make one key
  space: a keyed delta, partitions of one operator that overlap in groups, disagree on
  the count, or mix keyed and other state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping

from cairn.errors import InvalidCheckpointDataError, InvalidInputError, KeySpaceMismatchError
from cairn.format._buffer import Buffer, raw_bytes
from cairn.format.ids import CheckpointId
from cairn.format.integrity import INLINE_HASH_LIMIT, sha256_hex, sha256_hex_async
from cairn.format.keygroups import KeyGroups, to_runs
from cairn.format.manifest import KeyGroupEntry
from cairn.format.ranges import Range, RangeSource

__all__ = ["KeyedSnapshot", "KeyedUpload", "check_keyed"]


class KeyedSnapshot(RangeSource):
    """The keyed state of one partition, by key group: accepted wherever a snapshot is
    (``CheckpointData.snapshots``, ``save_partitions_concurrent``, ``upload_partitions``,
    two-phase saves), as the full state of that partition, never as a delta.

    Every partition of a keyed operator is a :class:`KeyedSnapshot` of the same
    :class:`~cairn.format.keygroups.KeyGroups`, and no two hold the same group. A group
    with no state may be left out (it is then held by no partition, and restores as
    absent), or given as empty bytes.

    Args:
        key_groups: The operator's key space.
        groups: Each group this partition holds to its state's bytes (bytes-like). The
            buffers are read in place while the save runs and must not change until it
            returns.

    Raises:
        KeyGroupError: A group is not in ``key_groups``.
        InvalidInputError: ``key_groups`` is not a :class:`KeyGroups`, ``groups`` not a
            mapping, or a value not bytes-like.
    """

    def __init__(self, key_groups: KeyGroups, groups: Mapping[int, Buffer]) -> None:
        if not isinstance(key_groups, KeyGroups):
            raise InvalidInputError(
                f"key_groups must be a KeyGroups, got {type(key_groups).__name__}"
            )
        if not isinstance(groups, Mapping):
            raise InvalidInputError(
                f"groups must map a key group to bytes, got {type(groups).__name__}"
            )
        for group in groups:
            key_groups.check_group(group)
        views: dict[int, memoryview] = {}
        for group in sorted(groups):
            view = raw_bytes(groups[group], f"key group {group}")
            if view is None:
                raise InvalidInputError(
                    f"key group {group} must be bytes-like, got {type(groups[group]).__name__}"
                )
            views[group] = view
        self.key_groups = key_groups
        self._views = views
        self._digests: dict[int, str] = {}
        self._carried: dict[CheckpointId, frozenset[int]] = {}

    def __repr__(self) -> str:
        return f"KeyedSnapshot(count={self.key_groups.count}, groups={len(self._views)})"

    @property
    def groups(self) -> tuple[int, ...]:
        """The groups this partition holds, ascending (the order of its ranges)."""
        return tuple(self._views)

    @property
    def record(self) -> KeyGroupEntry:
        """What its manifest entry records: the count and the groups, as runs."""
        return KeyGroupEntry(count=self.key_groups.count, groups=to_runs(self._views))

    def size_of(self, group: int) -> int:
        """The bytes of one group's state.

        Args:
            group: A group this partition holds.

        Returns:
            Its size in bytes.
        """
        return self._views[group].nbytes

    def copied(self) -> KeyedSnapshot:
        """The same snapshot over private copies of its buffers (for ``save_async`` with
        ``copy=True``).

        Returns:
            A copy whose groups the caller's later writes do not reach.
        """
        return KeyedSnapshot(self.key_groups, {g: bytes(v) for g, v in self._views.items()})

    def carry(self, checkpoint_id: CheckpointId, groups: Iterable[int]) -> None:
        """Record that the save of ``checkpoint_id`` carries ``groups`` of this snapshot
        by reference (their bytes equal a parent's): its upload leaves them out.

        Args:
            checkpoint_id: The checkpoint being saved.
            groups: Groups of this snapshot.
        """
        self._carried[checkpoint_id] = frozenset(groups) & self._views.keys()

    def uploaded_in(self, checkpoint_id: CheckpointId) -> KeyedUpload:
        """What the save of ``checkpoint_id`` uploads of this snapshot: every group but
        those it carries (:meth:`carry`).

        Args:
            checkpoint_id: The checkpoint being saved.

        Returns:
            The ranges to upload.
        """
        carried = self._carried.get(checkpoint_id, frozenset())
        return KeyedUpload(self, [g for g in self._views if g not in carried])

    def view_of(self, group: int) -> memoryview:
        """The bytes of one group's state, as given (not copied).

        Args:
            group: A group this partition holds.

        Returns:
            Its bytes.
        """
        return self._views[group]

    async def digests(self) -> dict[int, str]:
        """Each group's SHA-256 hex digest, computed once (the first read hashes).

        Returns:
            Group to digest, ascending.
        """
        for group, view in self._views.items():
            if group not in self._digests:
                large = view.nbytes > INLINE_HASH_LIMIT
                self._digests[group] = await sha256_hex_async(view) if large else sha256_hex(view)
        return dict(self._digests)

    async def _ranges(self) -> AsyncIterator[Range]:
        digests = await self.digests()
        for group, view in self._views.items():
            yield Range(view, digests[group])

    def open(self) -> AsyncIterator[Range]:
        """A fresh pass over its ranges: one per group, ascending.

        Returns:
            An async iterator of the ranges.
        """
        return self._ranges()


class KeyedUpload(RangeSource):
    """The groups of a :class:`KeyedSnapshot` one save uploads, as an object of ranges:
    one range per group, ascending, each with the digest the snapshot computed.

    Args:
        snapshot: The snapshot.
        groups: The groups of it to upload.
    """

    def __init__(self, snapshot: KeyedSnapshot, groups: Iterable[int]) -> None:
        self.snapshot = snapshot
        self.groups = tuple(sorted(groups))

    @property
    def record(self) -> KeyGroupEntry:
        """What the uploaded object's manifest entry records: the count and its groups."""
        return KeyGroupEntry(count=self.snapshot.key_groups.count, groups=to_runs(self.groups))

    async def _ranges(self) -> AsyncIterator[Range]:
        digests = await self.snapshot.digests()
        for group in self.groups:
            yield Range(self.snapshot.view_of(group), digests[group])

    def open(self) -> AsyncIterator[Range]:
        """A fresh pass over its ranges: one per group, ascending.

        Returns:
            An async iterator of the ranges.
        """
        return self._ranges()


def check_keyed(uploads: Iterable[tuple[str, int, bool, object]]) -> None:
    """Refuse keyed data that cannot make one key space, before anything is uploaded.

    Args:
        uploads: ``(operator, partition, is_delta, data)`` of one save (or of one
            worker's part of it).

    Raises:
        InvalidCheckpointDataError: A :class:`KeyedSnapshot` is given as a delta.
        KeySpaceMismatchError: Partitions of one operator mix keyed and other state,
            disagree on the key-group count, or overlap in groups.
    """
    per_operator: dict[str, list[tuple[int, bool, object]]] = {}
    for operator, partition, is_delta, data in uploads:
        if is_delta and isinstance(data, KeyedSnapshot):
            raise InvalidCheckpointDataError(
                f"({operator!r}, {partition}) is a KeyedSnapshot given as a delta: keyed "
                "state is saved whole, its unchanged groups carried by the save"
            )
        per_operator.setdefault(operator, []).append((partition, is_delta, data))
    for operator, items in per_operator.items():
        keyed = [(p, d) for p, _, d in items if isinstance(d, KeyedSnapshot)]
        if not keyed:
            continue
        if len(keyed) != len(items):
            other = next(p for p, _, d in items if not isinstance(d, KeyedSnapshot))
            raise KeySpaceMismatchError(
                operator,
                f"partition {other} is not a KeyedSnapshot while partition {keyed[0][0]} "
                "is: an operator's partitions are all keyed or none",
            )
        first_partition, first = keyed[0]
        holders: dict[int, int] = {}
        for partition, snapshot in keyed:
            if snapshot.key_groups != first.key_groups:
                raise KeySpaceMismatchError(
                    operator,
                    f"partition {partition} has {snapshot.key_groups.count} key groups, "
                    f"partition {first_partition} {first.key_groups.count}",
                )
            for group in snapshot.groups:
                holder = holders.setdefault(group, partition)
                if holder != partition:
                    raise KeySpaceMismatchError(
                        operator, f"partitions {holder} and {partition} both hold key group {group}"
                    )
