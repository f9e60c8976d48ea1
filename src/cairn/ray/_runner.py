"""The Ray actor that runs one partition of a streaming job: the user's
:class:`~cairn.ray.PartitionActor`, its share of the source, its barriers.

Partition ``worker`` of ``workers`` reads the source partitions ``s`` with
``s % workers == worker`` and holds the key groups ``groups_of(worker, workers)``. A
round is :meth:`PartitionRunner.poll` (read a batch of its source partitions, route each
record to the partition that owns its key's group) then :meth:`PartitionRunner.apply`
(process the records routed to it); the coordinator starts a round only when the last
one has ended everywhere, so between rounds no record is in flight and a barrier there
is aligned.

Invariants:

* nothing is processed, and no barrier is answered, before :meth:`~PartitionRunner.restore`:
  an actor Ray restarts comes back empty and refuses work until the coordinator restores
  it (:class:`NotRestoredError`);
* a restore builds a fresh user object from the checkpoint's groups of this partition
  only (``load_key_groups``, each group verified) and the checkpoint's offsets of its
  source partitions: nothing from before survives it;
* a barrier is answered only for a ``(generation, epoch)`` above the last one this actor
  restored or answered: an older generation is :class:`~cairn.FencedError`, an older or
  repeated epoch :class:`~cairn.InvalidInputError`;
* :meth:`~PartitionRunner.confirm` answers with the token of this incarnation, so the
  coordinator can tell that the actor that reported is the one still running.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from cairn.data.keyed import KeyedSnapshot
from cairn.errors import CheckpointerError, FencedError, InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.integrations.distributed import upload_partitions
from cairn.ray._spec import CountingStore, JobSpec, open_checkpointer
from cairn.ray.actor import PartitionActor

__all__ = ["NotRestoredError", "PartitionRunner", "offset_name", "source_partitions"]


class NotRestoredError(CheckpointerError):
    """The partition actor has not been restored since it (re)started: it refuses work."""


def source_partitions(worker: int, workers: int, partitions: int) -> list[int]:
    """The source partitions partition ``worker`` of ``workers`` reads: dealt round-robin.

    Args:
        worker: The partition's index.
        workers: How many partitions.
        partitions: How many source partitions.

    Returns:
        Its source partitions, ascending.
    """
    return [s for s in range(partitions) if s % workers == worker]


def offset_name(partition: int) -> str:
    """The name of a source partition's offset in a checkpoint's source record."""
    return str(partition)


class PartitionRunner:
    """Partition ``worker`` of ``workers`` of the job ``spec``; made a Ray actor by the
    coordinator."""

    def __init__(self, spec: JobSpec, worker: int, workers: int) -> None:
        self.spec = spec
        self.worker = worker
        self.workers = workers
        self.incarnation = uuid.uuid4().hex
        self.user: PartitionActor | None = None
        self.offsets: dict[int, int] = {}
        self.stamp = (-1, -1)  # (generation, epoch) of the last restore or barrier
        self._ckpt: tuple[Any, CountingStore] | None = None

    def _checkpointer(self) -> tuple[Any, CountingStore]:
        if self._ckpt is None:  # opened on the actor's event loop, at first use
            self._ckpt = open_checkpointer(self.spec)
        return self._ckpt

    def _restored(self) -> PartitionActor:
        if self.user is None:
            raise NotRestoredError(
                f"partition {self.worker} has not been restored since it started "
                f"(incarnation {self.incarnation})"
            )
        return self.user

    async def ping(self) -> tuple[int, str]:
        """This actor's process id and incarnation token."""
        return os.getpid(), self.incarnation

    async def restore(
        self, generation: int, epoch: int, checkpoint_id: str | None
    ) -> dict[str, Any]:
        """Restore from ``checkpoint_id`` (None: start empty, at offset 0) for the
        coordinator of ``generation``, whose last committed epoch is ``epoch``.

        Returns what was read: the bytes, the groups, the offsets.
        """
        spec = self.spec
        user = spec.actor(*spec.actor_args, **dict(spec.actor_kwargs))
        user.worker, user.workers, user.key_groups = self.worker, self.workers, spec.key_groups
        user.groups = spec.key_groups.groups_of(self.worker, self.workers)
        mine = source_partitions(self.worker, self.workers, spec.source.partitions)
        offsets = dict.fromkeys(mine, 0)
        groups: Mapping[int, Any] = {}
        ckpt, store = self._checkpointer()
        before = store.bytes_read
        if checkpoint_id is not None:
            cid = CheckpointId.parse(checkpoint_id)
            groups = await ckpt.load_key_groups(
                cid, spec.operator, user.groups, key_groups=spec.key_groups
            )
            manifest = await ckpt.load_manifest(cid)
            recorded = manifest.source_offsets[spec.source.name].offsets
            offsets = {s: int(recorded[offset_name(s)]) for s in mine}
        user.restore(groups)
        self.user, self.offsets, self.stamp = user, offsets, (generation, epoch)
        return {
            "worker": self.worker,
            "checkpoint": checkpoint_id,
            "groups": [user.groups.start, user.groups.stop],
            "restored_groups": len(groups),
            "bytes_read": store.bytes_read - before,
            "pid": os.getpid(),
        }

    async def poll(self, until: int | None) -> tuple[Any, ...]:
        """Read a batch of each of this partition's source partitions (up to offset
        ``until``, None: no bound) and route each record to the partition that owns its
        key's group: one list per partition, then how many records were read."""
        user, spec = self._restored(), self.spec
        routes: list[list[Any]] = [[] for _ in range(self.workers)]
        read = 0
        for partition, offset in self.offsets.items():
            limit = spec.batch if until is None else min(spec.batch, until - offset)
            if limit <= 0:
                continue
            records = spec.source.read(partition, offset, limit)
            for record in records:
                group = spec.key_groups.group_of(user.key_of(record))
                routes[spec.key_groups.owner_of(group, self.workers)].append(record)
            self.offsets[partition] = offset + len(records)
            read += len(records)
        return (*routes, read)

    async def apply(self, *routed: list[Any]) -> int:
        """Process the records every partition routed here this round; how many."""
        user = self._restored()
        count = 0
        for records in routed:
            for record in records:
                user.process(record)
            count += len(records)
        return count

    async def barrier(self, generation: int, epoch: int, checkpoint_id: str) -> dict[str, Any]:
        """Snapshot this partition's groups and upload them as partition ``worker`` of
        checkpoint ``checkpoint_id`` (epoch ``epoch`` of the coordinator of
        ``generation``); the report, the offsets of its source partitions and this
        incarnation's token."""
        user = self._restored()
        seen_generation, seen_epoch = self.stamp
        if generation < seen_generation:
            raise FencedError(generation, seen_generation)
        if generation == seen_generation and epoch <= seen_epoch:
            raise InvalidInputError(
                f"barrier of epoch {epoch} refused by partition {self.worker}: "
                f"it has restored or answered epoch {seen_epoch} already"
            )
        self.stamp = (generation, epoch)
        groups = dict(user.snapshot())
        stray = sorted(set(groups) - set(user.groups))
        if stray:
            raise InvalidInputError(
                f"partition {self.worker} snapshot holds key group {stray[0]}, outside its "
                f"groups {user.groups.start}..{user.groups.stop - 1}"
            )
        ckpt, _ = self._checkpointer()
        report = await upload_partitions(
            ckpt,
            CheckpointId.parse(checkpoint_id),
            [(self.spec.operator, self.worker, False, KeyedSnapshot(self.spec.key_groups, groups))],
            worker=f"partition-{self.worker}",
        )
        return {
            "report": report.to_json(),
            "offsets": {offset_name(s): n for s, n in self.offsets.items()},
            "incarnation": self.incarnation,
        }

    async def confirm(self) -> str:
        """This incarnation's token, once restored: asked before a commit."""
        self._restored()
        return self.incarnation
