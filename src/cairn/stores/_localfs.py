"""Local files reached without following a symbolic link, and written atomically and durably.

Two primitives, shared by the local store (:mod:`cairn.stores._local`), the restore of an
artifact to a path (:mod:`cairn.protocol._download`) and the ``cairn restore`` command
(:mod:`cairn.cli.files`):

* :func:`open_dirs` walks from a root directory (which may itself be a link: the caller
  chose it) down a list of names, each opened relative to its parent's descriptor with
  ``O_NOFOLLOW``: a link below the root is never followed, also one swapped in while the
  walk runs. It stops at the first name that is missing, not a directory, or a link, and
  says which (:class:`Dirs`); asked to ``create``, it makes missing directories and
  raises instead of stopping.
* :class:`AtomicFile` writes a file under a staging name in a directory walked so, then
  gives it its final name in one ``rename`` (or, create-only, one ``link``, which fails
  if the name exists), never writing through a link at that name nor replacing one
  found there. It fsyncs the file before the rename and the directories after it, so a
  name that survives a power cut holds all its bytes.

Errors are ``OSError``; :class:`LinkRefused` (a ``FileNotFoundError``) names the link a
walk or a write met.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "DIR_FLAGS",
    "AtomicFile",
    "Dirs",
    "LinkRefused",
    "SyncFailed",
    "atomic_file_at",
    "is_link_at",
    "open_dir",
    "open_dirs",
    "run_to_end",
]

T = TypeVar("T")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How every directory below a root is opened: never through a link."""

_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
"""What open(O_NOFOLLOW) reports for a link: ELOOP on Linux and macOS, EMLINK on FreeBSD;
with O_DIRECTORY too, Linux reports ENOTDIR (as for any other non-directory)."""

_STAGING_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkRefused(FileNotFoundError):
    """A symbolic link where a walk or a write was to pass or put a file.

    ``depth`` counts the names from the root up to and including the link, so
    ``names[:depth]`` is the link's path below the root.
    """

    def __init__(self, depth: int) -> None:
        super().__init__(errno.ELOOP, "a symbolic link is never followed")
        self.depth = depth


class SyncFailed(OSError):
    """An fsync that failed: what was written may be lost in a crash. ``named`` tells
    whether the file already had its final name (only its directories failed)."""

    def __init__(self, exc: OSError, named: bool) -> None:
        super().__init__(exc.errno, exc.strerror)
        self.named = named


def is_link_at(dir_fd: int, name: str) -> bool:
    """Whether ``name`` in directory ``dir_fd`` is a symbolic link (False if missing)."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


@dataclass
class Dirs:
    """Descriptors of a root and of the directories a walk reached below it, in order.

    ``fds[0]`` is the root's (absent if the root is missing); the walk reached every
    name when ``complete``. ``link`` is the depth of the link it stopped at, if that is
    why it stopped (see :class:`LinkRefused`).
    """

    names: Sequence[str]
    fds: list[int] = field(default_factory=list)
    link: int | None = None

    @property
    def complete(self) -> bool:
        """Whether every name was a real directory, so ``fds[-1]`` is the last one's."""
        return len(self.fds) == len(self.names) + 1


