"""A DCP rank's items as objects of ranges (:mod:`cairn.format.ranges`). Uploads, no commit.

``CairnWriter`` stores a rank's uploaded items as objects of ranges, ``partition-{n}``
of operator ``rank-{r}``: each object holds some items' bytes end to end, in plan
order, then their index. On an object store, a save spreads its ranks' items over a few
objects each, so that a rank keeps several requests in flight: when a rank's items of
at most :data:`OBJECT_BYTES` add up to no more than its share of :data:`SAVE_OBJECTS`
objects of that size, they go into objects of at most that many bytes (split between
items, never inside one), which the rank uploads several at once, each written from one
buffer (:data:`cairn.protocol._upload.JOINED_OBJECT_BYTES`), and its larger items into
one more object, a streamed multipart upload whose parts travel at once. Otherwise (a
large rank, or a save of many ranks, which keep requests in flight together) all its
items go into one streamed object, one more per :data:`RANK_OBJECT_BYTES`; so do a local
directory's ranks (its files gain nothing from more objects, and each costs a file and
an fsync). Each item's record (:class:`~cairn.torch._format.ItemRecord`) places it in
its object and carries its own SHA-256, so a read of one item is one ranged GET checked
against that digest, and the index lets cairn verify an object without DCP.

Invariants:

* an item is resolved (``planner.resolve_data``) only shortly before the upload
  reaches it, and hashed once, before its bytes are sent: a contiguous CPU tensor is
  sent from its own memory; a copy (from a device, or made contiguous) lives only until
  it is sent, with at most :data:`AHEAD_RUNS` runs of items (and :data:`AHEAD_BYTES`,
  or one run) resolved ahead, so what a rank holds is bounded whatever its size;
  consecutive small items are resolved and hashed as one run, so that a rank of many
  items pays a hand-off to a worker thread per run, not per item;
* the records are those of the upload attempt that succeeded: a retried upload
  resolves and hashes its items again, and the index and records describe what was
  sent last;
* with a codec (a checkpointer with ``compression=``), each item is compressed on its
  own, as one frame, right after it is hashed and on the same worker thread: its
  record places the frame (``offset``, ``stored_length``) and keeps the digest and
  length of its bytes before compression, so a read of one item is still one ranged
  GET, decoded in memory bounded by that length and checked against that digest; the
  object's index is the compressed kind of :mod:`cairn.format.ranges`. What a rank holds ahead
  is then the frames of the runs resolved ahead, each no larger than about its items.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import io
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from cairn.checkpointer import PartitionUpload
from cairn.errors import InvalidInputError
from cairn.format.codecs import Codec
from cairn.format.integrity import INLINE_HASH_LIMIT, sha256_hex
from cairn.format.manifest import PartitionSnapshotEntry
from cairn.format.ranges import Range, RangeSource
from cairn.integrations._interface import Entry
from cairn.torch._format import ItemRecord, StoredRecord, dtype_name, tensor_bytes

__all__ = [
    "AHEAD_BYTES",
    "AHEAD_RUNS",
    "OBJECT_BYTES",
    "RANK_OBJECT_BYTES",
    "RUN_BYTES",
    "RUN_ITEMS",
    "SAVE_OBJECTS",
    "ItemRanges",
    "Resolved",
    "Written",
    "estimated_size",
    "rank_uploads",
    "split_into_objects",
]

AHEAD_RUNS = 4
"""Runs of items resolved and hashed ahead of the one being sent, at most (in worker
threads, which hash in parallel: hashlib releases the GIL)..."""

AHEAD_BYTES = 64 << 20
"""... and at most this many bytes of them (one run, however large, always)."""

RUN_ITEMS = 64
"""Consecutive tensor items resolved and hashed together, in one step on one worker
thread, at most: a hand-off per item would cost more than a small item's hashing..."""

RUN_BYTES = AHEAD_BYTES // AHEAD_RUNS
"""... and at most this many bytes of them (an item larger than this is a run of its
own), so that several runs in flight still hash in parallel."""

OBJECT_BYTES = 16 << 20
"""Items of at most this many bytes may share objects of at most this many bytes
(16 MiB), each written from one buffer, several at once: a rank keeps more connections
busy than the parts of one streamed object, and a load's ranged GETs read from objects
of 16 MiB."""

SAVE_OBJECTS = 64
"""Objects of :data:`OBJECT_BYTES` a save writes at most, shared among its ranks
(``SAVE_OBJECTS // ranks`` each): a rank whose small items fill more, or a save of
:data:`SAVE_OBJECTS` ranks or more, stores a rank in one streamed object, so that a
save's objects and manifest entries stay about one per rank however many ranks save."""

