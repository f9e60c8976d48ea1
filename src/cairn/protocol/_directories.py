"""Directory partitions: a local directory saved file by file, and restored whole.

Invariants:

* a saved directory holds regular files and directories only: a symbolic link anywhere
  inside (never followed, also one swapped in while the save reads) or any other special
  file raises :class:`SpecialFileError` naming it, before the commit; empty
  subdirectories are not kept;
* every file is uploaded under a name carrying the save attempt's token
  (:meth:`CheckpointPaths.relative_file`), at most ``max_concurrent_uploads`` at a time,
  streamed in chunks when larger than one; its entry records the SHA-256 and size of
  the bytes that were sent, and the modification time seen when the directory was
  scanned (so a file changed while the save ran is re-read by the next one);
* with a parent, a file whose relative path, size and mtime (ns) equal the entry of the
  same partition in the parent is carried by reference without being read (``"mtime"``:
  what is trusted is that a file changed in place keeps neither its size nor its
  mtime; one that does is carried stale); with ``directory_check="hash"`` every file is
  read and carried only when its size and SHA-256 are equal;
* in a one-call save, a directory partition the save does not mention is carried whole
  from the parent, unless the save gives that partition as an artifact; a save in two
  phases (:func:`upload_directories`) gets entries only for the partitions it names, and
  its caller assembles the manifest;
* a restore writes into a fresh staging directory beside ``dest``
  (:class:`cairn.stores._localfs.StagedTree`: nothing written through a link), verifies
  every file against its size and SHA-256, fsyncs every file and directory, and only
  then renames the staging directory onto ``dest`` (which must be missing or an empty
  directory, never a link): any failure removes the staging directory and leaves
  ``dest`` as it was. Each file
  gets the mtime its entry records, so a save from the restored tree with the restored
  checkpoint as parent carries every file it did not change.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from cairn.data import ArtifactKey, CheckpointData, DirectoryCheck
from cairn.data.inputs import READ_CHUNK, StreamSource
from cairn.errors import (
    BrokenChainError,
    CheckpointerError,
    CheckpointNotFoundError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidCheckpointDataError,
    InvalidInputError,
    SpecialFileError,
)
from cairn.format.ids import CheckpointId
from cairn.format.layout import validate_name, validate_partition
from cairn.format.manifest import CheckpointManifest, DirectoryEntry, FileEntry, check_relative_file
from cairn.protocol import _catalog
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context
from cairn.protocol._download import RESTORE_CHUNK, stream_into
from cairn.stores._localfs import (
    LinkRefused,
    StagedTree,
    open_dir,
    open_dirs,
    open_file_at,
    open_root,
    run_to_end,
)

__all__ = [
    "ScannedFile",
    "check_directories",
    "discard_files",
    "find_directory",
    "restore_directory",
    "save_directories",
    "scan",
    "upload_directories",
]


@dataclass(frozen=True, slots=True)
class ScannedFile:
    """A regular file found under a directory partition's root."""

    relative_path: str
    size: int
    mtime_ns: int


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device or other special file"


def scan(root: Path) -> list[ScannedFile]:
    """Every regular file under ``root``, sorted by relative path (blocking).

    ``root`` itself may be a link (the caller chose it); nothing below it is followed.
    """
    try:
        fd = open_root(root)
    except OSError as exc:
        raise InvalidCheckpointDataError(f"directory {str(root)!r} cannot be read: {exc}") from None
    found: list[ScannedFile] = []
    try:
        _walk(root, fd, "", found)
    finally:
        os.close(fd)
    return sorted(found, key=lambda f: f.relative_path)


