"""The safetensors file format and Hugging Face's sharded layout, as cairn reads and writes
them. Pure: no I/O.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(each tensor's ``dtype``, ``shape`` and ``data_offsets`` into the data, and an optional
``__metadata__`` of strings), then the tensors' bytes, little-endian, in C order, end to
end. A sharded model is ``model-{k:05d}-of-{n:05d}.safetensors`` (k = 1 … n) with
``model.safetensors.index.json``, whose ``weight_map`` names each tensor's file.

Invariants:

* a header cairn writes is compact JSON padded with spaces to a multiple of 8 bytes, with
  ``__metadata__`` ``{"format": "pt"}``, and tensors laid out by element size, largest
  first, so that every tensor starts at a multiple of its element size;
* a header cairn reads is accepted only if its tensors' byte ranges are exactly their
  dtype times shape, start at 0, follow each other without gap or overlap, and end where
  the file ends (:func:`parse_header`): nothing is read outside a tensor's range.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable, Sequence

import torch

from cairn.errors import CorruptManifestError, InvalidInputError

__all__ = [
    "HEADER_LIMIT",
    "INDEX_FILE",
    "HeaderTensor",
    "ShardTensor",
    "dtype_of",
    "encode_header",
    "index_document",
    "lay_out",
    "parse_header",
    "parse_index",
    "plan_shards",
    "shard_name",
    "st_dtype",
]

INDEX_FILE = "model.safetensors.index.json"
"""The index of a sharded model: which file holds each tensor."""

HEADER_LIMIT = 100_000_000
"""The largest header the safetensors library reads (100 MB); cairn refuses larger."""

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}


def st_dtype(dtype: torch.dtype, what: str) -> str:
    """The safetensors name of ``dtype`` (``torch.float32`` -> ``"F32"``).

    Raises :class:`InvalidInputError` naming ``what`` for a dtype safetensors lacks.
    """
    name = _DTYPES.get(dtype)
    if name is None:
        raise InvalidInputError(f"{what}: safetensors has no dtype for {dtype}")
    return name


def dtype_of(name: object, where: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name; :class:`CorruptManifestError` naming
    ``where`` for any other value."""
    dtype = _BY_NAME.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise CorruptManifestError(where, f"unknown safetensors dtype {name!r:.40}")
    return dtype


def shard_name(number: int, count: int) -> str:
    """``model-00001-of-00003.safetensors``: shard ``number`` (from 1) of ``count``."""
    return f"model-{number:05d}-of-{count:05d}.safetensors"


@dataclasses.dataclass(frozen=True)
class ShardTensor:
    """One tensor of a file to write: its name, safetensors dtype, shape and bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    itemsize: int


def plan_shards(tensors: Sequence[ShardTensor], max_shard_bytes: int) -> list[list[ShardTensor]]:
    """``tensors``, in order, cut into shards of at most ``max_shard_bytes`` of tensor
    data, as ``transformers`` does: a tensor that does not fit in the current shard starts
    the next; one larger than the limit is a shard of its own. At least one shard."""
    shards: list[list[ShardTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def lay_out(
    tensors: Sequence[ShardTensor], position: Callable[[ShardTensor], tuple[object, ...]]
) -> list[ShardTensor]:
    """The order of ``tensors`` in a file: by element size, largest first (each then starts
    aligned to it), and by ``position`` among equals (where their bytes are read from,
    so that neighbouring reads can be merged)."""
    return sorted(tensors, key=lambda t: (-t.itemsize, *position(t)))


def encode_header(tensors: Sequence[ShardTensor]) -> bytes:
    """The first bytes of a file holding ``tensors`` in this order: the length and the
    JSON header, padded with spaces to a multiple of 8."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def index_document(total_size: int, weight_map: dict[str, str], checkpoint_id: str) -> bytes:
    """``model.safetensors.index.json``: the data bytes of all shards, each tensor's file,
    and the checkpoint the files were exported from."""
    document = {
        "metadata": {"total_size": total_size, "cairn_checkpoint_id": checkpoint_id},
        "weight_map": dict(sorted(weight_map.items())),
    }
    return (json.dumps(document, indent=2) + "\n").encode()


@dataclasses.dataclass(frozen=True)
class HeaderTensor:
    """One tensor of a file read: its name, dtype, shape, and where its bytes are in the
    file (``start`` counted from the file's first byte)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int


def parse_header(
    where: str, length_bytes: bytes, body: bytes, file_size: int
) -> list[HeaderTensor]:
    """The tensors of a safetensors file of ``file_size`` bytes from its first 8 bytes
    and its header, in file order; :class:`CorruptManifestError` naming ``where`` for a
    header that is not of the form the module docstring states."""
    (size,) = struct.unpack("<Q", length_bytes)
    if size != len(body):
        raise CorruptManifestError(where, f"header of {size} bytes, {len(body)} read")
    try:
        header = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptManifestError(where, f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CorruptManifestError(where, "header is not a JSON object")
    tensors: list[HeaderTensor] = []
    data_start = 8 + size
    for name, value in header.items():
        if name == "__metadata__":
            continue
        tensors.append(_header_tensor(where, name, value, data_start))
    tensors.sort(key=lambda t: t.start)
    offset = data_start
    for tensor in tensors:
        if tensor.start != offset:
            raise CorruptManifestError(
                where,
                f"tensor {tensor.name!r} starts at data byte {tensor.start - data_start}, "
                f"not {offset - data_start}: the data has a gap or an overlap",
            )
        offset += tensor.nbytes
    if offset != file_size:
        raise CorruptManifestError(
            where, f"the tensors end at byte {offset}, the file at byte {file_size}"
        )
    return tensors


def _header_tensor(where: str, name: str, value: object, data_start: int) -> HeaderTensor:
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise CorruptManifestError(where, f"tensor {name!r}: malformed entry {value!r:.120}")
    dtype = dtype_of(value["dtype"], where)
    shape, offsets = value["shape"], value["data_offsets"]
    ints = (
        all(type(n) is int and n >= 0 for n in [*shape, *offsets])
        if (isinstance(shape, list) and isinstance(offsets, list))
        else False
    )
    if not ints or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise CorruptManifestError(where, f"tensor {name!r}: malformed entry {value!r:.120}")
    nbytes = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise CorruptManifestError(
            where,
            f"tensor {name!r} of {value['dtype']} {shape} needs {nbytes} bytes, its offsets "
            f"give {offsets[1] - offsets[0]}",
        )
    return HeaderTensor(name, dtype, tuple(shape), data_start + offsets[0], nbytes)


def parse_index(where: str, data: bytes) -> dict[str, str]:
    """The ``weight_map`` of ``model.safetensors.index.json`` (tensor name -> file name);
    :class:`CorruptManifestError` naming ``where`` when it is not one."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptManifestError(where, f"not JSON ({exc})") from None
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v and "/" not in v and v not in (".", "..")
        for k, v in weight_map.items()
    ):
        raise CorruptManifestError(where, "no weight_map of tensor names to file names")
    return weight_map
