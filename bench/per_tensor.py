"""The per-tensor DCP layout, as the baseline of benchmarks that compare layouts.

Before one object per rank, ``CairnWriter`` stored a tensor of at least
:data:`OWN_ARTIFACT_BYTES` as an object of its own and packed smaller items, in plan
order, into bundles of up to :data:`BUNDLE_BYTES`, each item's record in DCP's metadata
pickled whole. :class:`PerTensorWriter` writes that layout, so that a benchmark compares
both in one run; cairn still reads checkpoints in it (``tests/dcp/test_torch_old_layout.py``).
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import functools
import io
from collections.abc import Awaitable, Callable
from typing import Any

from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from cairn.checkpointer import PartitionUpload
from cairn.format.ids import CheckpointId
from cairn.format.integrity import sha256_hex
from cairn.integrations._interface import Entry, SaveMeter
from cairn.torch import CairnWriter
from cairn.torch._carry import Carried, carried_items
from cairn.torch._format import ItemRecord
from cairn.torch._rankobject import Resolved, Written
from cairn.torch._runtime import run
from cairn.torch._writer import COPY_BUDGET, _PlanData

OWN_ARTIFACT_BYTES = 1 << 20
"""A tensor of at least this many bytes is an artifact of its own."""

BUNDLE_BYTES = 8 << 20
"""Smaller items are packed into bundles of at most this many
bytes (one item may exceed it alone only if it is a byte item larger than that)."""


class ConcatReader(io.RawIOBase):
    """A seekable, read-only file over buffers laid end to end, read without joining them.

    cairn uploads it as a stream (a copy of one chunk at a time) and can reopen it when a
    transient failure makes the upload retry, since it seeks.
    """

    def __init__(self, parts: list[memoryview]) -> None:
        super().__init__()
        self._parts = parts
        self._starts: list[int] = []
        self._ends: list[int] = []
        total = 0
        for part in parts:
            self._starts.append(total)
            total += part.nbytes
            self._ends.append(total)
        self._size = total
        self._pos = 0

    @property
    def size(self) -> int:
        """The total size in bytes."""
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        written = 0
        index = self._part_at(self._pos)
        while written < out.nbytes and index < len(self._parts):
            part = self._parts[index]
            start = self._pos - self._starts[index]
            count = min(part.nbytes - start, out.nbytes - written)
            out[written : written + count] = part[start : start + count]
            written += count
            self._pos += count
            index += 1
        return written

    def _part_at(self, position: int) -> int:
        """The index of the first part that holds ``position`` (empty parts are skipped)."""
        index = bisect.bisect_right(self._starts, position) - 1
        while 0 <= index < len(self._parts) and position >= self._ends[index]:
            index += 1
        return max(index, 0)


@dataclasses.dataclass
class _Artifact:
    """One artifact being built: its items' bytes, in order."""

    partition: int
    parts: list[memoryview] = dataclasses.field(default_factory=list)
    items: list[tuple[WriteItem, int, str, tuple[int, ...]]] = dataclasses.field(
        default_factory=list
    )  # (item, offset, dtype name, shape)
    owners: list[object] = dataclasses.field(default_factory=list)  # keep the memory alive
    size: int = 0

    def add(self, item: WriteItem, view: memoryview, owner: object, dtype: str, shape: Any) -> None:
        self.items.append((item, self.size, dtype, tuple(int(n) for n in shape)))
        self.parts.append(view)
        self.owners.append(owner)
        self.size += view.nbytes


class _Batch:
    """Items resolved and laid out into artifacts, not uploaded yet."""

    def __init__(self, first_partition: int) -> None:
        self.next_partition = first_partition
        self.artifacts: list[_Artifact] = []
        self._bundle: _Artifact | None = None
        self.copied = 0

    def add(self, item: WriteItem, data: object) -> None:
        """Lay out ``item``, resolved to ``data``, into this batch's artifacts."""
        self.place(item, Resolved.of(item, data))

    def place(self, item: WriteItem, resolved: Resolved) -> None:
        """Lay out ``item``'s bytes, already resolved, into this batch's artifacts."""
        view, owner, dtype, shape = resolved.view, resolved.owner, resolved.dtype, resolved.shape
        if item.type == WriteItemType.BYTE_IO:
            self._bundled(view.nbytes).add(item, view, owner, "", ())
            return
        self.copied += view.nbytes if resolved.copied else 0
        if view.nbytes >= OWN_ARTIFACT_BYTES:
            self._new_artifact().add(item, view, owner, dtype, shape)
        else:
            self._bundled(view.nbytes).add(item, view, owner, dtype, shape)

    def _new_artifact(self) -> _Artifact:
        artifact = _Artifact(self.next_partition)
        self.next_partition += 1
        self.artifacts.append(artifact)
        return artifact

    def _bundled(self, size: int) -> _Artifact:
        bundle = self._bundle
        if bundle is None or (bundle.size and bundle.size + size > BUNDLE_BYTES):
            bundle = self._bundle = self._new_artifact()
        return bundle


