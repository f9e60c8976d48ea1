"""DCP metadata at rank scale: one chunk table, and item records in one block per rank.

DCP's ``Metadata`` lists every chunk of every tensor, and cairn keeps a record
(:class:`~cairn.torch._format.ItemRecord`) per item: 2.2 million of each for a 70B
model's training state over 1,024 ranks. Pickled whole, as DCP's own writers store
them, every rank unpickles all of them to load its own two thousand. A save therefore
stores its metadata as one object of ranges (:mod:`cairn.format.ranges`):

* range 0 is DCP's ``Metadata`` with every tensor's chunk list left empty; its
  ``storage_data`` is the *chunk table* (:data:`FORMAT`): the offsets and sizes of every
  chunk, and the block that holds its record, as one packed integer array
  (zstd-compressed), with the rows of each tensor and each block's decoded size;
* range ``1 + b`` is block ``b``: the item records of the ``b``-th rank that wrote items
  (MessagePack, zstd-compressed; each fqn, artifact path and dtype name stored once).

Compression takes the metadata of a 70B model's state over 1,024 ranks from 288 MB to
about a third of that: the rows of an evenly sharded model are a regular pattern, and
the records' names repeat from rank to rank. The first version of the table
(:data:`FORMAT_V1`, rows and blocks stored as they are) is still read.

A reader unpickles range 0 (an object per tensor, and the array), gives each tensor a
:class:`ChunkList` over its rows, and reads only the blocks of the items it loads: a rank
that loads what it saved reads one block. :class:`~cairn.torch.SafeLoadPlanner` finds the
saved chunks a rank's chunks overlap, for all its tensors in one vectorized pass
(:func:`overlapping`); any other planner sees an ordinary sequence of DCP chunks. No
I/O here.

Invariants:

* every rank encodes its own block and chunk rows (:func:`rank_items`), so the
  coordinator's :func:`build_table` does work per rank and per tensor, not per item;
* the table is checked against the DCP metadata it is stored with (:func:`decode_table`:
  a tensor's rows are exactly its chunks, every block number exists), and a block
  against the table (:func:`decode_block`: it holds exactly the items the table places
  in it); anything else is :class:`~cairn.errors.CorruptManifestError` naming the object;
* decompression is bounded (:mod:`cairn.format.codecs`): the rows decode to exactly the bytes
  their tensors' row counts make, a block to exactly the size the table records;
* a :class:`ChunkList` pickles as a plain list of DCP's ``ChunkStorageMetadata``, so
  metadata handed on (an export) is DCP's own.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any, overload

import msgspec
import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

from cairn.errors import (
    CorruptManifestError,
    IncompleteCheckpointError,
    IntegrityMismatchError,
    OversizedArtifactError,
    UndecodableArtifactError,
)
from cairn.format.codecs import get_codec
from cairn.format.integrity import sha256_hex
from cairn.format.manifest import PartitionSnapshotEntry, StoreRequests
from cairn.torch._format import ItemRecord, StoredRecord

__all__ = [
    "CODEC",
    "FORMAT",
    "FORMAT_V1",
    "ChunkList",
    "ItemTable",
    "RankItems",
    "StoredTable",
    "build_table",
    "carries_ranges",
    "decode_block",
    "decode_table",
    "has_table",
    "overlapping",
    "rank_items",
    "with_plain_chunks",
]

FORMAT = "cairn-dcp-chunk-table-v2"
"""The ``format`` of a chunk table: the marker of metadata stored as a table and blocks
(rows and blocks zstd-compressed, each block's decoded size in ``block_sizes``)."""

FORMAT_V1 = "cairn-dcp-chunk-table-v1"
"""The first version of the table: rows and blocks stored uncompressed (read only)."""

CODEC = "zstd"
"""How the rows and the blocks of a :data:`FORMAT` table are compressed."""


class _Record(msgspec.Struct, array_like=True, frozen=True):
    """One item record in a block: its key (the number of its fqn in the block's
    ``names``, chunk offsets or None for a byte item), then
    :class:`~cairn.torch._format.ItemRecord`'s fields, the artifact and dtype as numbers
    in ``names`` too, the digest as bytes; ``stored_length`` only for a compressed range
    (:func:`rank_items` leaves it out otherwise, so that a block of uncompressed items
    is encoded as before it existed)."""

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


@dataclasses.dataclass(frozen=True, eq=False)
class RankItems:
    """What one rank's ``write_data`` hands the coordinator, as the ``storage_data`` of
    every one of its ``WriteResult`` s (one object: pickled once per rank).

    ``rows`` are the chunks of the rank's tensor items as native ``int64``, one row of
    ``1 + 2 * dims`` per chunk: the number of its tensor in ``fqns``, its offsets, its
    sizes (each padded with zeros to ``dims``). ``block`` is the rank's records, encoded
    and compressed (``block_size`` bytes decoded); ``block_sha256`` is that of ``block``.
    ``entries`` are the artifacts they name, each carried one (:func:`carries_ranges`)
    with the bytes of the rank's records in it as its ``used_bytes``. ``requests`` and
    ``retries`` are the store requests and retries the rank made to write them (None:
    not counted), which the coordinator adds to the save's statistics.
    """

    operator: str
    entries: tuple[tuple[str, PartitionSnapshotEntry], ...]
    block: bytes
    block_sha256: str
    block_size: int
    fqns: tuple[str, ...]
    rows: bytes
    dims: int
    byte_fqns: tuple[str, ...]
    requests: StoreRequests | None = None
    retries: int = 0


def carries_ranges(entry: PartitionSnapshotEntry) -> bool:
    """True when ``entry`` is an artifact carried from another checkpoint whose items are
    read as ranges of it (an object not compressed whole), so that its ``used_bytes``
    are recorded: the stored bytes of the ranges this checkpoint names."""
    return entry.owner is not None and entry.codec is None and entry.offset is None


def rank_items(
    operator: str,
    items: Sequence[WriteItem],
    written: Sequence[tuple[MetadataIndex, StoredRecord, str, PartitionSnapshotEntry]],
) -> RankItems:
    """The :class:`RankItems` of a rank whose plan holds ``items``, stored as ``written``:
    each item's key, record, and the operator and entry of the artifact holding it."""
    records: list[tuple[Any, ...]] = []  # each a _Record's fields, as it encodes
    names: dict[str, int] = {}
    entries: dict[tuple[str, int], tuple[str, PartitionSnapshotEntry]] = {}
    used: dict[tuple[str, int], int] = {}  # bytes of each carried object the records name
    for index, stored, owner, entry in written:
        record = ItemRecord(*stored)
        offsets = None if index.offset is None else [int(n) for n in index.offset]
        fqn_n, artifact_n, dtype_n = (
            names.setdefault(name, len(names))
            for name in (index.fqn, record.artifact, record.dtype)
        )
        raw = bytes.fromhex(record.sha256)
        fields = (fqn_n, offsets, artifact_n, record.offset, record.length, raw, dtype_n)
        shape = list(record.shape)
        if record.stored_length is None:
            records.append((*fields, shape))
        else:
            records.append((*fields, shape, record.stored_length))
        key = (owner, entry.partition_id)
        entries.setdefault(key, (owner, entry))
        if carries_ranges(entry):
            used[key] = used.get(key, 0) + record.extent[1]
    encoded = msgspec.msgpack.encode((list(names), records))  # a _Block
    block = get_codec(CODEC).compress(encoded)
    numbers: dict[str, int] = {}
    chunks: list[tuple[int, list[int], list[int]]] = []
    byte_fqns: list[str] = []
    for item in items:
        data = item.tensor_data
        if item.type == WriteItemType.BYTE_IO or data is None:
            byte_fqns.append(item.index.fqn)
            continue
        number = numbers.setdefault(item.index.fqn, len(numbers))
        chunks.append((number, list(data.chunk.offsets), list(data.chunk.sizes)))
    dims = max((len(offsets) for _, offsets, _ in chunks), default=0)
    rows = np.zeros((len(chunks), 1 + 2 * dims), dtype=np.int64)
    for row, (number, starts, sizes) in zip(rows, chunks, strict=True):
        row[0] = number
        row[1 : 1 + len(starts)] = starts
        row[1 + dims : 1 + dims + len(sizes)] = sizes
    return RankItems(
        operator,
        tuple(
            (owner, msgspec.structs.replace(entry, used_bytes=used[key]) if key in used else entry)
            for key, (owner, entry) in entries.items()
        ),
        block,
        sha256_hex(block),
        len(encoded),
        tuple(numbers),
        rows.tobytes(),
        dims,
        tuple(byte_fqns),
    )


@dataclasses.dataclass(frozen=True)
class StoredTable:
    """What the coordinator stores: range 0 (``metadata``, its ``storage_data`` the
    chunk table), then the blocks (bytes and SHA-256, in rank order)."""

    metadata: Metadata
    blocks: list[tuple[bytes, str]]


def build_table(metadata: Metadata, per_rank: Sequence[RankItems]) -> StoredTable:
    """The chunk table of a save whose DCP ``metadata`` is given and whose ranks handed
    in ``per_rank`` (in rank order); ``metadata`` itself is left as it is.

    Raises :class:`IncompleteCheckpointError` when the ranks' items are not the chunks
    and byte items ``metadata`` lists.
    """
    tensors = {
        fqn: md
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    }
    dims = max((len(md.size) for md in tensors.values()), default=0)
    ranks = _RankRows.of_each(per_rank, list(tensors), dims)
    byte_blocks: dict[str, int] = {}
    for block, rank in enumerate(per_rank):
        for fqn in rank.byte_fqns:
            if byte_blocks.setdefault(fqn, block) != block:
                raise IncompleteCheckpointError(f"byte item {fqn!r} was written by two ranks")
    expected = _byte_items(metadata)
    if set(byte_blocks) != expected:
        odd = sorted(set(byte_blocks) ^ expected)
        raise IncompleteCheckpointError(
            f"byte item {odd[0]!r} is in DCP's metadata or in the ranks' items, not both"
        )
    if all(rank.one_chunk_each for rank in ranks):
        # Each rank wrote one chunk of every tensor, in the metadata's order (what FSDP
        # makes): the table is the ranks' rows transposed, filled in place.
        counts = np.full(len(tensors), len(ranks), dtype=np.int64)
        rows, small = _transposed(ranks, len(tensors), dims)
    else:
        counts, rows, small = _sorted(ranks, len(tensors), dims)
    starts = np.concatenate(([0], np.cumsum(counts)))
    spans: dict[str, tuple[int, int]] = {}
    for number, (fqn, md) in enumerate(tensors.items()):
        if int(counts[number]) != len(md.chunks):
            raise IncompleteCheckpointError(
                f"tensor {fqn!r}: DCP's metadata has {len(md.chunks)} chunks, "
                f"the ranks wrote {int(counts[number])}"
            )
        spans[fqn] = (int(starts[number]), int(counts[number]))
    skeleton = copy.copy(metadata)
    skeleton.state_dict_metadata = {
        fqn: TensorStorageMetadata(md.properties, md.size, [])
        if isinstance(md, TensorStorageMetadata)
        else md
        for fqn, md in metadata.state_dict_metadata.items()
    }
    skeleton.storage_data = {
        "format": FORMAT,
        "dtype": "int32" if small else "int64",
        "dims": dims,
        "rows": get_codec(CODEC).compress(rows.data),
        "tensors": spans,
        "bytes": byte_blocks,
        "blocks": len(per_rank),
        "block_sizes": [rank.block_size for rank in per_rank],
    }
    blocks = [(rank.block, rank.block_sha256) for rank in per_rank]
    return StoredTable(skeleton, blocks)


@dataclasses.dataclass(frozen=True)
class _RankRows:
    """One rank's chunk rows as :func:`build_table` reads them: ``tensors`` (the number of
    each row's tensor in the metadata), ``offsets`` and ``sizes`` (``dims`` columns
    each, views of the rank's own bytes), and whether every value fits an int32."""

    tensors: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    fits_int32: bool
    one_chunk_each: bool  # one row per tensor of the metadata, in its order

    @classmethod
    def of_each(cls, per_rank: Sequence[RankItems], fqns: list[str], dims: int) -> list[_RankRows]:
        """The rows of each rank, checked against the metadata's tensors ``fqns``."""
        number_of = {fqn: number for number, fqn in enumerate(fqns)}
        every = np.arange(len(fqns), dtype=np.int64)
        mapped: dict[tuple[str, ...], tuple[np.ndarray, bool]] = {}
        ranks: list[_RankRows] = []
        for rank in per_rank:
            known = mapped.get(rank.fqns)
            if known is None:
                missing = [fqn for fqn in rank.fqns if fqn not in number_of]
                if missing:
                    raise IncompleteCheckpointError(
                        f"{rank.operator} wrote tensor {missing[0]!r}, which DCP's metadata lacks"
                    )
                numbers = np.array([number_of[fqn] for fqn in rank.fqns], dtype=np.int64)
                known = mapped[rank.fqns] = numbers, np.array_equal(numbers, every)
            numbers, all_in_order = known
            if rank.dims > dims:
                raise IncompleteCheckpointError(
                    f"{rank.operator} wrote chunks of {rank.dims} dimensions; no tensor of "
                    f"DCP's metadata has more than {dims}"
                )
            rows = np.frombuffer(rank.rows, dtype=np.int64).reshape(-1, 1 + 2 * rank.dims)
            values = rows[:, 1:]
            fits = not values.size or (int(values.min()) >= 0 and int(values.max()) < 2**31)
            in_order = all_in_order and np.array_equal(rows[:, 0], every)
            ranks.append(
                cls(
                    every if in_order else numbers[rows[:, 0]],
                    _padded(rows[:, 1 : 1 + rank.dims], dims),
                    _padded(rows[:, 1 + rank.dims :], dims),
                    fits,
                    in_order,
                )
            )
        return ranks


def _table_dtype(ranks: Sequence[_RankRows]) -> tuple[str, bool]:
    """The row dtype of a table of ``ranks``: int32 when every value fits (``small``)."""
    small = all(rank.fits_int32 for rank in ranks) and len(ranks) < 2**31
    return ("<i4" if small else "<i8"), small


def _transposed(ranks: Sequence[_RankRows], count: int, dims: int) -> tuple[np.ndarray, bool]:
    """The table of ranks that each wrote one chunk of each of ``count`` tensors, in
    order: tensor by tensor, each tensor's rows in rank order; and whether it is int32."""
    dtype, small = _table_dtype(ranks)
    table = np.empty((count, len(ranks), 1 + 2 * dims), dtype=dtype)
    table[:, :, 0] = np.arange(len(ranks))
    for block, rank in enumerate(ranks):
        table[:, block, 1 : 1 + dims] = rank.offsets
        table[:, block, 1 + dims :] = rank.sizes
    return table.reshape(-1, 1 + 2 * dims), small


def _sorted(
    ranks: Sequence[_RankRows], count: int, dims: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The rows of ``ranks`` in tensor order, each tensor's in rank order, by a stable
    sort (which numpy does as a radix sort for keys of 16 bits); the rows per tensor
    (``count`` of them), the table, and whether it is int32."""
    tensor = np.concatenate([np.zeros(0, dtype=np.int64), *(rank.tensors for rank in ranks)])
    counts = np.bincount(tensor, minlength=count)
    key = tensor.astype(np.uint16) if count <= 1 << 16 else tensor
    order = np.argsort(key, kind="stable")
    empty = np.zeros((0, dims), dtype=np.int64)
    dtype, small = _table_dtype(ranks)
    table = np.empty((len(tensor), 1 + 2 * dims), dtype=dtype)
    table[:, 0] = np.repeat(np.arange(len(ranks)), [len(rank.tensors) for rank in ranks])[order]
    table[:, 1 : 1 + dims] = np.concatenate([empty, *(rank.offsets for rank in ranks)])[order]
    table[:, 1 + dims :] = np.concatenate([empty, *(rank.sizes for rank in ranks)])[order]
    return counts, table, small


def _padded(columns: np.ndarray, dims: int) -> np.ndarray:
    """``columns`` with zero columns added up to ``dims``."""
    if columns.shape[1] == dims:
        return columns
    return np.pad(columns, ((0, 0), (0, dims - columns.shape[1])))


def _byte_items(metadata: Metadata) -> set[str]:
    return {
        fqn
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, BytesStorageMetadata)
    }


# -- reading ------------------------------------------------------------------------------


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


def with_plain_chunks(metadata: Metadata) -> Metadata:
    """A shallow copy of ``metadata`` whose tensors' chunk lists are plain lists (what
    DCP's own writers pickle), made from any :class:`ChunkList`."""
    plain = copy.copy(metadata)
    plain.state_dict_metadata = {
        fqn: TensorStorageMetadata(md.properties, md.size, list(md.chunks))
        if isinstance(md, TensorStorageMetadata) and isinstance(md.chunks, ChunkList)
        else md
        for fqn, md in metadata.state_dict_metadata.items()
    }
    return plain


def has_table(metadata: Metadata) -> bool:
    """True when ``metadata``'s ``storage_data`` is a chunk table (this module's format)."""
    data = metadata.storage_data
    return isinstance(data, dict) and data.get("format") in (FORMAT, FORMAT_V1)


@dataclasses.dataclass(frozen=True)
class ItemTable:
    """A decoded chunk table: which block holds each item's record."""

    blocks: int
    chunk_lists: dict[str, ChunkList]
    byte_blocks: dict[str, int]
    chunks_per_block: np.ndarray
    block_sizes: list[int] | None  # decoded, of compressed blocks; None: stored as they are

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


_TABLE_FIELDS_V1 = frozenset({"format", "dtype", "dims", "rows", "tensors", "bytes", "blocks"})
_TABLE_FIELDS = _TABLE_FIELDS_V1 | {"block_sizes"}
"""The keys of a chunk table (what :func:`build_table` stores)."""


def decode_table(path: str, metadata: Metadata, blocks: int) -> ItemTable:
    """The chunk table of ``metadata`` (read from range 0 of the object at ``path``, which
    holds ``blocks`` blocks after it), checked; every tensor's chunk list is set to its
    :class:`ChunkList`. Raises :class:`CorruptManifestError` naming ``path``."""
    data = metadata.storage_data

    def bad(reason: str) -> CorruptManifestError:
        return CorruptManifestError(path, f"DCP chunk table: {reason}")

    fields = {FORMAT: _TABLE_FIELDS, FORMAT_V1: _TABLE_FIELDS_V1}
    if not isinstance(data, dict) or frozenset(data) != fields.get(str(data.get("format"))):
        raise bad("not the fields of one")
    dims, raw, spans, byte_blocks = data["dims"], data["rows"], data["tensors"], data["bytes"]
    if data["dtype"] not in ("int32", "int64") or type(dims) is not int or dims < 0:
        raise bad(f"dtype {data['dtype']!r} with {dims!r} dimensions")
    if data["blocks"] != blocks:
        raise bad(f"it names {data['blocks']!r} blocks, the object holds {blocks}")
    if (
        not isinstance(raw, bytes)
        or not isinstance(spans, dict)
        or not isinstance(byte_blocks, dict)
    ):
        raise bad("malformed rows, tensors or byte items")
    itemsize = 4 if data["dtype"] == "int32" else 8
    width = 1 + 2 * dims
    block_sizes: list[int] | None = None
    if data["format"] == FORMAT:
        block_sizes = data["block_sizes"]
        if not (
            isinstance(block_sizes, list)
            and len(block_sizes) == blocks
            and all(type(n) is int and 0 <= n <= _MAX_DECODED for n in block_sizes)
        ):
            raise bad(f"block sizes {block_sizes!r:.80} for {blocks} blocks")
        raw = _decoded_rows(path, raw, spans, itemsize * width, bad)
    if len(raw) % (itemsize * width):
        raise bad(f"{len(raw)} bytes are not rows of {width} values")
    stored = np.frombuffer(raw, dtype=np.dtype(data["dtype"]).newbyteorder("<"))
    rows = stored.astype(np.int64).reshape(-1, width)
    if len(rows) and (int(rows.min()) < 0 or int(rows[:, 0].max()) >= blocks):
        raise bad("a negative value, or a block the object does not hold")
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
    expected = _byte_items(metadata)
    if set(byte_blocks) != expected or not all(
        type(b) is int and 0 <= b < blocks for b in byte_blocks.values()
    ):
        raise bad("its byte items are not the metadata's")
    per_block = np.bincount(rows[:, 0], minlength=blocks)
    return ItemTable(blocks, chunk_lists, byte_blocks, per_block, block_sizes)


_MAX_DECODED = 1 << 40
"""More decoded bytes than a table's rows or a block can hold (refused unread)."""


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
    if table.block_sizes is not None:
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
