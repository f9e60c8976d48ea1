"""DCP's own directory format, read and checked: what an import reads and an export writes.

The format is the one ``torch.distributed.checkpoint.FileSystemWriter`` writes (its
``torch_save`` serialization) and ``FileSystemReader`` reads::

    DIR/.metadata              DCP's Metadata, pickled; its storage_data maps each item
                               (a MetadataIndex) to _StorageInfo(relative_path, offset,
                               length, transform_descriptors)
    DIR/__{rank}_{n}.distcp    items back to back: a byte item's bytes as DCP's planner
                               gave them; a tensor item as ``torch.save`` of the tensor
                               (a zip archive, each member with its CRC-32)

Invariants:

* every file is read relative to a descriptor of the directory, never through a link
  (``DIR`` itself may be one: the caller named it): a link among its files is refused,
  ``.metadata`` included, as is anything but a plain file;
* ``.metadata`` is unpickled with only DCP's own metadata types, its storage records and
  a saved path (nothing is imported for it: see :func:`cairn.torch._format.load_metadata`),
  and must match itself: every chunk of every tensor and every byte item has a storage
  record, and every record an item;
* each record's file is a plain file of the directory, and each file's records cover it
  exactly, back to back from byte 0 (a missing file, a short or a longer file, an item
  range past the end or overlapping another is refused);
* each tensor item must be a ``torch.save`` archive whose every member matches the
  CRC-32 recorded in the archive (``torch.save`` records them; ``FileSystemReader`` and
  ``torch.load`` do not check them), and load as a tensor of the dtype and shape the
  metadata gives its chunk; a byte item that is such an archive (DCP's default planner
  stores every non-tensor value so) must match its CRC-32s too.

What this cannot see: DCP's metadata carries no digest of its own, and a byte item that
a planner stored raw (not as a ``torch.save`` archive) has no checksum anywhere, so a
flipped byte inside such an item, a flip in the four bytes that mark an archive, or a
``.metadata`` changed consistently with the files, passes. CRC-32 finds accidental
damage, not a deliberate change. Stream transforms (``FileSystemWriter(_extensions=...)``),
the safetensors serialization and rank-local metadata (``use_collectives=False``) are
refused (:class:`~cairn.InvalidInputError`), not half-read.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from cairn.errors import (
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidInputError,
    MissingArtifactError,
)
from cairn.torch._format import dtype_name, load_metadata

__all__ = [
    "METADATA_FILE",
    "ZIP_MAGIC",
    "DcpDir",
    "DcpItem",
    "Files",
    "Progress",
    "absolute",
    "load_item",
    "no_progress",
    "read_dcp_dir",
]

METADATA_FILE = ".metadata"
_RANK_LOCAL_METADATA = re.compile(r"__.*\.metadata")
_EXTRA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}
"""What ``FileSystemWriter``'s metadata holds besides DCP's metadata types: its storage
records, and the path it was saved to (``StorageMeta.checkpoint_id``)."""

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
ZIP_MAGIC = b"PK\x03\x04"
"""The first bytes of a ``torch.save`` archive (a zip file's first local header)."""


Progress = Callable[[int], None]
"""Told the number of bytes each step of an import or an export moved (a progress bar)."""


def no_progress(_: int) -> None:
    """A :data:`Progress` that shows nothing."""


def absolute(path: Path) -> Path:
    """``path``, which must be absolute (:class:`~cairn.InvalidInputError` otherwise)."""
    if not path.is_absolute():
        raise InvalidInputError(f"give an absolute path, not {str(path)!r}")
    return path


@dataclasses.dataclass(frozen=True)
class DcpItem:
    """One item of a DCP directory: where its bytes are, and what it holds.

    ``dtype``/``shape`` are the metadata's for a tensor chunk; ``dtype`` is ``""`` for
    a byte item.
    """

    index: MetadataIndex
    file: str
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]


class Files(Protocol):
    """A directory's plain files, read without following a link: a
    :class:`~cairn.stores.localfiles.LocalDirectory`, or the
    :class:`~cairn.stores.localfiles.StagedTree` an export writes."""

    @property
    def path(self) -> Path:
        """The directory, as messages name it."""
        ...

    def names(self) -> list[str]:
        """The names in the directory, sorted."""
        ...

    def open(self, relative: str) -> BinaryIO:
        """A plain file, open for reading; ``FileNotFoundError`` if missing,
        :class:`~cairn.InvalidInputError` for a link or anything but a plain file."""
        ...


