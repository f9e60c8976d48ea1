"""In and out of DCP's own directory format: :func:`export_dcp` and :func:`import_dcp`.

The format is the one ``torch.distributed.checkpoint.FileSystemWriter`` writes (its
``torch_save`` serialization) and ``FileSystemReader`` reads::

    DIR/.metadata              DCP's Metadata, pickled; its storage_data maps each item
                               (a MetadataIndex) to _StorageInfo(relative_path, offset,
                               length, transform_descriptors)
    DIR/__{rank}_{n}.distcp    items back to back: a byte item's bytes as DCP's planner
                               gave them; a tensor item as ``torch.save`` of the tensor
                               (a zip archive, each member with its CRC-32)

**Export** writes a cairn DCP checkpoint as such a directory: one ``__{r}_{n}.distcp``
per artifact ``operators/rank-{r}/partition-{n}``. Every item is verified against its
SHA-256 as it is read (as :class:`~cairn.torch.CairnReader` does); the files and the
``.metadata`` are written into a staging directory beside ``DIR`` and fsynced; the
staged directory is then read back as DCP would read it and every item checked again
(the structure and sizes below, each tensor's CRC-32, and the SHA-256 of each item's
bytes against cairn's record); only then is it renamed to ``DIR`` (one atomic rename;
``DIR`` must be missing or an empty directory). A failure leaves ``DIR`` as it was.

**Import** commits a DCP directory as one cairn checkpoint that ``CairnReader`` loads
bit-exactly. Nothing is committed unless the directory is whole:

* ``.metadata`` must unpickle with only DCP's own metadata types (nothing is imported
  for it: see :func:`cairn.torch._format.load_metadata`), and match itself: every chunk
  of every tensor and every byte item has a storage record, and every record an item;
* each record's file must be a plain file of the directory, and each file's records
  must cover it exactly, back to back from byte 0 (a missing file, a short or a longer
  file, an item range past the end or overlapping another is refused);
* each tensor item must be a ``torch.save`` archive whose every member matches the
  CRC-32 recorded in the archive (``torch.save`` records them; ``FileSystemReader`` and
  ``torch.load`` do not check them), and load as a tensor of the dtype and shape the
  metadata gives its chunk;
* each byte item that is a ``torch.save`` archive (DCP's default planner stores every
  non-tensor value so) must match its CRC-32s too.

What this cannot see: DCP's metadata carries no digest of its own, and a byte item that
a planner stored raw (not as a ``torch.save`` archive) has no checksum anywhere, so a
flipped byte inside such an item, a flip in the four bytes that mark an archive, or a
``.metadata`` changed consistently with the files, is imported as found. CRC-32 finds
accidental damage, not a deliberate change. From the import on, cairn's SHA-256 digests
(computed as the bytes are uploaded) protect every item. Stream transforms
(``FileSystemWriter(_extensions=...)``), the safetensors serialization and rank-local
metadata (``use_collectives=False``) are refused
(:class:`~cairn.InvalidInputError`), not half-read.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import io
import os
import pickle
import re
import secrets
import shutil
import struct
import time
import uuid
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import (
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidInputError,
    MissingArtifactError,
)
from cairn.format.ids import CheckpointId
from cairn.format.integrity import sha256_hex
from cairn.format.layout import validate_checkpoint_name
from cairn.format.signing import SigningKey
from cairn.integrations._interface import SaveMeter, TwoPhaseSave, begin, bounded_gather
from cairn.sync import SyncCheckpointer
from cairn.torch._format import (
    ItemRecord,
    dtype_name,
    load_metadata,
    tensor_bytes,
    tensor_from_bytes,
)
from cairn.torch._itemtable import with_plain_chunks
from cairn.torch._rankobject import ItemRanges
from cairn.torch._reader import Opened, load_records, open_dcp, verified_pieces
from cairn.torch._runtime import StoreArg, known_paths, make_checkpointer, run
from cairn.torch._target import Target, interpret
from cairn.torch._writer import commit_dcp, rank_operator

__all__ = [
    "METADATA_FILE",
    "DcpItem",
    "ExportedDcp",
    "ImportedDcp",
    "export_dcp",
    "export_dcp_async",
    "import_dcp",
    "import_dcp_async",
    "read_dcp_dir",
]

METADATA_FILE = ".metadata"
_RANK_FILE = re.compile(r"__(0|[1-9][0-9]*)_(0|[1-9][0-9]*)\.distcp")
_RANK_OPERATOR = re.compile(r"rank-(0|[1-9][0-9]*)")
_EXTRA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}
"""What ``FileSystemWriter``'s metadata holds besides DCP's metadata types: its storage
records, and the path it was saved to (``StorageMeta.checkpoint_id``)."""

Progress = Callable[[int], None]
"""Told the number of bytes each step moved (for a progress bar)."""


def _ignore(_: int) -> None:
    return None


# -- reading a DCP directory, checked ----------------------------------------------------


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


@dataclasses.dataclass(frozen=True)
class _DcpDir:
    """A DCP directory whose metadata matches its files: the metadata, the items of each
    file in offset order, and each file's size."""

    root: Path
    metadata: Metadata
    files: dict[str, list[DcpItem]]
    sizes: dict[str, int]