class PerTensorWriter(CairnWriter):
    """``CairnWriter`` writing the per-tensor layout (an object per tensor of 1 MiB or
    more, 8 MiB bundles): the same-run baseline of its one-object-per-rank layout."""

    def _write_rank_objects(
        self,
        cid: CheckpointId,
        operator: str,
        data: _PlanData,
        carry: dict[Any, Carried],
        plan: SavePlan,
        planner: SavePlanner,
        meter: SaveMeter,
    ) -> list[WriteResult]:
        """A tensor of :data:`OWN_ARTIFACT_BYTES` or more is an artifact of its own,
        smaller items go into bundles of :data:`BUNDLE_BYTES`. Items are resolved one by
        one; at most :data:`COPY_BUDGET` bytes of copies are held: what is resolved by
        then is uploaded first. (``meter`` is not kept: the baseline records no
        statistics.)"""
        results: list[WriteResult] = []
        batch = _Batch(data.first_partition)
        window: list[tuple[WriteItem, Resolved]] = []
        held = 0  # bytes of copies in the window
        for item in plan.items:
            resolved = Resolved.of(item, planner.resolve_data(item))
            window.append((item, resolved))
            held += resolved.view.nbytes if resolved.copied else 0
            if held + batch.copied > COPY_BUDGET:
                batch = self._lay_out(cid, operator, carry, window, batch, results)
                window, held = [], 0
        batch = self._lay_out(cid, operator, carry, window, batch, results)
        results += self._upload(cid, operator, batch)
        return results

    def _lay_out(
        self,
        cid: CheckpointId,
        operator: str,
        carry: dict[Any, Carried],
        window: list[tuple[WriteItem, Resolved]],
        batch: _Batch,
        results: list[WriteResult],
    ) -> _Batch:
        """Carry the items of ``window`` equal to the parent's, place the others into
        ``batch``, uploading it whenever its copies pass :data:`COPY_BUDGET`; the batch
        to go on with. Results are appended to ``results``."""
        matches = carried_items(
            [(carry.get(item.index), r.view, r.dtype, r.shape) for item, r in window]
        )
        for (item, resolved), carried in zip(window, matches, strict=True):
            if carried is not None:
                written = Written(carried.record, carried.operator, carried.entry)
                results.append(WriteResult(item.index, resolved.view.nbytes, written))
                continue
            batch.place(item, resolved)
            if batch.copied > COPY_BUDGET:
                results += self._upload(cid, operator, batch)
                batch = _Batch(batch.next_partition)
        return batch

    def _upload(self, cid: CheckpointId, operator: str, batch: _Batch) -> list[WriteResult]:
        upload = functools.partial(self.checkpointer.save_partitions_concurrent, cid)
        return run(upload_batch(upload, operator, batch), "CairnWriter.write_data")


Upload = Callable[[list[PartitionUpload]], Awaitable[list[Entry]]]
"""Uploads partitions of the checkpoint being saved; their entries, in order."""


async def upload_batch(upload: Upload, operator: str, batch: _Batch) -> list[WriteResult]:
    """Upload ``batch``'s artifacts as partitions of ``operator`` through ``upload``; a
    ``WriteResult`` per item, carrying its record and its artifact's entry."""
    if not batch.artifacts:
        return []
    uploads: list[PartitionUpload] = []
    item_digests: list[list[str]] = []
    for artifact in batch.artifacts:
        if len(artifact.parts) == 1:
            # One item: its digest is the artifact's, which cairn computes as it uploads.
            uploads.append((operator, artifact.partition, False, artifact.parts[0]))
            item_digests.append([""])
        else:
            # A bundle: each item gets a digest of its own, since a read takes one item's
            # range of the artifact.
            source = ConcatReader(artifact.parts)
            uploads.append((operator, artifact.partition, False, source))
            item_digests.append(await asyncio.to_thread(_digests, artifact.parts))
    entries = await upload(uploads)
    results: list[WriteResult] = []
    for artifact, (_, entry), digests_of in zip(
        batch.artifacts, entries, item_digests, strict=True
    ):
        for (item, offset, dtype, shape), part, digest in zip(
            artifact.items, artifact.parts, digests_of, strict=True
        ):
            record = ItemRecord(
                entry.path, offset, part.nbytes, digest or entry.sha256, dtype, shape
            )
            written = Written(record.stored(), operator, entry)
            results.append(WriteResult(item.index, part.nbytes, written))
    return results


def _digests(parts: list[memoryview]) -> list[str]:
    return [sha256_hex(part) for part in parts]