RANK_OBJECT_BYTES = 16 << 30
"""A rank's items that do not share objects of :data:`OBJECT_BYTES` go into one object
up to this many bytes (16 GiB), into one more per that many bytes beyond: few objects,
each a multipart upload whose parts travel at once, its memory bounded by the parts in
flight."""


def estimated_size(item: WriteItem) -> int:
    """The bytes a tensor item will take (its chunk's elements by element size); 0 for a
    byte item, whose size is known only once it is resolved (they are small)."""
    data = item.tensor_data
    if item.type == WriteItemType.BYTE_IO or data is None:
        return 0
    return math.prod(int(n) for n in data.chunk.sizes) * data.properties.dtype.itemsize


def split_into_objects(
    items: Sequence[WriteItem], ranks: int, small: int, limit: int, spread: bool = True
) -> list[list[WriteItem]]:
    """A rank's ``items`` (one of ``ranks`` saving) as objects.

    With ``spread`` (an object store, where objects at once are connections at once),
    when the items of at most ``small`` estimated bytes add up to no more than the
    rank's share of :data:`SAVE_OBJECTS` objects of ``small`` bytes (and that share is
    more than one): those, in order, in objects of at most ``small`` bytes, then the
    larger ones, in order, in objects of at most ``limit`` bytes. Otherwise every item,
    in order, in objects of at most ``limit`` bytes. An object holds at least one item,
    however large.
    """
    share = SAVE_OBJECTS // max(1, ranks) if spread else 0
    little = [item for item in items if estimated_size(item) <= small]
    if share <= 1 or sum(map(estimated_size, little)) > share * small:
        return _cut(items, limit)
    large = [item for item in items if estimated_size(item) > small]
    return _cut(little, small) + _cut(large, limit)


def _cut(items: Sequence[WriteItem], limit: int) -> list[list[WriteItem]]:
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
    """Where one item of a save is: its record, and the operator and entry of the
    artifact holding it (a carried item's: the parent's record, the entry's ``owner``
    set). A ``WriteResult``'s ``storage_data`` until the rank hands in its block."""

    record: StoredRecord
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
    """One item as the last upload attempt stored it (``stored_length``: its frame's,
    when compressed)."""

    item: WriteItem
    offset: int
    length: int
    sha256: str
    dtype: str
    shape: tuple[int, ...]
    stored_length: int | None


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """One item ready to send: its bytes as stored (a frame, when compressed), what
    keeps them alive, and its record's fields."""

    item: WriteItem
    data: memoryview
    owner: object
    length: int
    sha256: str
    dtype: str
    shape: tuple[int, ...]


Resolve = Callable[[WriteItem], Any]
"""``planner.resolve_data``: an item's value (a tensor, or a ``BytesIO`` of a byte item)."""


Size = Callable[[WriteItem], int]
"""An item's bytes as far as known before it is resolved (:func:`estimated_size`)."""


@dataclasses.dataclass(frozen=True)
class _Run:
    """Consecutive items resolved and hashed in one step, and their bytes as estimated."""

    items: list[WriteItem]
    size: int


def _runs(items: Sequence[WriteItem], size_of: Size) -> list[_Run]:
    """``items``, in order, in runs of at most :data:`RUN_ITEMS` tensor items and
    :data:`RUN_BYTES` bytes; a byte item, whose size is known only once resolved, and a
    tensor item larger than :data:`RUN_BYTES` are runs of their own."""
    runs: list[_Run] = []
    items_of_run: list[WriteItem] = []
    size = 0
    for item in items:
        grows = size_of(item)
        alone = item.type == WriteItemType.BYTE_IO or grows > RUN_BYTES
        if items_of_run and (alone or len(items_of_run) >= RUN_ITEMS or size + grows > RUN_BYTES):
            runs.append(_Run(items_of_run, size))
            items_of_run, size = [], 0
        items_of_run.append(item)
        size += grows
        if alone:
            runs.append(_Run(items_of_run, size))
            items_of_run, size = [], 0
    if items_of_run:
        runs.append(_Run(items_of_run, size))
    return runs