def open_dir(dir_fd: int, name: str) -> int | None:
    """A new descriptor of directory ``name`` in ``dir_fd``; None if it is missing, not a
    directory, or a symbolic link (never followed)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            return None
        raise


def _step(dirs: Dirs, name: str, create: bool) -> int | None:
    """Open directory ``name`` below ``dirs.fds[-1]`` (made first, with ``create``, if
    missing); None where the walk stops, noting a link in ``dirs.link``."""
    for _ in range(8):  # made, then removed by a concurrent cleanup before the open: again
        fd = open_dir(dirs.fds[-1], name)
        if fd is not None:
            return fd
        try:
            mode: int | None = os.stat(name, dir_fd=dirs.fds[-1], follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            dirs.link = len(dirs.fds)
            if create:
                raise LinkRefused(dirs.link)
            return None
        if not create:
            return None
        if mode is None:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=dirs.fds[-1])
        elif not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
        # else another writer made it since the open: open it on the next round
    raise FileNotFoundError(errno.ENOENT, "a directory kept vanishing as it was made", name)


@contextlib.contextmanager
def open_dirs(root: Path, names: Sequence[str], *, create: bool = False) -> Iterator[Dirs]:
    """Walk from ``root`` down ``names`` (each a directory); all descriptors close on exit.

    Stops at the first name that is missing, not a directory or a symbolic link (the
    result is not ``complete``). With ``create``, makes ``root`` (and its parents) and
    every missing directory instead, and raises where it would stop: :class:`LinkRefused`
    for a link, ``NotADirectoryError`` for a file.
    """
    dirs = Dirs(names)
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            dirs.fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        if dirs.fds:
            for name in names:
                fd = _step(dirs, name, create)
                if fd is None:
                    break
                dirs.fds.append(fd)
        yield dirs
    finally:
        for fd in reversed(dirs.fds):
            os.close(fd)


class AtomicFile:
    """A new file that appears under ``name`` in ``dir_fd`` whole, durable, or not at all.

    Created under ``staging(name)`` (a fresh name each try, created exclusively and
    without following a link) in the same directory; write to :attr:`fd`, then
    :meth:`commit`. A link already at ``name`` is refused (:class:`LinkRefused` of
    ``depth``) before anything is created. Use it as a context manager: leaving it
    without a commit (an exception, a cancellation) removes the staging file.
    """

    def __init__(self, dir_fd: int, name: str, staging: Callable[[str], str], depth: int) -> None:
        if is_link_at(dir_fd, name):
            raise LinkRefused(depth)
        self.dir_fd, self.name, self.depth = dir_fd, name, depth
        for _ in range(100):
            self.temp: str | None = staging(name)
            try:
                self.fd = os.open(self.temp, _STAGING_FLAGS, 0o666, dir_fd=dir_fd)
                return
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, "no free staging name", name)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.temp, dir_fd=self.dir_fd)

    def write(self, data: bytes | memoryview) -> None:
        """Write all of ``data`` at the end of the file."""
        view = memoryview(data).cast("B")
        while view.nbytes:
            view = view[os.write(self.fd, view) :]

    def commit(self, sync_dirs: Sequence[int], *, exclusive: bool = False) -> os.stat_result:
        """fsync the file, give it its name, then fsync ``sync_dirs`` (deepest first).

        ``exclusive``: fail with ``FileExistsError`` if the name exists (a ``link``, which
        never replaces), else replace what is there (a ``rename``, which replaces the
        entry itself and never writes through it). The status returned is the file's.
        A failure of the directories' fsync raises after the name is in place.
        """
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise SyncFailed(exc, named=False) from exc
        status = os.fstat(self.fd)
        assert self.temp is not None
        if exclusive:
            os.link(self.temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        else:
            os.rename(self.temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            self.temp = None
        try:
            for fd in reversed(sync_dirs):
                os.fsync(fd)
        except OSError as exc:
            raise SyncFailed(exc, named=True) from exc
        return status


@contextlib.contextmanager
def atomic_file_at(
    root: Path, names: Sequence[str], staging: Callable[[str], str], *, create: bool = False
) -> Iterator[tuple[AtomicFile, Dirs]]:
    """An :class:`AtomicFile` for ``root / names...``, with the directories on its way.

    The directories are walked by :func:`open_dirs` (made if missing, with ``create``);
    one that is missing raises ``FileNotFoundError``, one that is a link
    :class:`LinkRefused`, as does a link at the name.
    """
    with open_dirs(root, names[:-1], create=create) as dirs:
        if not dirs.complete:
            if dirs.link is not None:
                raise LinkRefused(dirs.link)
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(root))
        with AtomicFile(dirs.fds[-1], names[-1], staging, len(names)) as file:
            yield file, dirs


async def run_to_end(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a worker thread, awaited to its end even when cancelled (then the
    cancellation is raised after it), so that no descriptor it uses is closed under it."""
    task = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller hears of
        raise
