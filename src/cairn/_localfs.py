"""The files under a local store's root, reached without ever following a symbolic link.

Invariant (see :mod:`cairn.stores`): listing and deleting walk directory descriptors
opened with ``O_NOFOLLOW``; a link is not an object, is never descended into, and is
deleted as a link at most; obstore's staging files (``name#N``) are hidden.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import itertools
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from cairn import _shutdown
from cairn._storetypes import ListDirResult, ObjectInfo
from cairn._translate import translate_error
from cairn.errors import (
    StoreError,
)

__all__ = [
    "_DIR_FLAGS",
    "_EPOCH",
    "_LINK_ERRNOS",
    "_RangePastEnd",
    "_fsync_directory",
    "_is_staging",
    "_local_delete",
    "_local_dirs",
    "_local_holds",
    "_local_info",
    "_local_io",
    "_local_list",
    "_local_list_dir",
    "_local_open_parent",
    "_local_parent_missing",
    "_local_parts",
    "_local_persist",
    "_local_read",
    "_local_read_range",
    "_local_remove_tree",
    "_open_nofollow_dir",
    "_scan_tree",
    "_utf8",
]

T = TypeVar("T")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# What open(O_NOFOLLOW) reports for a link: ELOOP on Linux and macOS, EMLINK on FreeBSD;
# with O_DIRECTORY too, Linux reports ENOTDIR (as for any other non-directory).
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _local_parts(operation: str, path: str) -> list[str]:
    """The components of an object path, as obstore parses them; StoreError if invalid."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    for part in parts:
        if part in ("", ".", "..") or "\x00" in part:
            raise StoreError(operation, path, f"not a valid object path (segment {part!r})")
    return parts


def _is_staging(name: str) -> bool:
    # obstore's local store writes ``{name}#{n}`` and renames it into place; it never
    # lists such a name nor lets one be addressed (the suffix after the first ``#``).
    _, hash_sign, suffix = name.partition("#")
    return bool(hash_sign) and suffix.isascii() and suffix.isdigit()


def _local_info(path: str, st: os.stat_result) -> ObjectInfo:
    # The same metadata obstore's local store reports (its e-tag is inode, mtime in
    # microseconds and size, in hex), so a listing and a HEAD agree.
    micros = st.st_mtime_ns // 1000
    return ObjectInfo(
        path=path,
        size=st.st_size,
        e_tag=f'"{st.st_ino:x}-{max(micros, 0):x}-{st.st_size:x}"',
        last_modified=_EPOCH + dt.timedelta(microseconds=micros),
    )


