"""A DCP rank's items as one object of ranges (:mod:`cairn.ranges`). Uploads, no commit.

``CairnWriter`` stores a rank's uploaded items as one object, ``partition-{n}`` of
operator ``rank-{r}``: the items' bytes end to end, in plan order, then their index.
A rank whose items add up to more than :data:`RANK_OBJECT_BYTES` gets one object per
that many bytes (split between items, never inside one). The object is one streamed,
multipart upload; each item's record (:class:`~cairn.torch._format.ItemRecord`) places
it in the object and carries its own SHA-256, so a read of one item is one ranged GET
checked against that digest, and the index lets cairn verify the object without DCP.

Invariants:

* an item is resolved (``planner.resolve_data``) only shortly before the upload
  reaches it, and hashed once, before its bytes are sent: a contiguous CPU tensor is
  sent from its own memory; a copy (from a device, or made contiguous) lives only until
  it is sent, with at most :data:`AHEAD_ITEMS` items (and :data:`AHEAD_BYTES`, or one
  item) resolved ahead, so what a rank holds is bounded whatever its size;
* the records are those of the upload attempt that succeeded: a retried upload
  resolves and hashes its items again, and the index and records describe what was
  sent last;
* the ranges are stored as given: a checkpointer with compression keeps the layout of
  one object per tensor and bundles (:mod:`cairn.torch._writer`), since a compressed
  range cannot be read alone.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import io
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from cairn._integration import Entry
from cairn.checkpointer import PartitionUpload
from cairn.errors import InvalidInputError
from cairn.integrity import INLINE_HASH_LIMIT, sha256_hex
from cairn.manifest import PartitionSnapshotEntry
from cairn.ranges import Range, RangeSource
from cairn.torch._format import ItemRecord, dtype_name, tensor_bytes

__all__ = [
    "AHEAD_BYTES",
    "AHEAD_ITEMS",
    "RANK_OBJECT_BYTES",
    "ItemRanges",
    "Resolved",
    "Written",
    "estimated_size",
    "rank_uploads",
    "split_into_objects",
]

AHEAD_ITEMS = 4
"""Items resolved and hashed ahead of the one being sent, at most (in worker threads,
which hash in parallel: hashlib releases the GIL)..."""

AHEAD_BYTES = 64 << 20
"""... and at most this many bytes of them (one item, however large, always)."""

RANK_OBJECT_BYTES = 16 << 30
"""A rank's items go into one object up to this many bytes (16 GiB), into one more per
that many bytes beyond: few objects, each a multipart upload a store handles well."""


def estimated_size(item: WriteItem) -> int:
    """The bytes a tensor item will take (its chunk's elements by element size); 0 for a
    byte item, whose size is known only once it is resolved (they are small)."""
    data = item.tensor_data
    if item.type == WriteItemType.BYTE_IO or data is None:
        return 0
    count = 1
    for n in data.chunk.sizes:
        count *= int(n)
    element: int = torch.empty((), dtype=data.properties.dtype).element_size()
    return count * element


def split_into_objects(items: Sequence[WriteItem], limit: int) -> list[list[WriteItem]]:
    """``items``, in order, cut into runs of at most ``limit`` estimated bytes (a run
    holds at least one item, however large)."""
    runs: list[list[WriteItem]] = []
    size = 0
    for item in items:
        grows = estimated_size(item)
        if not runs or (runs[-1] and size + grows > limit):
            runs.append([])
            size = 0
        runs[-1].append(item)
        size += grows
    return runs


@dataclasses.dataclass(frozen=True)
class Written:
    """One item's ``WriteResult.storage_data``: its record, and its artifact's entry."""

    record: tuple[str, int, int, str, str, tuple[int, ...]]
    operator: str
    entry: PartitionSnapshotEntry


@dataclasses.dataclass(frozen=True)
class Resolved:
    """One item's bytes as they are stored: a flat view, what keeps it alive, whether it
    is a copy, and for a tensor its dtype name and shape (``""``/``()`` for bytes)."""

    view: memoryview
    owner: object
    copied: bool
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, item: WriteItem, data: object) -> Resolved:
        """``item``'s bytes from what the planner resolved it to."""
        what = f"state_dict item {item.index.fqn!r}"
        if item.type == WriteItemType.BYTE_IO:
            if not isinstance(data, io.BytesIO):
                raise InvalidInputError(f"{what}: the planner resolved a byte item to {data!r:.80}")
            return cls(data.getbuffer(), data, False, "", ())
        if not isinstance(data, torch.Tensor):
            raise InvalidInputError(f"{what}: the planner resolved a tensor item to {data!r:.80}")
        view, owner, copied = tensor_bytes(data, what)
        shape = tuple(int(n) for n in owner.shape)
        return cls(view, owner, copied, dtype_name(owner.dtype), shape)


@dataclasses.dataclass(frozen=True)
class _Placed:
    """One item as the last upload attempt stored it."""

    item: WriteItem
    offset: int
    length: int
    sha256: str
    dtype: str
    shape: tuple[int, ...]


Resolve = Callable[[WriteItem], Any]
"""``planner.resolve_data``: an item's value (a tensor, or a ``BytesIO`` of a byte item)."""


class ItemRanges(RangeSource):
    """The ranges of one rank object: ``items`` resolved through ``resolve`` as the
    upload reaches them, each hashed just before it is sent.

    An item is resolved and hashed in a worker thread when its tensor is larger than
    :data:`~cairn.integrity.INLINE_HASH_LIMIT`, or always with ``off_loop`` (a
    ``resolve`` that reads files)."""

    def __init__(
        self, items: Sequence[WriteItem], resolve: Resolve, off_loop: bool = False
    ) -> None:
        self._items = list(items)
        self._resolve = resolve
        self._off_loop = off_loop
        self.placed: list[_Placed] = []

    def open(self) -> AsyncIterator[Range]:
        """A fresh pass: every item resolved and hashed again."""
        return self._ranges()

    async def _ranges(self) -> AsyncIterator[Range]:
        def prepare(item: WriteItem) -> tuple[Resolved, str]:
            resolved = Resolved.of(item, self._resolve(item))
            return resolved, sha256_hex(resolved.view)

        async def prepared(item: WriteItem) -> tuple[Resolved, str]:
            if self._off_loop or estimated_size(item) > INLINE_HASH_LIMIT:
                return await asyncio.to_thread(prepare, item)
            return prepare(item)

        self.placed = []
        offset = 0
        upcoming = iter(self._items)
        ahead: collections.deque[tuple[WriteItem, int, asyncio.Future[tuple[Resolved, str]]]]
        ahead = collections.deque()
        held = 0  # estimated bytes of the items resolved ahead

        def resolve_ahead() -> None:  # hashed on worker threads while earlier ones are sent
            nonlocal held
            while len(ahead) < AHEAD_ITEMS and (not ahead or held < AHEAD_BYTES):
                item = next(upcoming, None)
                if item is None:
                    return
                size = estimated_size(item)
                ahead.append((item, size, asyncio.ensure_future(prepared(item))))
                held += size

        try:
            resolve_ahead()
            while ahead:
                item, size, future = ahead.popleft()
                held -= size
                resolved, digest = await future
                resolve_ahead()
                length = resolved.view.nbytes
                self.placed.append(
                    _Placed(item, offset, length, digest, resolved.dtype, resolved.shape)
                )
                yield Range(resolved.view, digest)
                offset += length
                del resolved
        finally:
            for _, _, future in ahead:
                future.cancel()

    def results(self, operator: str, entry: Entry) -> list[WriteResult]:
        """A ``WriteResult`` per item stored, with its record in ``entry``'s object."""
        _, stored = entry
        results: list[WriteResult] = []
        for placed in self.placed:
            record = ItemRecord(
                stored.path, placed.offset, placed.length, placed.sha256, placed.dtype, placed.shape
            )
            written = Written(record.stored(), operator, stored)
            results.append(WriteResult(placed.item.index, placed.length, written))
        return results


def rank_uploads(
    operator: str,
    items: Sequence[WriteItem],
    planner: SavePlanner,
    first_partition: int,
    limit: int,
) -> list[tuple[PartitionUpload, ItemRanges]]:
    """The uploads of a rank's ``items``: one object of ranges per run of ``limit``
    bytes, numbered from ``first_partition``, each with its :class:`ItemRanges`."""
    uploads: list[tuple[PartitionUpload, ItemRanges]] = []
    for number, run in enumerate(split_into_objects(items, limit)):
        source = ItemRanges(run, planner.resolve_data)
        uploads.append(((operator, first_partition + number, False, source), source))
    return uploads
