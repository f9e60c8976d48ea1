"""Reading a chunk table: which block holds each item's record, and DCP's chunks.

The table and the blocks (written by :mod:`cairn.torch._itemtable`) are specified in
docs/format.md, section "DCP checkpoints" ("The metadata as a chunk table"). A reader
unpickles range 0 (an object per tensor, and the packed rows), gives each tensor a
:class:`ChunkList` over its rows, and reads only the blocks of the items it loads: a rank
that loads what it saved reads one block. :class:`~cairn.torch.SafeLoadPlanner` finds
the saved chunks a rank's chunks overlap, for all its tensors in one vectorized pass
(:func:`overlapping`); any other planner sees an ordinary sequence of DCP chunks. No I/O.

Invariants:

* the table is checked against the DCP metadata it is stored with (:func:`decode_table`:
  a tensor's rows are exactly its chunks, every block number exists), and a block
  against the table (:func:`decode_block`: it holds exactly the items the table places
  in it); anything else, a table of a format this version does not read included, is
  :class:`~cairn.errors.CorruptManifestError` naming the object;
* decompression is bounded (:mod:`cairn.format.codecs`): the rows decode to exactly the
  bytes their tensors' row counts make, a block to exactly the size the table records;
* a :class:`ChunkList` pickles as a plain list of DCP's ``ChunkStorageMetadata``, so
  metadata handed on (an export) is DCP's own.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any, overload

import msgspec
import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from cairn.errors import (
    CorruptManifestError,
    IntegrityMismatchError,
    OversizedArtifactError,
    UndecodableArtifactError,
)
from cairn.format.codecs import get_codec
from cairn.torch._format import ItemRecord, StoredRecord
from cairn.torch._itemtable import CODEC, FORMAT, byte_items

__all__ = [
    "ChunkList",
    "ItemTable",
    "decode_block",
    "decode_table",
    "has_table",
    "overlapping",
]


class _Record(msgspec.Struct, array_like=True, frozen=True):
    """One item record in a block: its key (the number of its fqn in the block's
    ``names``, chunk offsets or None for a byte item), then
    :class:`~cairn.torch._format.ItemRecord`'s fields, the artifact and dtype as numbers
    in ``names`` too, the digest as bytes; ``stored_length`` only for a compressed range
    (:func:`rank_items` leaves it out otherwise, so that a block of uncompressed items
    has no such member)."""

    fqn: int
    offsets: list[int] | None
    artifact: int
    offset: int
    length: int
    sha256: bytes
    dtype: int
    shape: list[int]
    stored_length: int | None = None


class _Block(msgspec.Struct, array_like=True, frozen=True):
    """A rank's item records; each string they share (fqn, artifact, dtype) is stored
    once, in ``names``."""

    names: list[str]
    records: list[_Record]


_BLOCK_DECODER = msgspec.msgpack.Decoder(_Block)


class ChunkList(Sequence[ChunkStorageMetadata]):
    """A tensor's saved chunks: rows ``start`` to ``start + count`` of the chunk table
    ``table`` (block, offsets, sizes; ``dims`` of each, the tensor's own ``ndim`` first).
    DCP's chunk objects are made only when asked for (once); :func:`overlapping` finds
    chunks without them."""

    def __init__(self, table: np.ndarray, start: int, count: int, ndim: int, dims: int) -> None:
        self.table, self.start, self.ndim, self.dims = table, start, ndim, dims
        rows = table[start : start + count]
        self._blocks = rows[:, 0]
        self._offsets = rows[:, 1 : 1 + ndim]
        self._sizes = rows[:, 1 + dims : 1 + dims + ndim]

    def __len__(self) -> int:
        return len(self._blocks)

    @overload
    def __getitem__(self, position: int) -> ChunkStorageMetadata: ...
    @overload
    def __getitem__(self, position: slice) -> list[ChunkStorageMetadata]: ...
    def __getitem__(self, position: int | slice) -> Any:
        return self._chunks[position]

    def __iter__(self) -> Iterator[ChunkStorageMetadata]:
        return iter(self._chunks)

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (self._chunks,))

    @functools.cached_property
    def _chunks(self) -> list[ChunkStorageMetadata]:
        return [
            ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
            for offsets, sizes in zip(self._offsets.tolist(), self._sizes.tolist(), strict=True)
        ]

    def chunk(self, position: int) -> ChunkStorageMetadata:
        """The chunk at ``position``, made alone (not the whole list)."""
        offsets, sizes = self._offsets[position].tolist(), self._sizes[position].tolist()
        return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))

    def position(self, offsets: Sequence[int], hint: int | None = None) -> int | None:
        """The position of the chunk at ``offsets`` (``hint`` is tried first); None if none."""
        if (
            hint is not None
            and 0 <= hint < len(self)
            and self._offsets[hint].tolist() == list(offsets)
        ):
            return hint
        want = np.asarray(list(offsets), dtype=np.int64)
        found = np.flatnonzero((self._offsets == want).all(axis=1))
        return int(found[0]) if len(found) else None

    def block(self, position: int) -> int:
        """The block holding the record of the chunk at ``position``."""
        return int(self._blocks[position])


def overlapping(
    queries: Sequence[tuple[ChunkList, ChunkStorageMetadata]],
) -> list[list[int]]:
    """For each ``(saved, chunk)`` of ``queries``, the positions in ``saved`` of the chunks
    that share an element with ``chunk`` (DCP's rule: an empty saved chunk shares none),
    all queries in one vectorized pass over the rows they name."""
    if not queries:
        return []
    table = queries[0][0].table
    if any(saved.table is not table for saved, _ in queries):
        return [overlapping([query])[0] for query in queries]
    dims = queries[0][0].dims
    count = len(queries)
    low = np.zeros((count, dims), dtype=np.int64)
    high = np.zeros((count, dims), dtype=np.int64)
    counted = np.zeros((count, dims), dtype=bool)  # the dimensions a query's tensor has
    for number, (saved, chunk) in enumerate(queries):
        ndim = saved.ndim
        low[number, :ndim] = chunk.offsets
        high[number, :ndim] = [o + n for o, n in zip(chunk.offsets, chunk.sizes, strict=True)]
        counted[number, :ndim] = True
    lengths = np.array([len(saved) for saved, _ in queries], dtype=np.int64)
    starts = np.array([saved.start for saved, _ in queries], dtype=np.int64)
    query = np.repeat(np.arange(count), lengths)
    position = np.arange(len(query)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    rows = table[starts[query] + position]
    offsets, sizes = rows[:, 1 : 1 + dims], rows[:, 1 + dims : 1 + 2 * dims]
    shared = (offsets < high[query]) & (low[query] < offsets + sizes)
    hit = (shared | ~counted[query]).all(axis=1)
    found = np.split(position[hit], np.cumsum(np.bincount(query[hit], minlength=count))[:-1])
    return [part.tolist() for part in found]


def has_table(metadata: Metadata) -> bool:
    """True when ``metadata``'s ``storage_data`` is a chunk table, of any version (which
    :func:`decode_table` then reads, or refuses)."""
    data = metadata.storage_data
    return isinstance(data, dict) and isinstance(data.get("format"), str)


@dataclasses.dataclass(frozen=True)
class ItemTable:
    """A decoded chunk table: which block holds each item's record."""

    blocks: int
    chunk_lists: dict[str, ChunkList]
    byte_blocks: dict[str, int]
    chunks_per_block: np.ndarray
    block_sizes: list[int]  # each block's size, decoded

    def block_of(self, index: MetadataIndex) -> int | None:
        """The block that holds the record of ``index``; None when no item has that key."""
        if index.offset is None:
            return self.byte_blocks.get(index.fqn)
        chunks = self.chunk_lists.get(index.fqn)
        if chunks is None:
            return None
        position = chunks.position(index.offset, index.index)
        return None if position is None else chunks.block(position)

    def count_in(self, block: int) -> int:
        """How many items have their record in ``block``."""
        own = int(self.chunks_per_block[block])
        return own + sum(1 for found in self.byte_blocks.values() if found == block)


_TABLE_FIELDS = frozenset(
    {"format", "dtype", "dims", "rows", "tensors", "bytes", "blocks", "block_sizes"}
)
"""The keys of a chunk table (what :func:`~cairn.torch._itemtable.build_table` stores)."""

_MAX_DECODED = 1 << 40
"""More decoded bytes than a table's rows or a block can hold (refused unread)."""


def decode_table(path: str, metadata: Metadata, blocks: int) -> ItemTable:
    """The chunk table of ``metadata`` (read from range 0 of the object at ``path``, which
    holds ``blocks`` blocks after it), checked; every tensor's chunk list is set to its
    :class:`ChunkList`. Raises :class:`CorruptManifestError` naming ``path``."""
    data = metadata.storage_data

    def bad(reason: str) -> CorruptManifestError:
        return CorruptManifestError(path, f"DCP chunk table: {reason}")

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise bad(f"format {found!r} is not one this version of cairn reads ({FORMAT!r})")
    if frozenset(data) != _TABLE_FIELDS:
        raise bad("not the fields of one")
    dims, spans, byte_blocks = data["dims"], data["tensors"], data["bytes"]
    if data["dtype"] not in ("int32", "int64") or type(dims) is not int or dims < 0:
        raise bad(f"dtype {data['dtype']!r} with {dims!r} dimensions")
    if data["blocks"] != blocks:
        raise bad(f"it names {data['blocks']!r} blocks, the object holds {blocks}")
    if (
        not isinstance(data["rows"], bytes)
        or not isinstance(spans, dict)
        or not isinstance(byte_blocks, dict)
    ):
        raise bad("malformed rows, tensors or byte items")
    block_sizes = data["block_sizes"]
    if not (
        isinstance(block_sizes, list)
        and len(block_sizes) == blocks
        and all(type(n) is int and 0 <= n <= _MAX_DECODED for n in block_sizes)
    ):
        raise bad(f"block sizes {block_sizes!r:.80} for {blocks} blocks")
    rows = _rows(path, data, bad)
    chunk_lists = _chunk_lists(metadata, spans, rows, dims, bad)
    if set(byte_blocks) != byte_items(metadata) or not all(
        type(b) is int and 0 <= b < blocks for b in byte_blocks.values()
    ):
        raise bad("its byte items are not the metadata's")
    per_block = np.bincount(rows[:, 0], minlength=blocks)
    return ItemTable(blocks, chunk_lists, byte_blocks, per_block, block_sizes)


def _rows(path: str, data: dict[str, Any], bad: Any) -> np.ndarray:
    """The table's rows, decoded and checked: none negative, each block one there is."""
    width = 1 + 2 * data["dims"]
    itemsize = 4 if data["dtype"] == "int32" else 8
    raw = _decoded_rows(path, data["rows"], data["tensors"], itemsize * width, bad)
    if len(raw) % (itemsize * width):
        raise bad(f"{len(raw)} bytes are not rows of {width} values")
    stored = np.frombuffer(raw, dtype=np.dtype(data["dtype"]).newbyteorder("<"))
    rows = stored.astype(np.int64).reshape(-1, width)
    if len(rows) and (int(rows.min()) < 0 or int(rows[:, 0].max()) >= data["blocks"]):
        raise bad("a negative value, or a block the object does not hold")
    return rows


def _chunk_lists(
    metadata: Metadata, spans: dict[Any, Any], rows: np.ndarray, dims: int, bad: Any
) -> dict[str, ChunkList]:
    """Each tensor's :class:`ChunkList` (also set as its chunks in ``metadata``), once
    its ``spans`` are checked to cover ``rows`` exactly, each tensor's its own."""
    tensors = {
        fqn: md
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    }
    if set(spans) != set(tensors):
        raise bad("its tensors are not the metadata's")
    chunk_lists: dict[str, ChunkList] = {}
    for fqn, md in tensors.items():
        span = spans[fqn]
        ok = (
            isinstance(span, tuple)
            and len(span) == 2
            and all(type(n) is int and n >= 0 for n in span)
            and span[0] + span[1] <= len(rows)
            and len(md.size) <= dims
            and not md.chunks
        )
        if not ok:
            raise bad(f"tensor {fqn!r} has rows {span!r:.80} of {len(rows)}")
        start, count = span
        chunks = ChunkList(rows, start, count, len(md.size), dims)
        md.chunks = chunks  # type: ignore[assignment]  # a Sequence, which DCP only iterates
        chunk_lists[fqn] = chunks
    covered = 0
    for start, count in sorted(spans.values()):
        if start != covered:
            raise bad(f"rows {covered}..{start} belong to no tensor, or to two")
        covered += count
    if covered != len(rows):
        raise bad(f"rows {covered}..{len(rows)} belong to no tensor")
    return chunk_lists


def _decoded_rows(path: str, stored: bytes, spans: Any, row_bytes: int, bad: Any) -> bytes:
    """The rows of a compressed table: exactly the bytes its tensors' row counts make,
    or :class:`CorruptManifestError` (``bad``) before any more are decoded."""
    counts = [span[1] for span in spans.values() if isinstance(span, tuple) and len(span) == 2]
    if len(counts) != len(spans) or not all(type(n) is int and n >= 0 for n in counts):
        raise bad(f"tensor rows {next(iter(spans.values()), None)!r:.80} are not (start, count)")
    size = sum(counts) * row_bytes
    if size > _MAX_DECODED:
        raise bad(f"{sum(counts)} rows claimed")
    return _decompressed(path, stored, size, "DCP chunk table: its row array")


def _decompressed(path: str, stored: bytes, size: int, what: str) -> bytes:
    """``stored`` (``what``, in the object at ``path``) decoded to exactly ``size``
    bytes, bounded by them; else :class:`CorruptManifestError` naming ``path``."""
    try:
        return get_codec(CODEC, path=path).decompress(stored, path=path, size_bytes=size)
    except (UndecodableArtifactError, OversizedArtifactError, IntegrityMismatchError) as exc:
        raise CorruptManifestError(
            path, f"{what} does not decode to {size} bytes ({exc})"
        ) from None


def decode_block(
    path: str, table: ItemTable, block: int, data: bytes
) -> dict[MetadataIndex, StoredRecord]:
    """The records of block ``block`` (its bytes ``data``, already verified), keyed by
    item; each must be an item the table places in that block, and every such item must
    be there. Raises :class:`CorruptManifestError` naming ``path``."""
    what = f"block {block} of item records"
    data = _decompressed(path, data, table.block_sizes[block], what)
    try:
        decoded = _BLOCK_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"block {block} of item records: {exc}") from None
    names = decoded.names

    def name(number: int) -> str:
        if not 0 <= number < len(names):
            raise CorruptManifestError(path, f"block {block} names string {number} of {len(names)}")
        return names[number]

    records: dict[MetadataIndex, StoredRecord] = {}
    for record in decoded.records:
        offsets = None if record.offsets is None else torch.Size(record.offsets)
        index = MetadataIndex(name(record.fqn), offsets)
        if table.block_of(index) != block or index in records:
            raise CorruptManifestError(
                path,
                f"block {block} holds a record of {index}, which the table places elsewhere",
            )
        stored = ItemRecord(
            name(record.artifact),
            record.offset,
            record.length,
            record.sha256.hex(),
            name(record.dtype),
            tuple(record.shape),
            record.stored_length,
        )
        records[index] = stored.stored()
    if len(records) != table.count_in(block):
        raise CorruptManifestError(
            path,
            f"block {block} holds {len(records)} records, the table places "
            f"{table.count_in(block)} items there",
        )
    return records
