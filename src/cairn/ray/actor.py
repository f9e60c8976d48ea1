"""What a user writes for a streaming job on Ray: the keyed state of a partition, and the
stream it reads.

A :class:`PartitionActor` holds the keyed state of one partition of the job: the key
groups ``KeyGroups.groups_of(worker, workers)`` gives it. Its four methods are the whole
of its contract with cairn: :meth:`~PartitionActor.key_of` (the key of a record, which
decides the group and so the partition that processes it),
:meth:`~PartitionActor.process` (apply one record to the state),
:meth:`~PartitionActor.snapshot` (the state, group by group, as bytes) and
:meth:`~PartitionActor.restore` (the reverse). cairn makes one afresh for every restore,
so a restore never starts from state left by a failed epoch.

A :class:`Source` is a replayable stream of a fixed number of partitions, each read by
offset, as a Kafka topic is: reading a partition again from an offset gives the same
records. That is what makes a restore exactly-once: the offsets a checkpoint records are
where the restored job reads on.

Neither class imports Ray: both are plain Python, pickled into the actors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from cairn.errors import InvalidInputError
from cairn.format.keygroups import KeyGroups
from cairn.format.layout import validate_name
from cairn.integrations._interface import Buffer, is_int

__all__ = ["PartitionActor", "Source"]


class PartitionActor(ABC):
    """The keyed state of one partition of a streaming job; subclass it.

    cairn sets :attr:`worker`, :attr:`workers`, :attr:`key_groups` and :attr:`groups`
    before it calls :meth:`restore`, and then hands :meth:`process` only records whose
    key falls in :attr:`groups`. The constructor takes the ``actor_args`` and
    ``actor_kwargs`` given to :class:`~cairn.ray.StreamJob`.
    """

    worker: int
    """This partition's index, from 0."""
    workers: int
    """How many partitions the job has now."""
    key_groups: KeyGroups
    """The job's key space, fixed for the life of its state."""
    groups: range
    """The key groups this partition holds: ``key_groups.groups_of(worker, workers)``."""

    @abstractmethod
    def key_of(self, record: Any) -> bytes:
        """The key of ``record``: its key group decides which partition processes it.

        Args:
            record: A record the source gave.

        Returns:
            The key's bytes.
        """

    @abstractmethod
    def process(self, record: Any) -> None:
        """Apply one record, whose key is in :attr:`groups`, to the state.

        Args:
            record: The record.
        """

    @abstractmethod
    def snapshot(self) -> Mapping[int, Buffer]:
        """The state, at a barrier: each key group of :attr:`groups` that holds state, to
        its bytes (a group left out restores as absent).

        Returns:
            Group to bytes.
        """

    @abstractmethod
    def restore(self, groups: Mapping[int, Buffer]) -> None:
        """Take the state :meth:`snapshot` gave, for this partition's groups, whichever
        partitions saved them (empty on a job's first start).

        Args:
            groups: Group to the bytes a snapshot gave for it.
        """


class Source(ABC):
    """A replayable stream of ``partitions`` partitions, each read by offset; subclass it.

    Args:
        name: The source's name in checkpoints (a safe name, as operators have).
        partitions: How many partitions, fixed for the life of the job, >= 1.
        source_type: What checkpoints record as the source's type.

    Raises:
        InvalidInputError: ``partitions`` is not an int >= 1, or ``name`` not a safe name.
    """

    def __init__(self, name: str, partitions: int, source_type: str = "cairn-ray-source") -> None:
        if not is_int(partitions) or partitions < 1:
            raise InvalidInputError(f"partitions must be an int >= 1, got {partitions!r}")
        self.name = validate_name("source", name)
        self.partitions = partitions
        self.source_type = source_type

    @abstractmethod
    def read(self, partition: int, offset: int, limit: int) -> Sequence[Any]:
        """Up to ``limit`` records of ``partition`` from ``offset`` on: the same records
        every time it is asked, and none once the partition holds no record at
        ``offset`` (a bounded stream has ended; an unbounded one has nothing yet).

        Args:
            partition: The partition, ``0 <= partition < partitions``.
            offset: Records of the partition before it were read already.
            limit: The most records to return, >= 1.

        Returns:
            The records, in offset order.
        """