def read_dcp_dir(root: Path) -> _DcpDir:
    """The metadata and items of the DCP directory ``root``, its structure checked (see
    the module docstring); no item's bytes are read. Raises
    :class:`~cairn.MissingArtifactError` for a missing file,
    :class:`~cairn.IntegrityMismatchError` for a file of the wrong size,
    :class:`~cairn.CorruptManifestError` for metadata that does not match itself or its
    files, and :class:`~cairn.InvalidInputError` for what import does not read."""
    meta_path = root / METADATA_FILE
    if not meta_path.is_file():
        local = sorted(p.name for p in root.glob("__*.metadata")) if root.is_dir() else []
        if local:
            raise InvalidInputError(
                f"{root} holds rank-local metadata ({local[0]}: saved with "
                "use_collectives=False), not one .metadata: import reads only the latter"
            )
        raise MissingArtifactError(str(meta_path), f"DCP directory {root}")
    where = str(meta_path)
    metadata = load_metadata(where, meta_path.read_bytes(), extra_globals=_EXTRA_GLOBALS)
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
    sizes = {name: _check_file(root, name, items) for name, items in sorted(files.items())}
    return _DcpDir(root, metadata, files, sizes)


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


def _check_file(root: Path, name: str, items: list[DcpItem]) -> int:
    """Check that ``items`` tile file ``name`` exactly; its size. Sorts ``items``."""
    path = root / name
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise MissingArtifactError(str(path), f"DCP directory {root}") from None
    if not path.is_file() or path.is_symlink():
        raise InvalidInputError(f"{path} is not a plain file: import reads plain files only")
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
    if position != info.st_size:
        if position > info.st_size:
            last = next(i for i in items if i.offset + i.length > info.st_size)
            what = (
                f"size of {name}: item {last.index.fqn!r} ends at byte "
                f"{last.offset + last.length}, past the end (the file is short)"
            )
        else:
            what = f"size of {name}: it holds bytes after its last item"
        raise IntegrityMismatchError(str(path), str(position), str(info.st_size), what=what)
    return info.st_size


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_ZIP_MAGIC = b"PK\x03\x04"


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
        if fields[0] != _ZIP_MAGIC or len(data) != member.compress_size or actual != member.CRC:
            raise IntegrityMismatchError(
                path,
                f"{member.CRC:08x}",
                f"{actual:08x}",
                what=f"CRC-32 of {member.filename} in {what}",
            )


