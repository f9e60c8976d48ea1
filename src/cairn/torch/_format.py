"""How DCP items are laid out in cairn artifacts, and read back. No I/O.

A rank's items become artifacts of operator ``rank-{r}``: objects of ranges
(:mod:`cairn.torch._rankobject`; with compression, each item a frame of its own in
one). Each item is described by an :class:`ItemRecord` (where its bytes are, their
SHA-256, and for a tensor its dtype and shape), in a block of its rank's records
(:mod:`cairn.torch._itemtable`). A stored checkpoint may instead keep its records as
plain tuples in DCP's ``Metadata.storage_data``, and place items in artifacts of one
tensor, or bundles of several, compressed whole: records of those are read the same way
(docs/format.md, section "DCP checkpoints").

Invariants:

* a record's bytes are exactly ``tensor.contiguous()``'s memory in C order (native byte
  order) or the bytes DCP's planner handed in; its ``sha256`` is over exactly those bytes;
* records are plain tuples of ``str``/``int``: unpickling them needs no class of cairn's,
  so the stored format does not depend on where cairn's code lives;
* the DCP metadata is unpickled only from verified bytes, and only with the globals DCP's
  own metadata needs (:func:`load_metadata`): anything else is refused, not imported.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.distributed.checkpoint import metadata as dcp_metadata

from cairn.errors import CorruptManifestError, InvalidInputError
from cairn.format.layout import validate_relative_path
from cairn.integrations._interface import Buffer

__all__ = [
    "METADATA_OPERATOR",
    "ItemRecord",
    "StoredRecord",
    "copy_bytes_into",
    "dtype_name",
    "dump_metadata",
    "load_metadata",
    "parse_record",
    "rank_operator",
    "tensor_bytes",
    "tensor_from_bytes",
]

METADATA_OPERATOR = "dcp-metadata"
"""The operator whose partition 0 holds DCP's metadata."""


def rank_operator(rank: int) -> str:
    """The operator under which a rank stores its items.

    Args:
        rank: The rank's index in its process group.

    Returns:
        The operator name, ``"rank-<rank>"``.
    """
    return f"rank-{rank}"


StoredRecord = (
    tuple[str, int, int, str, str, tuple[int, ...]]
    | tuple[str, int, int, str, str, tuple[int, ...], int]
)
"""An item record as DCP's ``storage_data`` holds it (:meth:`ItemRecord.stored`)."""


class ItemRecord(NamedTuple):
    """Where one DCP item's bytes are stored, and what they are.

    ``artifact`` is relative to the checkpoint directory (as manifest entries are);
    ``offset`` places the item in the artifact's bytes (as stored, for an artifact that
    is an object of ranges; before compression, for one compressed whole) and
    ``length`` is the item's size; ``stored_length`` is set when the item is a
    compressed range of an object of ranges (:mod:`cairn.format.ranges`): its frame is the
    ``stored_length`` bytes from ``offset``, and decodes to ``length`` bytes. ``dtype``
    is a torch dtype name (``"float32"``) for a tensor and ``""`` for a byte item;
    ``shape`` is the tensor's shape (``()`` for a byte item).
    """

    artifact: str
    offset: int
    length: int
    sha256: str
    dtype: str
    shape: tuple[int, ...]
    stored_length: int | None = None

    @property
    def extent(self) -> tuple[int, int]:
        """The item's bytes as stored: ``(offset, length)`` in its artifact."""
        return self.offset, self.length if self.stored_length is None else self.stored_length

    def stored(self) -> StoredRecord:
        """The record as the plain tuple kept in DCP's metadata (of six fields, or seven
        for a compressed range)."""
        fields = (self.artifact, self.offset, self.length, self.sha256, self.dtype, self.shape)
        return fields if self.stored_length is None else (*fields, self.stored_length)


