"""Writing DCP metadata at rank scale: one chunk table, and item records in one block per rank.

A save stores its DCP metadata as one object of ranges: range 0 is DCP's ``Metadata``
with every tensor's chunk list left empty and the *chunk table* as its
``storage_data``, then one block of item records per rank that wrote items. The table
and the blocks are specified in docs/format.md, section "DCP checkpoints" ("The metadata
as a chunk table"); :mod:`cairn.torch._tableread` reads them back. No I/O here.

Invariants:

* every rank encodes its own block and chunk rows (:func:`rank_items`), so the
  coordinator's :func:`build_table` does work per rank and per tensor, not per item;
* the table built names exactly the chunks and byte items of the DCP metadata it is
  stored with, each item's record in the block of the rank that wrote it: ranks whose
  items are not those is :class:`~cairn.errors.IncompleteCheckpointError`, before
  anything is stored;
* metadata handed on (an export) has DCP's own plain chunk lists
  (:func:`with_plain_chunks`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

from cairn.errors import IncompleteCheckpointError
from cairn.format.codecs import get_codec
from cairn.format.integrity import sha256_hex
from cairn.format.manifest import PartitionSnapshotEntry, StoreRequests
from cairn.torch._format import ItemRecord, StoredRecord

__all__ = [
    "CODEC",
    "FORMAT",
    "RankItems",
    "StoredTable",
    "build_table",
    "byte_items",
    "carries_ranges",
    "rank_items",
    "with_plain_chunks",
]

FORMAT = "cairn-dcp-chunk-table-v2"
"""The ``format`` of a chunk table: the marker of metadata stored as a table and blocks
(rows and blocks zstd-compressed, each block's decoded size in ``block_sizes``)."""

CODEC = "zstd"
"""How the rows and the blocks of a :data:`FORMAT` table are compressed."""


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
    records: list[tuple[Any, ...]] = []  # each a record's fields, as a block holds them
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
    encoded = msgspec.msgpack.encode((list(names), records))  # [names, records]
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
    expected = byte_items(metadata)
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


def byte_items(metadata: Metadata) -> set[str]:
    """The byte items (values that are not tensors) of DCP's ``metadata``."""
    return {
        fqn
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, BytesStorageMetadata)
    }


def with_plain_chunks(metadata: Metadata) -> Metadata:
    """A shallow copy of ``metadata`` whose tensors' chunk lists are plain lists (what
    DCP's own writers pickle), made from any other sequence (a chunk table's)."""
    plain = copy.copy(metadata)
    plain.state_dict_metadata = {
        fqn: TensorStorageMetadata(md.properties, md.size, list(md.chunks))
        if isinstance(md, TensorStorageMetadata) and not isinstance(md.chunks, list)
        else md
        for fqn, md in metadata.state_dict_metadata.items()
    }
    return plain