def _load_item(root: Path, item: DcpItem) -> tuple[Any, int]:
    """Item ``item``'s value, checked (a tensor, or a byte item's BytesIO), and its size."""
    path = root / item.file
    with open(path, "rb") as stream:
        stream.seek(item.offset)
        blob = stream.read(item.length)
    if len(blob) != item.length:  # the file changed since it was checked
        raise IntegrityMismatchError(
            str(path), str(item.length), str(len(blob)), what=f"size of {item.index.fqn!r}"
        )
    if not item.dtype:
        # DCP's default planner stores every byte item as torch.save of the value: an
        # archive with CRC-32s. Bytes that do not start like one came from a planner
        # that stores them raw, and have no checksum to check.
        if blob.startswith(_ZIP_MAGIC):
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
            str(root / METADATA_FILE),
            f"item {item.index.fqn!r} of {item.file} holds a {found[0]} tensor of shape "
            f"{list(found[1])}; the metadata says {item.dtype} {list(item.shape)}",
        )
    return tensor, len(blob)


# -- import ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ImportedDcp:
    """What :func:`import_dcp` committed: the checkpoint, and what it read.

    ``tensor_items`` and ``byte_items`` count the items of each kind; all were checked
    for structure and size, and all but ``unchecked_items`` (byte items stored raw,
    which carry no checksum) against the CRC-32s ``torch.save`` recorded.
    ``size_bytes`` is what was read from the directory, ``uploaded_bytes`` what the
    checkpoint holds (tensors as raw bytes).
    """

    checkpoint_id: CheckpointId
    name: str | None
    epoch: int
    source: Path
    files: int
    tensor_items: int
    byte_items: int
    unchecked_items: int
    size_bytes: int
    uploaded_bytes: int


def _absolute(path: Path) -> Path:
    if not path.is_absolute():
        raise InvalidInputError(f"give an absolute path, not {str(path)!r}")
    return path


def _default_name(source: Path) -> str:
    try:
        return validate_checkpoint_name(source.name)
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"the directory's name is not a usable checkpoint name ({exc}): give one"
        ) from None


async def import_dcp_async(
    ckpt: ObjectStoreCheckpointer,
    source: Path,
    *,
    epoch: int = 0,
    name: str | None = None,
    progress: Progress = _ignore,
) -> ImportedDcp:
    """:func:`import_dcp` on ``ckpt`` (async)."""
    if type(epoch) is not int or epoch < 0:
        raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
    root = _absolute(source)
    chosen = _default_name(root) if name is None else validate_checkpoint_name(name)
    scanned = await asyncio.to_thread(read_dcp_dir, root)
    meter = SaveMeter()
    with meter.counting():
        async with await begin(ckpt, CheckpointId.now()) as save:
            return await _import_into(save, ckpt, root, scanned, epoch, chosen, progress, meter)


