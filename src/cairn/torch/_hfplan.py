"""Planning a safetensors export: which tensors, from which saved chunks, read how.

:func:`tensors_to_write` picks the tensors of an opened DCP checkpoint (through an
:data:`FqnMap`) with each chunk's place and digest, and checks that the chunks of each
tensor lie within it, do not overlap and cover it. :func:`plan_steps` turns the
tensors of one shard into :class:`Step` s, each one piece of the file: a tensor saved
whole or in row chunks as ranges of at most :data:`PIECE_BYTES`, one sharded along
another dimension as slabs of about that many bytes (at least one row). Reads of one
object that follow each other are merged into one :class:`Fetch` of at most
:data:`PIECE_BYTES`; a compressed chunk is one fetch of its frame, decoded and checked
whole. Pure but for :meth:`Fetch.begin`, the one read each fetch makes.

Invariant: the reads of a chunk are planned in order, from its first byte to its last,
so that its bytes can be hashed as they are used and checked once whole.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidInputError,
)
from cairn.format.integrity import sha256_hex
from cairn.format.ranges import StoredRange, decode_range
from cairn.stores import Store
from cairn.torch._format import dtype_name
from cairn.torch._opendcp import Opened
from cairn.torch._safetensors import ShardTensor, st_dtype

__all__ = [
    "PIECE_BYTES",
    "Chunk",
    "Fetch",
    "FqnMap",
    "PlannedTensor",
    "Read",
    "Step",
    "mismatch",
    "plan_steps",
    "tensors_to_write",
]

PIECE_BYTES = 8 << 20
"""The most bytes one ranged read covers, and about the most one slab holds."""

_MERGE_GAP = 1 << 20
"""Reads of one object this close together are merged, the bytes between dropped."""

FqnMap = Callable[[str], str | None]
"""A DCP FQN to its name in the safetensors files, or None to leave it out."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One saved chunk of a tensor: where it is, and its record's digest and size."""

    fqn: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    path: str  # the store path of the object holding it
    offset: int
    length: int
    stored_length: int | None
    sha256: str
    where: tuple[str, int]  # its artifact's operator and partition


@dataclasses.dataclass(frozen=True)
class PlannedTensor:
    """One tensor to write: its DCP FQN and chunks, and what it becomes in the file."""

    fqn: str
    source: torch.dtype
    target: torch.dtype
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]
    entry: ShardTensor

    @property
    def by_rows(self) -> bool:
        """Whether its chunks are whole rows: its bytes are theirs, end to end."""
        return all(c.sizes[1:] == self.shape[1:] for c in self.chunks)


class Fetch:
    """Bytes of one object read once for one or more reads: a range of it, or a
    compressed item's frame, decoded and checked whole."""

    def __init__(self, path: str, start: int, end: int, frame: Chunk | None = None) -> None:
        self.path, self.start, self.end, self.frame = path, start, end, frame
        self.users = 0
        self.task: asyncio.Future[memoryview] | None = None

    def begin(self, store: Store) -> asyncio.Future[memoryview]:
        if self.task is None:
            self.task = asyncio.ensure_future(self._read(store))
        return self.task

    async def _read(self, store: Store) -> memoryview:
        try:
            data = await store.get_range(self.path, self.start, self.end)
        except CheckpointNotFoundError:
            raise BrokenChainError(self.path, "the object holding DCP items is gone") from None
        view = memoryview(data).cast("B")
        if view.nbytes != self.end - self.start:
            raise IntegrityMismatchError(
                self.path,
                str(self.end - self.start),
                str(view.nbytes),
                what=f"size of bytes {self.start}..{self.end}",
            )
        chunk = self.frame
        if chunk is None:
            return view
        assert chunk.stored_length is not None
        where = StoredRange(chunk.offset, chunk.stored_length, chunk.sha256, chunk.length)
        decoded = memoryview(await asyncio.to_thread(decode_range, self.path, view, where))
        actual = await asyncio.to_thread(sha256_hex, decoded)
        if actual != chunk.sha256:
            raise mismatch(chunk, actual)
        return decoded.cast("B")


