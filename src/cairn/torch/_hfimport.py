"""Importing a safetensors directory: one committed DCP checkpoint, digests made on the way in.

:func:`import_hf_async` reads a directory of safetensors files (``model.safetensors``,
or the shards ``model.safetensors.index.json`` names, or every ``*.safetensors`` at its
top), from a local disk or any store, and commits it as one cairn DCP checkpoint that
:class:`~cairn.torch.CairnReader` loads resharded, as a ``dcp.save`` of the flat state
dict ``{name: tensor}`` from one rank would: each file becomes one object of ranges of
operator ``rank-0`` (docs/format.md, "DCP checkpoints", the metadata pickled whole, as
``import_dcp`` stores it). A tensor of more than :data:`IMPORT_CHUNK_BYTES` is stored as
chunks of whole rows of about that size (DCP's chunks along the first dimension, which
any load reshards), so what the import holds at once is bounded by that size and the
upload's read-ahead, not by the model.

Invariants:

* nothing is committed unless every file is whole: each header is checked before
  anything is uploaded (:func:`cairn.torch._safetensors.parse_header`: every tensor's
  byte range is its dtype times its shape, end to end, ending where the file ends), and
  a tensor named twice, or a file the index names that is missing, is refused;
* safetensors files carry no checksum: a byte damaged before the import is imported as
  it is. From the import on, cairn's SHA-256 digests, computed as the bytes are
  uploaded, protect every byte.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import sys
import time
import uuid
from collections.abc import Callable

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import CheckpointNotFoundError, CorruptManifestError, InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.layout import validate_checkpoint_name
from cairn.integrations._interface import SaveMeter, TwoPhaseSave, begin
from cairn.stores import Store
from cairn.torch._finish import commit_dcp
from cairn.torch._format import dtype_name, rank_operator, tensor_from_bytes
from cairn.torch._rankobject import ItemRanges
from cairn.torch._safetensors import (
    HEADER_LIMIT,
    INDEX_FILE,
    HeaderTensor,
    parse_header,
    parse_index,
)

__all__ = ["IMPORT_CHUNK_BYTES", "ImportedHf", "import_hf_async"]

IMPORT_CHUNK_BYTES = 64 << 20
"""A tensor larger than this is stored as chunks of whole rows of about this size."""

_SINGLE_FILE = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class ImportedHf:
    """What :func:`import_hf` committed: the checkpoint, and what it read.

    Attributes:
        checkpoint_id: The checkpoint committed.
        name: Its name.
        epoch: Its epoch.
        source: The directory read, as given.
        files: The safetensors files read, in the order read.
        tensors: The tensors imported.
        size_bytes: The tensor bytes read.
    """

    checkpoint_id: CheckpointId
    name: str
    epoch: int
    source: str
    files: tuple[str, ...]
    tensors: int
    size_bytes: int


@dataclasses.dataclass(frozen=True)
class _File:
    """One safetensors file of the source: its name and tensors."""

    name: str
    tensors: list[HeaderTensor]


async def _files(source: Store, where: str) -> list[str]:
    """The safetensors files to read: the index's, ``model.safetensors``, or every one."""
    try:
        blob = await source.get(INDEX_FILE)
    except CheckpointNotFoundError:
        pass
    else:
        weight_map = parse_index(f"{where}/{INDEX_FILE}", bytes(blob.data))
        return sorted(set(weight_map.values()))
    listing = await source.list_dir("")
    names = sorted(
        info.path.rsplit("/", 1)[-1]
        for info in listing.objects
        if info.path.endswith(".safetensors")
    )
    if _SINGLE_FILE in names:
        return [_SINGLE_FILE]
    if not names:
        raise InvalidInputError(f"{where} holds no safetensors file")
    return names


async def _read_header(source: Store, where: str, name: str) -> _File:
    try:
        info = await source.head(name)
    except CheckpointNotFoundError:
        raise CorruptManifestError(f"{where}/{name}", "a file the index names is missing") from None
    label = f"{where}/{name}"
    if info.size < 8:
        raise CorruptManifestError(label, f"{info.size} bytes: not a safetensors file")
    first = bytes(await source.get_range(name, 0, 8))
    size = int.from_bytes(first, "little")
    if size > min(HEADER_LIMIT, info.size - 8):
        raise CorruptManifestError(label, f"a header of {size} bytes in a file of {info.size}")
    body = bytes(await source.get_range(name, 8, 8 + size))
    return _File(name, parse_header(label, first, body, info.size))