async def _import_into(
    save: TwoPhaseSave,
    ckpt: ObjectStoreCheckpointer,
    root: Path,
    scanned: _DcpDir,
    epoch: int,
    chosen: str,
    progress: Progress,
    meter: SaveMeter,
) -> ImportedDcp:
    """Upload every item of ``scanned`` into ``save`` and commit it, its statistics
    measured by ``meter``."""
    cid = save.checkpoint_id
    results: list[WriteResult] = []
    next_partition: dict[str, int] = {}
    counts = {"tensor": 0, "bytes": 0, "raw": 0, "read": 0}
    counted: set[Any] = set()

    def load(item: DcpItem) -> Any:
        value, size = _load_item(root, item)
        if item.index not in counted:  # a retried upload reads it again
            counted.add(item.index)
            counts["tensor" if item.dtype else "bytes"] += 1
            if not item.dtype and not value.getvalue().startswith(_ZIP_MAGIC):
                counts["raw"] += 1
            counts["read"] += size
            progress(size)
        return value

    by_index = {item.index: item for items in scanned.files.values() for item in items}

    def resolve(write: WriteItem) -> Any:
        return load(by_index[write.index])

    codec = ckpt.codec
    meter.uploading = time.perf_counter()
    for file, items in scanned.files.items():
        match = _RANK_FILE.fullmatch(file)
        operator = rank_operator(int(match.group(1)) if match else 0)
        partition = next_partition.get(operator, 0)
        writes = [
            WriteItem(
                index=item.index,
                type=WriteItemType.TENSOR if item.dtype else WriteItemType.BYTE_IO,
            )
            for item in items
        ]
        # The file becomes one object of ranges, as a rank's save does.
        source = ItemRanges(
            writes, resolve, off_loop=True, size_of=lambda w: by_index[w.index].length, codec=codec
        )
        [entry] = await save.upload([(operator, partition, False, source)])
        results += source.results(operator, entry)
        next_partition[operator] = partition + 1
    metadata = copy.copy(scanned.metadata)
    save_id = str(uuid.uuid4())
    committed = await commit_dcp(
        ckpt, save, epoch, metadata, [results], save_id, chosen, None, meter
    )
    uploaded = sum(e.size_bytes for _, e in committed.partition_entries())
    return ImportedDcp(
        cid,
        chosen,
        epoch,
        root,
        len(scanned.files),
        counts["tensor"],
        counts["bytes"],
        counts["raw"],
        counts["read"],
        uploaded,
    )


# -- export ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExportedDcp:
    """What :func:`export_dcp` wrote: the checkpoint, the directory, and each file with
    its size (``.metadata`` last)."""

    checkpoint_id: CheckpointId
    name: str | None
    epoch: int
    target: Path
    items: int
    files: tuple[tuple[str, int], ...]

    @property
    def size_bytes(self) -> int:
        """The bytes of all the files written."""
        return sum(size for _, size in self.files)


def _file_of(opened: Opened, artifact: str, operators: dict[str, str]) -> str:
    operator = operators.get(artifact, "")
    match = _RANK_OPERATOR.fullmatch(operator)
    entry = opened.entries[artifact]
    if match is None:
        raise CorruptManifestError(
            str(opened.checkpoint_id),
            f"DCP items are stored in {artifact!r} of operator {operator!r}, not a rank's",
        )
    return f"__{match.group(1)}_{entry.partition_id}.distcp"


def _write_file(
    path: Path,
    items: Sequence[tuple[MetadataIndex, ItemRecord]],
    pieces: Sequence[memoryview],
    file: str,
) -> dict[MetadataIndex, _StorageInfo]:
    """Write verified items into ``path`` as FileSystemWriter does; their storage info."""
    infos: dict[MetadataIndex, _StorageInfo] = {}
    with open(path, "xb") as stream:
        for (index, record), piece in zip(items, pieces, strict=True):
            offset = stream.tell()
            if record.dtype:
                torch.save(tensor_from_bytes(piece, record.dtype, record.shape), stream)
            else:
                stream.write(piece)
            infos[index] = _StorageInfo(file, offset, stream.tell() - offset)
        stream.flush()
        os.fsync(stream.fileno())
    return infos


def _reverify(staging: Path, opened: Opened, renamed: dict[MetadataIndex, ItemRecord]) -> int:
    """Read the staged directory back as an import would, and check each item's bytes
    against cairn's record; the number of items."""
    scanned = read_dcp_dir(staging)
    count = 0
    for items in scanned.files.values():
        for item in items:
            value, _ = _load_item(staging, item)
            if isinstance(value, torch.Tensor):
                data: Any = tensor_bytes(value, item.index.fqn)[0]
            else:
                data = value.getbuffer()
            record = renamed[item.index]
            actual = sha256_hex(data)
            if actual != record.sha256:
                raise IntegrityMismatchError(
                    str(staging / item.file),
                    record.sha256,
                    actual,
                    what=f"sha256 of item {item.index.fqn!r} as written",
                )
            count += 1
    if count != len(renamed):
        raise CorruptManifestError(str(staging), f"{count} items written of {len(renamed)}")
    return count