@dataclasses.dataclass(frozen=True)
class Read:
    """Bytes ``lo``..``hi`` of a chunk (as saved, decoded), out of ``fetch`` from ``at``."""

    chunk: Chunk
    lo: int
    hi: int
    fetch: Fetch
    at: int


@dataclasses.dataclass(frozen=True)
class Step:
    """One piece of a file: a tensor's reads, sent as they are (``rows`` None) or put
    together as rows ``rows`` of it."""

    tensor: PlannedTensor
    reads: tuple[Read, ...]
    rows: tuple[int, int] | None


def mismatch(chunk: Chunk, actual: str) -> IntegrityMismatchError:
    what = f"sha256 of item {chunk.fqn!r} (bytes {chunk.offset}..{chunk.offset + chunk.length})"
    error = IntegrityMismatchError(chunk.path, chunk.sha256, actual, what=what)
    error.located(*chunk.where, item=chunk.fqn)
    return error


def tensors_to_write(
    ckpt: ObjectStoreCheckpointer,
    opened: Opened,
    fqn_map: FqnMap,
    dtype: torch.dtype | None,
) -> tuple[list[PlannedTensor], list[str]]:
    """The tensors to write, in the checkpoint's order, and the FQNs left out."""
    where_of = {
        entry.path: (op, entry.partition_id) for op, entry in opened.manifest.partition_entries()
    }
    tensors: list[PlannedTensor] = []
    left_out: list[str] = []
    names: dict[str, str] = {}
    for fqn, md in opened.metadata.state_dict_metadata.items():
        name = fqn_map(fqn) if isinstance(md, TensorStorageMetadata) else None
        if name is None or not isinstance(md, TensorStorageMetadata):
            left_out.append(fqn)
            continue
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise InvalidInputError(f"the FQN map gave {fqn!r} the name {name!r}, not usable")
        if name in names:
            raise InvalidInputError(
                f"the FQN map gives {names[name]!r} and {fqn!r} one name {name!r}"
            )
        names[name] = fqn
        source = md.properties.dtype
        target = dtype if dtype is not None and source.is_floating_point else source
        shape = tuple(int(n) for n in md.size)
        chunks = [
            _chunk(ckpt, opened, where_of, fqn, c.offsets, c.sizes, source) for c in md.chunks
        ]
        _check_cover(opened, fqn, shape, chunks)
        st = st_dtype(target, f"tensor {fqn!r}")
        nbytes = math.prod(shape) * target.itemsize
        entry = ShardTensor(name, st, shape, nbytes, target.itemsize)
        tensors.append(PlannedTensor(fqn, source, target, shape, tuple(chunks), entry))
    return tensors, left_out


def _chunk(
    ckpt: ObjectStoreCheckpointer,
    opened: Opened,
    where_of: dict[str, tuple[str, int]],
    fqn: str,
    offsets: Sequence[int],
    sizes: Sequence[int],
    dtype: torch.dtype,
) -> Chunk:
    index = MetadataIndex(fqn, torch.Size(offsets))
    record = opened.records.get(index)
    here = ckpt.paths.checkpoint_dir(opened.checkpoint_id)
    if record is None:
        raise CorruptManifestError(here, f"the DCP metadata has no record of item {index}")
    shape = tuple(int(n) for n in sizes)
    if record.dtype != dtype_name(dtype) or record.shape != shape:
        raise CorruptManifestError(
            here,
            f"item {fqn!r} at {list(offsets)} is recorded as {record.dtype} {list(record.shape)}, "
            f"the metadata says {dtype_name(dtype)} {list(shape)}",
        )
    entry = opened.entries[record.artifact]
    if entry.codec is not None:
        raise InvalidInputError(
            f"item {fqn!r} is in {record.artifact!r}, compressed whole (a cairn 0.1.0 save): "
            "export it with export_dcp instead"
        )
    path = ckpt.paths.resolve(entry.owner or opened.checkpoint_id, record.artifact)
    return Chunk(
        fqn,
        tuple(int(n) for n in offsets),
        shape,
        path,
        record.offset,
        record.length,
        record.stored_length,
        record.sha256,
        where_of[record.artifact],
    )