def _walk(root: Path, fd: int, prefix: str, found: list[ScannedFile]) -> None:
    with os.scandir(fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        relative = prefix + name
        try:
            check_relative_file(relative)
        except InvalidInputError:
            raise InvalidCheckpointDataError(
                f"{str(root / relative)!r}: a file name cairn cannot store"
            ) from None
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(mode.st_mode):
            sub = open_dir(fd, name)
            if sub is None:  # swapped for a link since the stat
                raise SpecialFileError(str(root / relative), "symbolic link")
            try:
                _walk(root, sub, relative + "/", found)
            finally:
                os.close(sub)
        elif stat.S_ISREG(mode.st_mode):
            found.append(ScannedFile(relative, mode.st_size, mode.st_mtime_ns))
        else:
            raise SpecialFileError(str(root / relative), _kind(mode.st_mode))


def _open_file(root: Path, relative: str) -> BinaryIO:
    """``relative`` below ``root`` opened for reading, no link followed on the way."""
    *parents, name = relative.split("/")
    where = str(root / relative)
    with open_dirs(root, parents) as dirs:
        if not dirs.complete:
            raise SpecialFileError(where, "path through a symbolic link or a missing directory")
        try:
            fd = open_file_at(dirs.fds[-1], name, len(parents) + 1)
        except LinkRefused:
            raise SpecialFileError(where, "symbolic link") from None
        except OSError as exc:
            raise InvalidCheckpointDataError(f"{where!r} cannot be read: {exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SpecialFileError(where, _kind(mode))
    return os.fdopen(fd, "rb")


def _hash_file(root: Path, relative: str) -> tuple[str, int]:
    """The SHA-256 and size of one file (blocking)."""
    hasher, size = hashlib.sha256(), 0
    with _open_file(root, relative) as handle:
        while chunk := handle.read(READ_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


def _read_small(root: Path, relative: str) -> bytes:
    with _open_file(root, relative) as handle:
        return handle.read(READ_CHUNK + 1)


async def _upload_file(ctx: Context, path: str, root: Path, scanned: ScannedFile) -> FileEntry:
    """Send one file to store ``path``; its entry as this checkpoint's own (path relative)."""
    if scanned.size < READ_CHUNK:
        data = await asyncio.to_thread(_read_small, root, scanned.relative_path)
        if len(data) <= READ_CHUNK:  # else it grew since the scan: stream it
            await ctx.store.put(path, data)
            digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
            return _entry(scanned, digest, len(data), path)
    handle = await asyncio.to_thread(_open_file, root, scanned.relative_path)
    with handle:
        source = StreamSource(handle, what=f"file {str(root / scanned.relative_path)!r}")
        await ctx.store.put_stream(path, source.open)
    return _entry(scanned, source.sha256, source.size, path)


def _entry(scanned: ScannedFile, digest: str, size: int, path: str) -> FileEntry:
    return FileEntry(scanned.relative_path, size, digest, scanned.mtime_ns, path)


def _owned(entry: FileEntry, owner: CheckpointId) -> FileEntry:
    return entry if entry.owner is not None else msgspec.structs.replace(entry, owner=owner)


def check_directories(directories: object, check: object) -> dict[ArtifactKey, Path]:
    """``directories`` (``(operator, partition)`` to a local path) and ``check`` (a
    :data:`~cairn.data.DirectoryCheck`) checked before any I/O; the mapping, paths as
    :class:`Path`. Raises :class:`InvalidInputError` naming the offending value."""
    if not isinstance(directories, Mapping):
        raise InvalidInputError(
            f"directories must map (operator, partition) to a path, got {directories!r}"
        )
    checked: dict[ArtifactKey, Path] = {}
    for key, path in directories.items():
        if not isinstance(key, tuple) or len(key) != 2:
            raise InvalidInputError(f"a directory's key is (operator, partition), got {key!r}")
        operator, partition = key
        validate_name("operator", operator)
        validate_partition(partition)
        if not isinstance(path, str | os.PathLike):
            raise InvalidInputError(
                f"directories[{key!r}] must be a path, got {type(path).__name__}"
            )
        checked[(operator, partition)] = Path(path)
    if check not in ("mtime", "hash"):
        raise InvalidInputError(f"directory check must be 'mtime' or 'hash', got {check!r}")
    return checked


async def save_directories(
    ctx: Context, data: CheckpointData, attempt: str, parent: CheckpointManifest | None = None
) -> tuple[DirectoryEntry, ...]:
    """Upload (or carry) every file of ``data.directories`` as ``attempt``; the entries,
    with the parent's directory partitions ``data`` does not mention carried whole.
    ``parent`` is the parent's manifest if the caller read it (else it is read here).

    Paths in the entries are relative to the owner's directory (``owner`` None: this
    checkpoint's upload). On failure, the objects this call may have written are
    deleted (best effort) before the error is raised.
    """
    carried: list[DirectoryEntry] = []
    if data.parent_id is None:
        parent = None
    else:
        if parent is None or parent.checkpoint_id != data.parent_id:
            parent = await _catalog.load_manifest(ctx, data.parent_id)
        for directory in parent.directories:
            key = (directory.operator, directory.partition_id)
            if key not in data.directories and key not in data.snapshots:
                if key in data.deltas:
                    raise InvalidCheckpointDataError(
                        f"delta {key!r} cannot extend a directory partition"
                    )
                files = tuple(_owned(f, parent.checkpoint_id) for f in directory.files)
                carried.append(msgspec.structs.replace(directory, files=files))
    saved = await upload_directories(
        ctx, data.id, data.directories, parent, data.directory_check, attempt
    )
    return tuple(sorted([*carried, *saved], key=lambda d: (d.operator, d.partition_id)))


async def upload_directories(
    ctx: Context,
    cid: CheckpointId,
    directories: Mapping[ArtifactKey, str | os.PathLike[str]],
    parent: CheckpointManifest | None,
    check: DirectoryCheck,
    attempt: str,
) -> tuple[DirectoryEntry, ...]:
    """Upload the files of ``directories`` as ``attempt`` of checkpoint ``cid``, carrying
    those that ``parent``'s partition of the same key already holds (decided by
    ``check``); their entries, by key. Nothing of ``parent`` that ``directories`` does
    not name is returned.

    Paths in the entries are relative to the owner's directory (``owner`` None: this
    checkpoint's upload). On failure, the objects this call may have written are
    deleted (best effort) before the error is raised.
    """
    before: dict[ArtifactKey, dict[str, FileEntry]] = {}
    if parent is not None:
        for directory in parent.directories:
            before[(directory.operator, directory.partition_id)] = {
                f.relative_path: _owned(f, parent.checkpoint_id) for f in directory.files
            }
    planned: list[str] = []
    jobs: list[Callable[[], Awaitable[FileEntry]]] = []
    layout: list[tuple[str, int, int]] = []
    for (operator, partition), given in sorted(directories.items()):
        root = Path(given)
        found = await asyncio.to_thread(scan, root)
        prior = before.get((operator, partition), {})
        for index, scanned in enumerate(found):
            relative = ctx.paths.relative_file(operator, partition, attempt, index)
            planned.append(ctx.paths.resolve(cid, relative))
            jobs.append(_file_job(ctx, cid, relative, root, scanned, prior, check))
        layout.append((operator, partition, len(found)))
    try:
        entries = await bounded_gather(ctx.max_concurrent_uploads, jobs)
    except BaseException:
        with contextlib.suppress(CheckpointerError, asyncio.CancelledError):
            await ctx.store.delete(planned)
        raise
    saved: list[DirectoryEntry] = []
    offset = 0
    for operator, partition, count in layout:
        files = tuple(entries[offset : offset + count])
        saved.append(DirectoryEntry(operator, partition, files))
        offset += count
    return tuple(saved)


async def discard_files(
    ctx: Context, checkpoint_id: CheckpointId, directories: tuple[DirectoryEntry, ...]
) -> None:
    """Best effort: delete the files ``directories`` names as ``checkpoint_id``'s own
    upload (a save that will not commit them); carried files are left alone."""
    own = [
        ctx.paths.resolve(checkpoint_id, file.path)
        for directory in directories
        for file in directory.files
        if file.owner is None
    ]
    if own:
        with contextlib.suppress(CheckpointerError, asyncio.CancelledError):
            await ctx.store.delete(own)


def _file_job(
    ctx: Context,
    cid: CheckpointId,
    relative: str,
    root: Path,
    scanned: ScannedFile,
    before: dict[str, FileEntry],
    check: str,
) -> Callable[[], Awaitable[FileEntry]]:
    prior = before.get(scanned.relative_path)

    async def job() -> FileEntry:
        if prior is not None and prior.size_bytes == scanned.size:
            if check == "mtime" and prior.mtime_ns == scanned.mtime_ns:
                return prior
            if check == "hash":
                digest, size = await asyncio.to_thread(_hash_file, root, scanned.relative_path)
                if digest == prior.sha256 and size == prior.size_bytes:
                    return msgspec.structs.replace(prior, mtime_ns=scanned.mtime_ns)
        return await _upload_file(ctx, ctx.paths.resolve(cid, relative), root, scanned)

    async def relative_job() -> FileEntry:
        entry = await job()
        if entry.owner is None:  # uploaded: record the path relative to this checkpoint
            entry = msgspec.structs.replace(entry, path=relative)
        return entry

    return relative_job


def find_directory(manifest: CheckpointManifest, operator: str, partition: int) -> DirectoryEntry:
    """The directory partition ``(operator, partition)`` of ``manifest``, or
    :class:`CheckpointNotFoundError`."""
    for directory in manifest.directories:
        if (directory.operator, directory.partition_id) == (operator, partition):
            return directory
    raise CheckpointNotFoundError(
        str(manifest.checkpoint_id), f"directory partition {(operator, partition)!r} in checkpoint"
    )


async def restore_directory(
    ctx: Context,
    checkpoint_id: CheckpointId,
    operator: str,
    partition: int,
    dest: os.PathLike[str] | str,
) -> list[FileEntry]:
    """Write directory partition ``(operator, partition)`` of ``checkpoint_id`` into
    ``dest``, every file verified; the entries of the files written (see the module
    docstring for how ``dest`` is replaced)."""
    validate_name("operator", operator)
    validate_partition(partition)
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    directory = find_directory(manifest, operator, partition)
    tree = await asyncio.to_thread(StagedTree, Path(dest), "restore a directory")
    try:
        jobs = [_restore_job(ctx, checkpoint_id, directory, f, tree) for f in directory.files]
        await bounded_gather(ctx.max_concurrent_downloads, jobs)
        await run_to_end(tree.publish)
    finally:
        await run_to_end(tree.close)
    return list(directory.files)


def _restore_job(
    ctx: Context,
    checkpoint_id: CheckpointId,
    directory: DirectoryEntry,
    file: FileEntry,
    tree: StagedTree,
) -> Callable[[], Awaitable[None]]:
    owner = file.owner or checkpoint_id
    path = ctx.paths.resolve(owner, file.path)
    named = f"{path} (file {file.relative_path!r})"

    async def job() -> None:
        try:
            await restore()
        except IntegrityError as exc:
            exc.located(directory.operator, directory.partition_id, file=file.relative_path)
            raise

    async def restore() -> None:
        try:
            size = (await ctx.store.head(path)).size
        except CheckpointNotFoundError:
            raise BrokenChainError(named, f"file of checkpoint {owner} is gone") from None
        if size != file.size_bytes:
            raise IntegrityMismatchError(named, str(file.size_bytes), str(size), what="size")
        handle = await run_to_end(_create_file, tree, file.relative_path)
        with handle:
            digest = await stream_into(ctx, path, size, handle, RESTORE_CHUNK)
            await run_to_end(_finish_file, handle, file.mtime_ns)
        if digest != file.sha256:
            raise IntegrityMismatchError(named, file.sha256, digest)

    return job


def _create_file(tree: StagedTree, relative: str) -> BinaryIO:
    """A new file of the staged tree at ``relative`` (checked), its directories made."""
    try:
        return tree.create(check_relative_file(relative))
    except (FileExistsError, NotADirectoryError, LinkRefused):
        raise InvalidInputError(
            f"cannot restore {relative!r}: its name, or a directory on its way, is taken"
        ) from None


def _finish_file(handle: BinaryIO, mtime_ns: int) -> None:
    """Flush, give the file its recorded mtime (so the next incremental save carries it
    without reading it), and fsync it."""
    handle.flush()
    os.utime(handle.fileno(), ns=(mtime_ns, mtime_ns))
    os.fsync(handle.fileno())