def _check_dest(target: Path) -> None:
    if target.is_symlink():
        raise InvalidInputError(f"cannot export into {target}: it is a symbolic link")
    if target.exists():
        if not target.is_dir():
            raise InvalidInputError(f"cannot export into {target}: it is a file")
        if any(target.iterdir()):
            raise InvalidInputError(
                f"cannot export into {target}: it is not empty (a DCP directory is written "
                "whole, never mixed with other files): give a new or empty directory"
            )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_metadata(path: Path, metadata: Metadata) -> None:
    with open(path, "xb") as stream:
        pickle.dump(metadata, stream)
        stream.flush()
        os.fsync(stream.fileno())


def _sizes(staging: Path) -> tuple[tuple[str, int], ...]:
    """Each file of ``staging`` with its size, ``.metadata`` last."""
    names = sorted(p.name for p in staging.iterdir() if p.name != METADATA_FILE)
    return tuple((name, (staging / name).stat().st_size) for name in [*names, METADATA_FILE])


def _move_into_place(staging: Path, target: Path) -> None:
    _fsync_dir(staging)
    _check_dest(target)  # again, just before the rename
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, target)  # onto a missing name, or an empty directory: atomic
    _fsync_dir(target.parent)


async def export_dcp_async(
    ckpt: ObjectStoreCheckpointer,
    target: Target | None,
    dest: Path,
    *,
    skip: frozenset[CheckpointId] = frozenset(),
    store: object = None,
    progress: Progress = _ignore,
) -> ExportedDcp:
    """:func:`export_dcp` on ``ckpt`` (async); ``target`` as :func:`open_dcp` takes it."""
    final = _absolute(dest)
    await asyncio.to_thread(_check_dest, final)
    opened = await open_dcp(ckpt, target, skip, store)
    await load_records(ckpt, opened, None)
    operators = {entry.path: op for op, entry in opened.manifest.partition_entries()}
    per_artifact: dict[str, list[tuple[MetadataIndex, ItemRecord]]] = {}
    for index, record in opened.records.items():
        per_artifact.setdefault(record.artifact, []).append((index, record))
    files = {artifact: _file_of(opened, artifact, operators) for artifact in per_artifact}
    parent = final.parent
    await asyncio.to_thread(parent.mkdir, parents=True, exist_ok=True)
    staging = parent / f".{final.name}.cairn-export-{secrets.token_hex(6)}"
    await asyncio.to_thread(staging.mkdir)
    storage: dict[MetadataIndex, _StorageInfo] = {}

    def job(artifact: str) -> Callable[[], Any]:
        async def run_one() -> None:
            items = sorted(per_artifact[artifact], key=lambda pair: pair[1].offset)
            pieces = await verified_pieces(ckpt, opened, artifact, [i for i, _ in items])
            name = files[artifact]
            written = await asyncio.to_thread(_write_file, staging / name, items, pieces, name)
            storage.update(written)
            progress(sum(p.nbytes for p in pieces))

        return run_one

    try:
        await bounded_gather(ckpt.max_concurrent_downloads, [job(a) for a in per_artifact])
        metadata = with_plain_chunks(opened.metadata)
        metadata.storage_data = storage
        metadata.version = CURRENT_DCP_VERSION
        save_id = opened.metadata.storage_meta.save_id if opened.metadata.storage_meta else None
        metadata.storage_meta = StorageMeta(checkpoint_id=str(final), save_id=save_id or "")
        await asyncio.to_thread(_write_metadata, staging / METADATA_FILE, metadata)
        count = await asyncio.to_thread(_reverify, staging, opened, dict(opened.records))
        sizes = await asyncio.to_thread(_sizes, staging)
        await asyncio.to_thread(_move_into_place, staging, final)
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, ignore_errors=True)
    manifest = opened.manifest
    return ExportedDcp(opened.checkpoint_id, manifest.name, manifest.epoch, final, count, sizes)