@dataclasses.dataclass(frozen=True)
class DcpDir:
    """A DCP directory whose metadata matches its files: where they are, the metadata,
    the items of each file in offset order, and each file's size."""

    source: Files
    metadata: Metadata
    files: dict[str, list[DcpItem]]
    sizes: dict[str, int]

    @property
    def root(self) -> Path:
        """The directory, as messages name it."""
        return self.source.path


def _open(source: Files, name: str) -> BinaryIO:
    """File ``name`` of ``source``; :class:`~cairn.MissingArtifactError` if missing."""
    try:
        return source.open(name)
    except (FileNotFoundError, NotADirectoryError):
        raise MissingArtifactError(
            str(source.path / name), f"DCP directory {source.path}"
        ) from None


def read_dcp_dir(source: Files) -> DcpDir:
    """The metadata and items of the DCP directory ``source``, its structure checked (see
    the module docstring); no item's bytes are read. Raises
    :class:`~cairn.MissingArtifactError` for a missing file,
    :class:`~cairn.IntegrityMismatchError` for a file of the wrong size,
    :class:`~cairn.CorruptManifestError` for metadata that does not match itself or its
    files, and :class:`~cairn.InvalidInputError` for what import does not read."""
    root = source.path
    try:
        names = source.names()
    except (FileNotFoundError, NotADirectoryError):
        names = []
    if METADATA_FILE not in names:
        local = [name for name in names if _RANK_LOCAL_METADATA.fullmatch(name)]
        if local:
            raise InvalidInputError(
                f"{root} holds rank-local metadata ({local[0]}: saved with "
                "use_collectives=False), not one .metadata: import reads only the latter"
            )
    with _open(source, METADATA_FILE) as stream:
        body = stream.read()
    where = str(root / METADATA_FILE)
    metadata = load_metadata(where, body, extra_globals=_EXTRA_GLOBALS)
    files = _items_by_file(where, root, metadata)
    sizes = {name: _check_file(source, name, items) for name, items in sorted(files.items())}
    return DcpDir(source, metadata, files, sizes)


def _items_by_file(where: str, root: Path, metadata: Metadata) -> dict[str, list[DcpItem]]:
    """The items of each file the storage records of ``metadata`` name; every item of
    the state dict has one record, and every record an item."""
    stored = metadata.storage_data
    if not isinstance(stored, dict):
        raise CorruptManifestError(where, "DCP metadata holds no storage records")
    wanted = _expected_items(where, metadata)
    files: dict[str, list[DcpItem]] = {}
    for index, info in stored.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise CorruptManifestError(
                where, f"a storage record is not DCP's: {index!r:.100} -> {info!r:.100}"
            )
        shape = wanted.pop((index.fqn, _offsets(index.offset)), None)
        if shape is None:
            raise CorruptManifestError(
                where, f"storage record {index} names no item of the state dict, or twice"
            )
        if info.transform_descriptors:
            raise InvalidInputError(
                f"{root}: item {index.fqn!r} was stored through DCP stream transforms "
                f"({', '.join(map(str, info.transform_descriptors))}), which import does not read"
            )
        name = info.relative_path
        ok = isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
        ok = ok and "\\" not in name and type(info.offset) is int and type(info.length) is int
        if not ok or info.offset < 0 or info.length < 0 or name == METADATA_FILE:
            raise CorruptManifestError(where, f"malformed storage record of {index}: {info!r:.200}")
        dtype, dims = shape
        files.setdefault(name, []).append(
            DcpItem(index, name, info.offset, info.length, dtype, dims)
        )
    if wanted:
        (fqn, offsets), _ = next(iter(wanted.items()))
        raise CorruptManifestError(
            where,
            f"{len(wanted)} item(s) of the state dict have no storage record, such as "
            f"{fqn!r}" + (f" at offsets {list(offsets)}" if offsets is not None else ""),
        )
    return files


def _offsets(offset: object) -> tuple[int, ...] | None:
    return None if offset is None else tuple(int(n) for n in offset)  # type: ignore[attr-defined]


def _expected_items(
    where: str, metadata: Metadata
) -> dict[tuple[str, tuple[int, ...] | None], tuple[str, tuple[int, ...]]]:
    """Every item the state dict metadata describes: (fqn, chunk offsets or None) ->
    (dtype name or "", chunk shape)."""
    items: dict[tuple[str, tuple[int, ...] | None], tuple[str, tuple[int, ...]]] = {}
    described = metadata.state_dict_metadata
    if not isinstance(described, dict):
        raise CorruptManifestError(where, "DCP metadata describes no state dict")
    for fqn, meta in described.items():
        if isinstance(meta, BytesStorageMetadata):
            items[(fqn, None)] = ("", ())
        elif isinstance(meta, TensorStorageMetadata):
            dtype = dtype_name(meta.properties.dtype)
            for chunk in meta.chunks:
                items[(fqn, tuple(chunk.offsets))] = (dtype, tuple(int(n) for n in chunk.sizes))
        else:
            raise CorruptManifestError(where, f"item {fqn!r} is described by {meta!r:.100}")
    return items