def parse_record(path: str, value: object) -> ItemRecord:
    """A stored record checked field by field; :class:`CorruptManifestError` naming ``path``."""
    if not isinstance(value, tuple) or len(value) not in (6, 7):
        raise CorruptManifestError(path, f"an item record is not a 6- or 7-tuple: {value!r:.120}")
    artifact, offset, length, sha256, dtype, shape = value[:6]
    stored_length = value[6] if len(value) == 7 else None
    ok = (
        isinstance(artifact, str)
        and type(offset) is int
        and type(length) is int
        and offset >= 0
        and length >= 0
        and isinstance(sha256, str)
        and len(sha256) == 64
        and isinstance(dtype, str)
        and isinstance(shape, tuple)
        and all(type(n) is int and n >= 0 for n in shape)
        and (stored_length is None or (type(stored_length) is int and stored_length >= 0))
    )
    if not ok:
        raise CorruptManifestError(path, f"malformed item record {value!r:.200}")
    try:
        validate_relative_path(artifact)
    except InvalidInputError as exc:
        raise CorruptManifestError(path, f"item record: {exc}") from None
    record = ItemRecord(artifact, offset, length, sha256, dtype, shape, stored_length)
    if dtype:
        expected = _numel(shape) * _dtype(path, dtype).itemsize
        if expected != length:
            raise CorruptManifestError(
                path,
                f"item record of a {dtype} tensor of shape {list(shape)} says {length} "
                f"bytes, not {expected}",
            )
    return record


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def _dtype(path: str, name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptManifestError(path, f"item record names no torch dtype: {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``: the name :func:`parse_record` reads back."""
    return str(dtype).removeprefix("torch.")


_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)
"""The dtypes ``Tensor.numpy()`` takes as they are (bfloat16 and float8 it refuses)."""


def tensor_bytes(tensor: torch.Tensor, what: str) -> tuple[memoryview, torch.Tensor, bool]:
    """The tensor's bytes as a flat view, the tensor that owns them, and whether they are
    a copy.

    A contiguous CPU tensor's view shares its memory (no copy). A tensor on another
    device, non-contiguous, or with a lazy conjugate or negative bit is copied to a
    contiguous CPU tensor first. A sparse or quantized tensor is refused with
    :class:`InvalidInputError` naming ``what``.

    The common case, a contiguous CPU tensor, costs only attribute reads and one
    ``numpy()``: torch's operators release the GIL, and a rank resolves items on several
    threads at once, where every release can wait a switch interval to get it back.
    """
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise InvalidInputError(
            f"{what}: a {tensor.layout} {'quantized ' if tensor.is_quantized else ''}tensor "
            "cannot be stored as raw bytes; convert it to a dense tensor first"
        )
    owner = tensor.detach() if tensor.requires_grad else tensor
    copied = False
    if not owner.is_cpu:
        owner, copied = owner.cpu(), True
    if owner.is_conj() or owner.is_neg():
        owner, copied = owner.resolve_conj().resolve_neg(), True
    if not owner.is_contiguous():
        owner, copied = owner.contiguous(), True
    if owner.dtype in _NUMPY_DTYPES:
        array = owner.numpy()
    else:  # reinterpreted as bytes by torch first
        array = owner.reshape(-1).view(torch.uint8).numpy()
    return array.reshape(-1).view(np.uint8).data, owner, copied


def tensor_from_bytes(data: Buffer, dtype_str: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A new CPU tensor of ``dtype``/``shape`` holding a copy of ``data`` (C order)."""
    tensor = torch.empty(shape, dtype=_dtype("", dtype_str))
    copy_bytes_into(tensor, data)
    return tensor


def copy_bytes_into(tensor: torch.Tensor, data: Buffer) -> None:
    """Copy raw bytes into a contiguous CPU ``tensor`` of exactly their size."""
    if tensor.numel() == 0:
        return
    target = tensor.reshape(-1).view(torch.uint8).numpy()
    # numpy, not torch.frombuffer: the store's buffers are read-only, which torch warns of.
    np.copyto(target, np.frombuffer(memoryview(data), dtype=np.uint8))


# -- DCP's metadata: pickled by DCP's own classes; read back only from verified bytes ---


def dump_metadata(metadata: dcp_metadata.Metadata) -> bytes:
    """DCP's metadata as bytes (pickle, as DCP's own writers store it)."""
    return pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)


_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_OTHER_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata, importing nothing but what DCP's metadata is made of."""

    def __init__(
        self, data: io.BytesIO, path: str, extra: frozenset[tuple[str, str]] = frozenset()
    ) -> None:
        super().__init__(data)
        self._path = path
        self._extra = extra

    def find_class(self, module: str, name: str) -> Any:
        if module == _METADATA_MODULE and isinstance(getattr(dcp_metadata, name, None), type):
            return getattr(dcp_metadata, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), torch.dtype | torch.layout | torch.memory_format
        ):
            return getattr(torch, name)
        if (module, name) in _OTHER_GLOBALS or (module, name) in self._extra:
            return super().find_class(module, name)
        raise CorruptManifestError(
            self._path,
            f"DCP metadata refers to {module}.{name}, which is not part of DCP's metadata: "
            "refusing to import it",
        )


def load_metadata(
    path: str, data: Buffer, *, extra_globals: Iterable[tuple[str, str]] = ()
) -> dcp_metadata.Metadata:
    """DCP's metadata from ``data`` (already verified) read from ``path``.

    Raises :class:`CorruptManifestError` naming ``path`` when the bytes do not unpickle
    into a :class:`~torch.distributed.checkpoint.metadata.Metadata` with only the globals
    DCP's metadata uses, and ``extra_globals`` (``(module, name)`` pairs: what another
    writer's metadata holds, such as ``FileSystemWriter``'s storage records).
    """
    extra = frozenset(extra_globals)
    try:
        loaded = _MetadataUnpickler(io.BytesIO(bytes(data)), path, extra).load()
    except CorruptManifestError:
        raise
    except Exception as exc:  # whatever pickle raises for damaged input
        raise CorruptManifestError(path, f"DCP metadata does not unpickle: {exc}") from None
    if not isinstance(loaded, dcp_metadata.Metadata):
        raise CorruptManifestError(
            path, f"not DCP metadata: a {type(loaded).__name__} was stored there"
        )
    return loaded