# -- the blocking functions ----------------------------------------------------------------


Source = StoreArg | ObjectStoreCheckpointer | SyncCheckpointer
"""A store (as :class:`~cairn.torch.CairnReader` takes it) or a checkpointer over one."""


def _checkpointer(
    source: Source,
    prefix: str | None,
    signing_key: SigningKey | Sequence[SigningKey] | None,
    concurrency: int,
) -> tuple[ObjectStoreCheckpointer, object]:
    if isinstance(source, SyncCheckpointer):
        source = source.async_checkpointer
    if isinstance(source, ObjectStoreCheckpointer):
        if prefix is not None or signing_key is not None:
            raise InvalidInputError(
                "prefix and signing_key come with the checkpointer: give them to it instead"
            )
        return source, source.store
    ckpt = make_checkpointer(
        source,
        prefix,
        max_concurrent_uploads=concurrency,
        max_concurrent_downloads=concurrency,
        signing_key=signing_key,
    )
    return ckpt, source


def export_dcp(
    source: Source,
    checkpoint_id: CheckpointId | str | os.PathLike[str] | None,
    dest: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    max_concurrent_downloads: int = 8,
) -> ExportedDcp:
    """Write a DCP checkpoint of ``source`` as a DCP directory ``dest`` (see the module
    docstring): ``FileSystemReader`` and ``dcp_to_torch_save`` read it bit-exactly.

    ``checkpoint_id`` is read as ``dcp.load`` reads it through a
    :class:`~cairn.torch.CairnReader` (an id, or a name: the newest committed checkpoint
    with it); None exports the latest DCP checkpoint. ``source`` is a store (with
    ``prefix``, default: the store's root, or ``checkpoints/`` where only that holds
    checkpoints, and ``signing_key``) or a checkpointer. Every
    byte is verified on the way out; ``dest`` must be missing or an empty directory and
    appears whole or not at all. Raises :class:`~cairn.CheckpointNotFoundError`,
    :class:`~cairn.IntegrityError` (a damaged item: nothing is written),
    :class:`~cairn.InvalidInputError` (an unusable ``dest``).
    """
    ckpt, store = _checkpointer(source, prefix, signing_key, max_concurrent_downloads)
    target = (
        None
        if checkpoint_id is None
        else interpret(
            checkpoint_id, store, known_paths(ckpt, "export_dcp"), "export_dcp's checkpoint_id"
        )
    )
    where = Path(os.path.abspath(dest))
    return run(export_dcp_async(ckpt, target, where, store=store), "export_dcp")


def import_dcp(
    dest: Source,
    source: str | os.PathLike[str],
    *,
    epoch: int = 0,
    name: str | None = None,
    prefix: str | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    max_concurrent_uploads: int = 8,
) -> ImportedDcp:
    """Commit the DCP directory ``source`` (written by ``FileSystemWriter``) as one cairn
    checkpoint of ``dest``, which :class:`~cairn.torch.CairnReader` loads bit-exactly.

    The checkpoint gets a new id, ``epoch``, and ``name`` (default: the directory's
    name, such as ``step-100``, so that ``CairnReader(checkpoint_id="step-100")`` loads
    it). ``dest`` is a store (with ``prefix``, default: the store's root, or
    ``checkpoints/`` where only that holds checkpoints, and
    ``signing_key``) or a checkpointer. What is checked on the way in, and what cannot
    be, is in the module docstring; a directory that fails a check commits nothing and
    raises :class:`~cairn.IntegrityError` (a missing, short or damaged file) or
    :class:`~cairn.InvalidInputError` (what import does not read).
    """
    ckpt, _ = _checkpointer(dest, prefix, signing_key, max_concurrent_uploads)
    where = Path(os.path.abspath(source))
    return run(import_dcp_async(ckpt, where, epoch=epoch, name=name), "import_dcp")