class ItemRanges(RangeSource):
    """The ranges of one rank object: ``items`` resolved through ``resolve`` as the
    upload reaches them, each hashed just before it is sent.

    Items are resolved and hashed in runs (:data:`RUN_ITEMS`, :data:`RUN_BYTES`), a run
    in a worker thread when its items are larger than
    :data:`~cairn.format.integrity.INLINE_HASH_LIMIT` together, or always with ``off_loop`` (a
    ``resolve`` that reads files). ``size_of`` gives an item's bytes before it is
    resolved (:func:`estimated_size`, by default). With ``codec``, each item is stored
    as one frame of it, compressed right after it is hashed."""

    def __init__(
        self,
        items: Sequence[WriteItem],
        resolve: Resolve,
        off_loop: bool = False,
        size_of: Size = estimated_size,
        codec: Codec | None = None,
    ) -> None:
        self._runs = _runs(items, size_of)
        self._resolve = resolve
        self._off_loop = off_loop
        self._codec = codec
        self.codec = None if codec is None else codec.name
        self.placed: list[_Placed] = []

    def open(self) -> AsyncIterator[Range]:
        """A fresh pass: every item resolved and hashed again."""
        return self._ranges()

    async def _ranges(self) -> AsyncIterator[Range]:
        codec = self._codec

        def prepare(run: _Run) -> collections.deque[_Prepared]:
            prepared: collections.deque[_Prepared] = collections.deque()
            for item in run.items:
                resolved = Resolved.of(item, self._resolve(item))
                view, owner, length = resolved.view, resolved.owner, resolved.view.nbytes
                digest = sha256_hex(view)
                if codec is not None:  # the frame replaces the bytes, which are let go
                    view = memoryview(codec.compress(view))
                    owner = view
                dtype, shape = resolved.dtype, resolved.shape
                prepared.append(_Prepared(item, view, owner, length, digest, dtype, shape))
                del resolved
            return prepared

        async def prepared(run: _Run) -> collections.deque[_Prepared]:
            if self._off_loop or run.size > INLINE_HASH_LIMIT:
                return await asyncio.to_thread(prepare, run)
            return prepare(run)

        self.placed = []
        offset = 0
        upcoming = iter(self._runs)
        ahead: collections.deque[tuple[_Run, asyncio.Future[Any]]] = collections.deque()
        held = 0  # estimated bytes of the runs resolved ahead

        def resolve_ahead() -> None:  # hashed on worker threads while earlier ones are sent
            nonlocal held
            while len(ahead) < AHEAD_RUNS and (not ahead or held < AHEAD_BYTES):
                run = next(upcoming, None)
                if run is None:
                    return
                ahead.append((run, asyncio.ensure_future(prepared(run))))
                held += run.size

        try:
            resolve_ahead()
            while ahead:
                run, future = ahead.popleft()
                held -= run.size
                items = await future
                resolve_ahead()
                while items:
                    ready = items.popleft()
                    stored = ready.data.nbytes
                    self.placed.append(
                        _Placed(
                            ready.item,
                            offset,
                            ready.length,
                            ready.sha256,
                            ready.dtype,
                            ready.shape,
                            None if codec is None else stored,
                        )
                    )
                    decoded = None if codec is None else ready.length
                    yield Range(ready.data, ready.sha256, decoded)
                    offset += stored
                    del ready
        finally:
            for _, future in ahead:
                future.cancel()

    def results(self, operator: str, entry: Entry) -> list[WriteResult]:
        """A ``WriteResult`` per item stored, with its record in ``entry``'s object."""
        _, stored = entry
        results: list[WriteResult] = []
        for placed in self.placed:
            record = ItemRecord(
                stored.path,
                placed.offset,
                placed.length,
                placed.sha256,
                placed.dtype,
                placed.shape,
                placed.stored_length,
            )
            written = Written(record.stored(), operator, stored)
            results.append(WriteResult(placed.item.index, placed.length, written))
        return results


def rank_uploads(
    operator: str,
    items: Sequence[WriteItem],
    planner: SavePlanner,
    first_partition: int,
    ranks: int = 1,
    sizes: tuple[int, int] = (OBJECT_BYTES, RANK_OBJECT_BYTES),
    codec: Codec | None = None,
    spread: bool = True,
) -> list[tuple[PartitionUpload, ItemRanges]]:
    """The uploads of a rank's ``items`` (one of ``ranks`` saving): objects of ranges as
    :func:`split_into_objects` cuts them (``sizes``: its ``small`` and ``limit``; and
    ``spread``), numbered from ``first_partition``, each with its :class:`ItemRanges`
    (its items compressed with ``codec``, if given)."""
    uploads: list[tuple[PartitionUpload, ItemRanges]] = []
    for number, run in enumerate(split_into_objects(items, ranks, *sizes, spread)):
        source = ItemRanges(run, planner.resolve_data, codec=codec)
        uploads.append(((operator, first_partition + number, False, source), source))
    return uploads
