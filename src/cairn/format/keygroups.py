"""Key groups: the fixed key space of an operator's keyed state, and who holds which part.

Keyed state is cut into ``count`` key groups (Flink's *max parallelism*): a key belongs
to one group for the life of the state, whatever the number of workers. Worker ``i`` of
``n`` holds a contiguous range of groups, computed as Flink's
``KeyGroupRangeAssignment`` computes it, so a job restored at another parallelism reads
exactly the groups of its new range. docs/format.md, section "Key groups", specifies the
hash and the manifest records.

Invariants (pure, no I/O):

* :meth:`KeyGroups.group_of` is the hash :data:`KEY_GROUP_HASH` names: the first 8 bytes
  of the key's SHA-256, big-endian, modulo ``count``. It depends on the key's bytes and
  the count alone, never on the platform, the process or the cairn version; a change to
  it would be a new hash name, never a new meaning of this one;
* for every ``workers`` >= 1, the ranges of :meth:`KeyGroups.groups_of` are contiguous,
  disjoint, in worker order, and cover ``0..count-1`` exactly; :meth:`KeyGroups.owner_of`
  of a group is the worker whose range holds it (with more workers than groups, some
  workers hold none);
* a set of groups is recorded as runs (:func:`to_runs`): sorted, disjoint, non-adjacent
  half-open ``[start, end)`` pairs, so one set has exactly one encoding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cairn.errors import KeyGroupError
from cairn.format._buffer import Buffer, raw_bytes
from cairn.format._validate import is_int

__all__ = [
    "KEY_GROUP_HASH",
    "MAX_KEY_GROUPS",
    "KeyGroups",
    "from_runs",
    "to_runs",
]

KEY_GROUP_HASH = "sha256-u64-mod/1"
"""The name and version of :meth:`KeyGroups.group_of`: ``int.from_bytes(sha256(key)[:8],
"big") % count``. Recorded in docs/format.md; it never changes meaning."""

MAX_KEY_GROUPS = 32768
"""The most key groups an operator's state may have: 2**15, Flink's largest max
parallelism. Each group costs 40 bytes of its partition's range index."""


@dataclass(frozen=True, slots=True)
class KeyGroups:
    """The key space of one operator's keyed state: ``count`` key groups, fixed for the
    life of the state (the most workers that can each hold a part of it).

    Args:
        count: How many key groups, an int in 1..:data:`MAX_KEY_GROUPS`.

    Raises:
        KeyGroupError: ``count`` is not an int in 1..:data:`MAX_KEY_GROUPS`.
    """

    count: int

    def __post_init__(self) -> None:
        if not is_int(self.count) or not 1 <= self.count <= MAX_KEY_GROUPS:
            raise KeyGroupError("key-group count", self.count, f"1..{MAX_KEY_GROUPS}")

    def group_of(self, key: Buffer) -> int:
        """The key group of ``key``, by the stable hash :data:`KEY_GROUP_HASH` names.

        Args:
            key: The key's bytes (any bytes-like object).

        Returns:
            The group, in ``0..count-1``.

        Raises:
            KeyGroupError: ``key`` is not bytes-like.
        """
        view = raw_bytes(key, "key") if not isinstance(key, bytes) else memoryview(key)
        if view is None:
            raise KeyGroupError("key", key, "bytes-like")
        digest = hashlib.sha256(view).digest()
        return int.from_bytes(digest[:8], "big") % self.count

    def groups_of(self, worker: int, workers: int) -> range:
        """The contiguous groups worker ``worker`` of ``workers`` holds (Flink's
        ``computeKeyGroupRangeForOperatorIndex``): from ``ceil(worker * count /
        workers)`` to ``floor(((worker + 1) * count - 1) / workers)``, inclusive. Empty
        for some workers when there are more workers than groups.

        Args:
            worker: The worker's index, in ``0..workers-1``.
            workers: How many workers, an int >= 1.

        Returns:
            The worker's groups, a range with step 1.

        Raises:
            KeyGroupError: ``workers`` is below 1, or ``worker`` is not in range.
        """
        _check_workers(workers)
        if not is_int(worker) or not 0 <= worker < workers:
            raise KeyGroupError("worker index", worker, f"0..{workers - 1}")
        start = (worker * self.count + workers - 1) // workers
        end = ((worker + 1) * self.count - 1) // workers
        return range(start, end + 1)

    def owner_of(self, group: int, workers: int) -> int:
        """The worker of ``workers`` whose range (:meth:`groups_of`) holds ``group``.

        Args:
            group: A key group, in ``0..count-1``.
            workers: How many workers, an int >= 1.

        Returns:
            The worker's index.

        Raises:
            KeyGroupError: ``group`` is not in range, or ``workers`` is below 1.
        """
        self.check_group(group)
        _check_workers(workers)
        return group * workers // self.count

    def check_group(self, group: object) -> int:
        """``group`` if it is a group of this key space.

        Args:
            group: A value to check.

        Returns:
            The group.

        Raises:
            KeyGroupError: ``group`` is not an int in ``0..count-1``.
        """
        if not is_int(group) or not 0 <= group < self.count:
            raise KeyGroupError("key group", group, f"0..{self.count - 1}")
        return group


def _check_workers(workers: object) -> None:
    if not is_int(workers) or workers < 1:
        raise KeyGroupError("worker count", workers, "1 or more")


def to_runs(groups: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``groups`` as runs: sorted, disjoint, non-adjacent ``(start, end)`` pairs, ``end``
    excluded (the one encoding of a set of groups).

    Args:
        groups: Groups, in any order, each once.

    Returns:
        The runs.
    """
    runs: list[list[int]] = []
    for group in sorted(groups):
        if runs and runs[-1][1] == group:
            runs[-1][1] = group + 1
        else:
            runs.append([group, group + 1])
    return tuple((start, end) for start, end in runs)


def from_runs(runs: Sequence[Sequence[int]]) -> list[int]:
    """The groups ``runs`` (:func:`to_runs`) hold, ascending.

    Args:
        runs: ``(start, end)`` pairs, ``end`` excluded.

    Returns:
        The groups.
    """
    return [group for start, end in runs for group in range(start, end)]