def _chunks(tensor: HeaderTensor) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
    """``tensor`` cut into chunks of whole rows of at most :data:`IMPORT_CHUNK_BYTES`
    (one row at least): each chunk's offsets, sizes and first byte in the file."""
    shape = tensor.shape
    if not shape or tensor.nbytes <= IMPORT_CHUNK_BYTES:
        return [((0,) * len(shape), shape, tensor.start)]
    row = math.prod(shape[1:]) * tensor.dtype.itemsize
    rows = max(1, IMPORT_CHUNK_BYTES // max(row, 1))
    rest = (0,) * (len(shape) - 1)
    return [
        ((r0, *rest), (min(rows, shape[0] - r0), *shape[1:]), tensor.start + r0 * row)
        for r0 in range(0, shape[0], rows)
    ]


_Where = dict[MetadataIndex, tuple[int, int, HeaderTensor, tuple[int, ...]]]
"""Each item of a file: its first byte in the file, its length, tensor and chunk shape."""


def _size_of(where: _Where, write: WriteItem) -> int:
    return where[write.index][1]


async def import_hf_async(
    ckpt: ObjectStoreCheckpointer,
    source: Store,
    *,
    shown: str,
    name: str,
    epoch: int = 0,
    progress: Callable[[int], None] = lambda n: None,
) -> ImportedHf:
    """:func:`~cairn.torch.import_hf` from ``source`` into ``ckpt`` (async).

    Args:
        ckpt: The checkpointer to commit through.
        source: The store whose root holds the safetensors files.
        shown: How the result and errors name the source.
        name: The checkpoint's name.
        epoch: The epoch the checkpoint records, >= 0.
        progress: Told the bytes of each chunk once it is read.

    Returns:
        The checkpoint committed, and what was read.

    Raises:
        CorruptManifestError: A file is not a whole safetensors file, or one the index
            names is missing; nothing is committed.
        InvalidInputError: No safetensors file, a tensor in two files, or an unusable
            ``epoch`` or ``name``.
    """
    if type(epoch) is not int or epoch < 0:
        raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
    chosen = validate_checkpoint_name(name)
    if sys.byteorder != "little":
        raise InvalidInputError("safetensors files are little-endian: import on such a machine")
    files = [await _read_header(source, shown, f) for f in await _files(source, shown)]
    seen: dict[str, str] = {}
    for file in files:
        for tensor in file.tensors:
            if tensor.name in seen:
                raise InvalidInputError(
                    f"tensor {tensor.name!r} is in {seen[tensor.name]} and {file.name}"
                )
            seen[tensor.name] = file.name
    meter = SaveMeter()
    with meter.counting():
        async with await begin(ckpt, CheckpointId.now()) as save:
            return await _import_into(
                save, ckpt, source, shown, files, epoch, chosen, progress, meter
            )


async def _import_into(
    save: TwoPhaseSave,
    ckpt: ObjectStoreCheckpointer,
    source: Store,
    shown: str,
    files: list[_File],
    epoch: int,
    chosen: str,
    progress: Callable[[int], None],
    meter: SaveMeter,
) -> ImportedHf:
    """Upload every file of ``files`` as one object of ranges of ``save``, then commit."""
    loop = asyncio.get_running_loop()
    state: dict[str, TensorStorageMetadata] = {}
    results: list[WriteResult] = []
    meter.uploading = time.perf_counter()
    for partition, file in enumerate(files):
        writes: list[WriteItem] = []
        where: _Where = {}
        for tensor in file.tensors:
            chunks = _chunks(tensor)
            state[tensor.name] = TensorStorageMetadata(
                TensorProperties(dtype=tensor.dtype),
                torch.Size(tensor.shape),
                [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s, _ in chunks],
            )
            for offsets, sizes, start in chunks:
                index = MetadataIndex(tensor.name, torch.Size(offsets))
                length = math.prod(sizes) * tensor.dtype.itemsize
                where[index] = (start, length, tensor, sizes)
                writes.append(WriteItem(index=index, type=WriteItemType.TENSOR))

        def resolve(write: WriteItem, name: str = file.name, at: _Where = where) -> torch.Tensor:
            start, length, tensor, sizes = at[write.index]
            # Called on a worker thread: the store is read on the event loop.
            future = asyncio.run_coroutine_threadsafe(
                source.get_range(name, start, start + length), loop
            )
            data = future.result()
            if memoryview(data).nbytes != length:
                raise CorruptManifestError(
                    f"{shown}/{name}",
                    f"tensor {tensor.name!r}: {memoryview(data).nbytes} bytes "
                    f"read of {length}: the file changed while it was imported",
                )
            progress(length)
            return tensor_from_bytes(data, dtype_name(tensor.dtype), sizes)

        ranges = ItemRanges(
            writes,
            resolve,
            off_loop=True,
            size_of=functools.partial(_size_of, where),
            codec=ckpt.codec,
        )
        operator = rank_operator(0)
        [entry] = await save.upload([(operator, partition, False, ranges)])
        results += ranges.results(operator, entry)
    metadata = Metadata(
        state_dict_metadata=dict(state),
        planner_data={fqn: (fqn,) for fqn in state},
    )
    await commit_dcp(ckpt, save, epoch, metadata, [results], str(uuid.uuid4()), chosen, None, meter)
    size = sum(t.nbytes for f in files for t in f.tensors)
    return ImportedHf(
        save.checkpoint_id,
        chosen,
        epoch,
        shown,
        tuple(f.name for f in files),
        len(state),
        size,
    )