def _open_nofollow_dir(name: str, dir_fd: int) -> int | None:
    """A descriptor of directory ``name`` in ``dir_fd``; None if missing, not a dir, a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            return None
        raise


@contextlib.contextmanager
def _local_dirs(root: Path, parts: Sequence[str]) -> Iterator[list[int]]:
    """Descriptors of ``root`` and of each directory ``parts`` names below it, in order.

    The walk stops at the first part that is missing, not a directory, or a symbolic
    link: the list is complete (``len(parts) + 1``) only if every part is a real
    directory. Empty if the root itself is missing. All are closed on exit.
    """
    fds: list[int] = []
    try:
        with contextlib.suppress(FileNotFoundError):
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in parts:
                fd = _open_nofollow_dir(part, fds[-1])
                if fd is None:
                    break
                fds.append(fd)
        yield fds
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _local_persist(root: Path, path: str) -> None:
    """Make the file just written at object ``path`` durable, as a PUT to S3 is.

    obstore's local store writes a staging file and renames it into place without any
    fsync, so a power cut could lose a "committed" checkpoint's bytes or names. This
    fsyncs the file's bytes, then each directory from its parent up to ``root``: the
    rename, and any directory the put created, live in those. Opened as every local read
    is (:func:`_open_object`); a file deleted meanwhile, or a link swapped in for it or
    for a directory on its way, is nothing of ours to keep.
    """
    try:
        with _open_object(root, "put", path) as (fd, _, dir_fds):
            os.fsync(fd)
            for dir_fd in reversed(dir_fds):
                os.fsync(dir_fd)
    except FileNotFoundError:
        return


class _RangePastEnd(Exception):
    """A ranged read that starts at or past the end of the file (obstore: invalid range)."""

    def __init__(self, start: int, size: int) -> None:
        super().__init__(f"the range starts at {start}, the object has {size} bytes")


@contextlib.contextmanager
def _open_object(
    root: Path, operation: str, path: str
) -> Iterator[tuple[int, os.stat_result, list[int]]]:
    """The descriptor and status of the regular file at object ``path``, and descriptors
    of ``root`` and of each directory on its way (in order); all closed on exit.

    Walked from ``root`` with ``O_NOFOLLOW`` descriptors and opened with ``O_NOFOLLOW``
    (no window between a check and the open). FileNotFoundError when the file, or a
    directory on its way, is missing, a symbolic link, or not a regular file/directory.
    """
    parts = _local_parts(operation, path)
    with _local_dirs(root, parts[:-1]) as dir_fds:
        if len(dir_fds) != len(parts):
            raise FileNotFoundError(errno.ENOENT, "no such object", path)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fds[-1])
        except OSError as exc:
            if exc.errno in _LINK_ERRNOS:
                raise FileNotFoundError(errno.ENOENT, "a symbolic link", path) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(errno.ENOENT, "not a file", path)
            yield fd, st, dir_fds
        finally:
            os.close(fd)


def _read_exactly(fd: int, start: int, wanted: int) -> bytes:
    """``wanted`` bytes of ``fd`` from ``start``, in one new ``bytes`` when possible."""
    pieces: list[bytes] = []
    got = 0
    while got < wanted:  # pread returns at most about 2 GiB at once
        piece = os.pread(fd, min(wanted - got, 1 << 30), start + got)
        if not piece:
            raise OSError(errno.EIO, f"the file ended at {start + got} while being read")
        pieces.append(piece)
        got += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _local_read_range(root: Path, path: str, start: int, end: int) -> bytes:
    """Bytes ``start`` up to ``end`` of the object at ``path`` (``end`` clamped to its
    size, as obstore does), with ``pread`` into a new ``bytes``.

    obstore's local ranged read costs about three times the CPU (0.30 s per GiB in 1 MiB
    ranges on tmpfs, against 0.09 s), which a streamed restore pays on top of hashing and
    writing. Raises FileNotFoundError as :func:`_open_object` does, and
    :class:`_RangePastEnd` when ``start`` is not below the size.
    """
    with _open_object(root, "get_range", path) as (fd, st, _):
        if start >= st.st_size:
            raise _RangePastEnd(start, st.st_size)
        return _read_exactly(fd, start, min(end, st.st_size) - start)


def _local_read(root: Path, path: str) -> tuple[bytes, ObjectInfo]:
    """The whole object at ``path`` and the metadata of the version read (a rename
    replacing it meanwhile does not mix versions: the descriptor holds the old file).

    Half the cost of obstore's get and its second await for the bytes, which a
    ``load_latest`` that must read thousands of manifests pays once per manifest.
    """
    with _open_object(root, "get", path) as (fd, st, _):
        return _read_exactly(fd, 0, st.st_size), _local_info(path, st)


def _fsync_directory(directory: Path) -> None:
    """fsync ``directory``, so that a rename or a new name in it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan_tree(dir_fd: int, key: str, found: list[ObjectInfo]) -> None:
    """Append every regular file under ``dir_fd`` (whose object path is ``key``)."""
    subdirs: list[tuple[str, str]] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            name = entry.name
            if entry.is_symlink() or not _utf8(name):
                continue
            child = f"{key}/{name}" if key else name
            if entry.is_dir(follow_symlinks=False):
                subdirs.append((name, child))
            elif entry.is_file(follow_symlinks=False) and not _is_staging(name):
                try:
                    found.append(_local_info(child, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue  # deleted since the scan
    for name, child in subdirs:
        fd = _open_nofollow_dir(name, dir_fd)
        if fd is None:
            continue  # deleted, or replaced by a link, since the scan
        try:
            _scan_tree(fd, child, found)
        finally:
            os.close(fd)


def _utf8(name: str) -> bool:
    # A name that is not UTF-8 (decoded with surrogate escapes) is no object path.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _local_list(root: Path, prefix: str) -> list[ObjectInfo]:
    parts = _local_parts("list", prefix)
    found: list[ObjectInfo] = []
    with _local_dirs(root, parts) as fds:
        if len(fds) == len(parts) + 1:
            _scan_tree(fds[-1], "/".join(parts), found)
    return found


def _local_list_dir(root: Path, prefix: str) -> ListDirResult:
    parts = _local_parts("list", prefix)
    key = "/".join(parts)
    prefixes: list[str] = []
    objects: list[ObjectInfo] = []
    with _local_dirs(root, parts) as fds:
        if len(fds) == len(parts) + 1:
            with os.scandir(fds[-1]) as entries:
                for entry in entries:
                    name = entry.name
                    if entry.is_symlink() or not _utf8(name):
                        continue
                    child = f"{key}/{name}" if key else name
                    if entry.is_dir(follow_symlinks=False):
                        prefixes.append(child + "/")
                    elif entry.is_file(follow_symlinks=False) and not _is_staging(name):
                        with contextlib.suppress(FileNotFoundError):
                            objects.append(_local_info(child, entry.stat(follow_symlinks=False)))
    objects.sort(key=lambda info: info.path)
    return ListDirResult(prefixes=sorted(prefixes), objects=objects)


def _remove_emptied_dirs(dirs: Sequence[str], fds: Sequence[int]) -> None:
    """Remove directory ``dirs[-1]``, then each one above it, for as long as they are empty.

    ``dirs`` are the directories from just below the root down to the one a delete
    emptied; ``fds[i]`` is the descriptor of the directory that holds ``dirs[i]`` (so
    ``fds[0]`` is the root's, which is never removed). ``rmdir`` of a name in its
    parent's descriptor removes only an empty directory, never follows a link (a link
    swapped in is ENOTDIR), and never reaches above the root. One that is not empty
    (another object, or a save that just made it: its staging file is in it before its
    name is) stops the walk; one already gone (another cleanup) does not: its parent may
    be empty now.

    The parent is not fsynced after an ``rmdir``, as it is not after the unlinks that
    emptied the directory: no guarantee of cairn rests on a delete surviving a power cut
    (S3's does, a local store's never did). One that did not survive leaves what was
    there before: the files (which the next GC deletes again) or an empty directory,
    which holds no object.
    """
    for depth in range(len(dirs), 0, -1):
        try:
            os.rmdir(dirs[depth - 1], dir_fd=fds[depth - 1])
        except FileNotFoundError:
            continue
        except OSError:
            return  # ENOTEMPTY (or EEXIST), or not ours to remove: what is above stays too


def _local_delete(root: Path, paths: Sequence[str]) -> None:
    """Unlink each path's final name in its parent, opened without following links, then
    remove the directories that emptied, up to (never including) the root.

    Object stores have no directories: without this each deleted checkpoint would leave
    its folders behind, and every later listing of the base would walk them.
    """
    split = sorted((_local_parts("delete", path), path) for path in paths)
    for parts, path in split:
        if not parts:
            raise StoreError("delete", path, "not an object path")
        if _is_staging(parts[-1]):
            raise StoreError("delete", path, "a name ending in '#<digits>' is no object")
    for parent, group in itertools.groupby(split, key=lambda item: item[0][:-1]):
        with _local_dirs(root, parent) as fds:
            if len(fds) != len(parent) + 1:
                continue  # a parent is missing or a link: no such object here
            removed = False
            for parts, path in group:
                try:
                    os.unlink(parts[-1], dir_fd=fds[-1])  # a link is unlinked, not followed
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise translate_error("delete", path, exc) from exc
                removed = True
            if removed:
                _remove_emptied_dirs(parent, fds)


def _local_remove_tree(root: Path, prefix: str) -> None:
    """Remove directory ``prefix`` and all in it; a link there is removed as a link. Then
    remove the directories above it that this emptied, up to (never including) the root."""
    parts = _local_parts("delete", prefix)
    with _local_dirs(root, parts[:-1]) as fds:
        if len(fds) != len(parts):
            return  # a parent is missing or a link: nothing of ours under the prefix
        name, parent_fd = parts[-1], fds[-1]
        try:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                os.unlink(name, dir_fd=parent_fd)
            elif stat.S_ISDIR(mode):
                # With dir_fd, rmtree opens each level relative to its parent and refuses
                # (rather than follows) a link, also one swapped in while it runs.
                shutil.rmtree(name, dir_fd=parent_fd)
            else:
                return
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise translate_error("delete", prefix, exc) from exc
        _remove_emptied_dirs(parts[:-1], fds)


def _local_open_parent(root: Path, path: str) -> int | None:
    """A new descriptor of the directory that holds object ``path``, reached as every
    local access is (``O_NOFOLLOW`` from ``root``); None if it, or a directory on its way,
    is missing or a link. The caller closes it."""
    parts = _local_parts("put", path)
    with _local_dirs(root, parts[:-1]) as fds:
        if len(fds) != len(parts):
            return None
        return os.dup(fds[-1])


def _local_holds(root: Path, path: str, dir_fd: int) -> bool:
    """Whether ``dir_fd`` is still the directory at the place of object ``path``'s parent:
    not one removed since it was opened (and maybe made again, a new directory)."""
    parts = _local_parts("put", path)
    with _local_dirs(root, parts[:-1]) as fds:
        if len(fds) != len(parts):
            return False
        now, held = os.fstat(fds[-1]), os.fstat(dir_fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _local_parent_missing(root: Path, path: str) -> bool:
    """Whether a directory on the way to object ``path`` is missing (or a link) now."""
    parts = _local_parts("put", path)
    with _local_dirs(root, parts[:-1]) as fds:
        return len(fds) != len(parts)


async def _local_io(operation: str, path: str, func: Callable[..., T], *args: Any) -> T:
    """Run blocking local file-system work in a thread, with our errors."""
    try:
        return await asyncio.to_thread(func, *args)
    except OSError as exc:
        raise translate_error(operation, path, exc) from exc
    finally:
        _shutdown.note_store_call()