def _check_file(source: Files, name: str, items: list[DcpItem]) -> int:
    """Check that ``items`` tile file ``name`` exactly; its size. Sorts ``items``."""
    root = source.path
    with _open(source, name) as stream:
        size = os.fstat(stream.fileno()).st_size
    items.sort(key=lambda item: item.offset)
    position = 0
    for item in items:
        if item.offset != position:
            what = "overlaps the item before it" if item.offset < position else "leaves a gap"
            raise CorruptManifestError(
                str(root / METADATA_FILE),
                f"item {item.index.fqn!r} of {name} starts at byte {item.offset}, which "
                f"{what} (expected {position})",
            )
        position += item.length
    if position != size:
        if position > size:
            last = next(i for i in items if i.offset + i.length > size)
            what = (
                f"size of {name}: item {last.index.fqn!r} ends at byte "
                f"{last.offset + last.length}, past the end (the file is short)"
            )
        else:
            what = f"size of {name}: it holds bytes after its last item"
        raise IntegrityMismatchError(str(root / name), str(position), str(size), what=what)
    return size


def _check_archive(path: str, item: DcpItem, blob: bytes) -> None:
    """Check every member of the ``torch.save`` archive ``blob`` against its CRC-32."""
    what = f"item {item.index.fqn!r} (bytes {item.offset}..{item.offset + item.length})"
    try:
        members = zipfile.ZipFile(io.BytesIO(blob)).infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise IntegrityMismatchError(
            path, "a torch.save archive", f"unreadable bytes ({exc})", what=what
        ) from None
    view = memoryview(blob)
    for member in members:
        start = member.header_offset
        header = view[start : start + _LOCAL_HEADER.size]
        if member.compress_type != zipfile.ZIP_STORED or len(header) != _LOCAL_HEADER.size:
            raise IntegrityMismatchError(
                path, "a torch.save archive", f"a damaged member {member.filename}", what=what
            )
        fields = _LOCAL_HEADER.unpack(header)
        data_start = start + _LOCAL_HEADER.size + fields[9] + fields[10]
        data = view[data_start : data_start + member.compress_size]
        actual = zlib.crc32(data)
        if fields[0] != ZIP_MAGIC or len(data) != member.compress_size or actual != member.CRC:
            raise IntegrityMismatchError(
                path,
                f"{member.CRC:08x}",
                f"{actual:08x}",
                what=f"CRC-32 of {member.filename} in {what}",
            )


def _read_item(scanned: DcpDir, item: DcpItem) -> bytes:
    """The bytes of ``item``, read from its file."""
    with _open(scanned.source, item.file) as stream:
        stream.seek(item.offset)
        return stream.read(item.length)


def load_item(scanned: DcpDir, item: DcpItem) -> tuple[Any, int]:
    """Item ``item``'s value, checked (a tensor, or a byte item's BytesIO), and its size."""
    path = scanned.root / item.file
    blob = _read_item(scanned, item)
    if len(blob) != item.length:  # the file changed since it was checked
        raise IntegrityMismatchError(
            str(path), str(item.length), str(len(blob)), what=f"size of {item.index.fqn!r}"
        )
    if not item.dtype:
        # DCP's default planner stores every byte item as torch.save of the value: an
        # archive with CRC-32s. Bytes that do not start like one came from a planner
        # that stores them raw, and have no checksum to check.
        if blob.startswith(ZIP_MAGIC):
            _check_archive(str(path), item, blob)
        return io.BytesIO(blob), len(blob)
    _check_archive(str(path), item, blob)
    try:
        tensor = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # whatever torch.load raises for bytes that are not a tensor
        raise CorruptManifestError(
            str(path), f"item {item.index.fqn!r} does not load as a tensor: {exc}"
        ) from None
    if not isinstance(tensor, torch.Tensor):
        raise CorruptManifestError(
            str(path), f"item {item.index.fqn!r} holds a {type(tensor).__name__}, not a tensor"
        )
    found = (dtype_name(tensor.dtype), tuple(tensor.shape))
    if found != (item.dtype, item.shape):
        raise CorruptManifestError(
            str(scanned.root / METADATA_FILE),
            f"item {item.index.fqn!r} of {item.file} holds a {found[0]} tensor of shape "
            f"{list(found[1])}; the metadata says {item.dtype} {list(item.shape)}",
        )
    return tensor, len(blob)