def _check_cover(opened: Opened, fqn: str, shape: tuple[int, ...], chunks: list[Chunk]) -> None:
    """The chunks of ``fqn`` lie within it, do not overlap, and cover it."""
    here = str(opened.checkpoint_id)
    for c in chunks:
        if len(c.offsets) != len(shape) or any(
            o + s > n for o, s, n in zip(c.offsets, c.sizes, shape, strict=True)
        ):
            raise CorruptManifestError(
                here, f"a chunk of {fqn!r} lies outside its shape {list(shape)}"
            )
    for i, a in enumerate(chunks):
        for b in chunks[i + 1 :]:
            if (
                all(
                    x < y + t and y < x + s
                    for x, s, y, t in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
                )
                and 0 not in a.sizes
                and 0 not in b.sizes
            ):
                raise CorruptManifestError(here, f"two chunks of {fqn!r} overlap")
    if sum(math.prod(c.sizes) for c in chunks) != math.prod(shape):
        raise CorruptManifestError(
            here, f"the chunks of {fqn!r} do not cover its shape {list(shape)}"
        )


def plan_steps(tensors: Sequence[PlannedTensor]) -> list[Step]:
    """The steps that write ``tensors`` in order, their reads merged into fetches."""
    steps: list[Step] = []
    wanted: list[tuple[Chunk, int, int]] = []
    shapes: list[tuple[PlannedTensor, int, tuple[int, int] | None]] = []  # tensor, reads, rows

    def read(chunk: Chunk, lo: int, hi: int) -> None:
        wanted.append((chunk, lo, hi))

    for tensor in tensors:
        itemsize = tensor.source.itemsize
        if tensor.by_rows:
            for chunk in sorted(tensor.chunks, key=lambda c: c.offsets[:1]):
                if chunk.length == 0:
                    continue
                step = chunk.length if chunk.stored_length is not None else PIECE_BYTES
                for lo in range(0, chunk.length, step):
                    read(chunk, lo, min(chunk.length, lo + step))
                    shapes.append((tensor, 1, None))
            continue
        row = math.prod(tensor.shape[1:]) * itemsize
        per_slab = max(1, PIECE_BYTES // max(row, 1))
        for r0 in range(0, tensor.shape[0], per_slab):
            r1 = min(tensor.shape[0], r0 + per_slab)
            count = 0
            for chunk in tensor.chunks:
                a, b = max(r0, chunk.offsets[0]), min(r1, chunk.offsets[0] + chunk.sizes[0])
                local = math.prod(chunk.sizes[1:]) * itemsize
                if a < b and local:
                    read(chunk, (a - chunk.offsets[0]) * local, (b - chunk.offsets[0]) * local)
                    count += 1
            shapes.append((tensor, count, (r0, r1)))
    reads = _fetches(wanted)
    at = 0
    for tensor, count, rows in shapes:
        steps.append(Step(tensor, tuple(reads[at : at + count]), rows))
        at += count
    return steps


def _fetches(wanted: Sequence[tuple[Chunk, int, int]]) -> list[Read]:
    """``wanted``'s reads, each given the fetch it comes out of: a compressed chunk's
    frame (one per chunk), or a range merged with its neighbours of the same object."""
    reads: list[Read] = []
    frames: dict[int, Fetch] = {}
    current: Fetch | None = None
    for chunk, lo, hi in wanted:
        if chunk.stored_length is not None:
            fetch = frames.get(id(chunk))
            if fetch is None:
                end = chunk.offset + chunk.stored_length
                fetch = frames[id(chunk)] = Fetch(chunk.path, chunk.offset, end, chunk)
            fetch.users += 1
            reads.append(Read(chunk, lo, hi, fetch, lo))
            continue
        start, end = chunk.offset + lo, chunk.offset + hi
        if (
            current is None
            or current.path != chunk.path
            or not current.end <= start <= current.end + _MERGE_GAP
            or end - current.start > PIECE_BYTES
        ):
            current = Fetch(chunk.path, start, end)
        current.end = end
        current.users += 1
        reads.append(Read(chunk, lo, hi, current, start - current.start))
    return reads
