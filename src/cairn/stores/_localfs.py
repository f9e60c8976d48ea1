"""Local files reached without following a symbolic link, written atomically and durably.

The one module of cairn that opens local files and directories by name: the local store
(:mod:`cairn.stores._local`), directory partitions (:mod:`cairn.protocol._directories`),
the restore of an artifact to a path (:mod:`cairn.protocol._download`), DCP's directory
format (:mod:`cairn.torch`) and local files written for tools
(:mod:`cairn.stores.localfiles`) all go through it. Its primitives:

* :func:`open_dirs` walks from a root directory (which may itself be a link: the caller
  chose it) down a list of names, each opened relative to its parent's descriptor with
  ``O_NOFOLLOW``: a link below the root is never followed, also one swapped in while the
  walk runs. It stops at the first name that is missing, not a directory, or a link, and
  says which (:class:`Dirs`); asked to ``create``, it makes missing directories and
  raises instead of stopping. :func:`open_file_at` opens a file the same way, and
  :func:`open_plain_file` (and :class:`LocalDirectory`, over a root named by a path)
  a regular file below a directory's descriptor.
* :class:`AtomicFile` writes a file under a staging name in a directory walked so, then
  gives it its final name in one ``rename`` (or, create-only, one ``link``, which fails
  if the name exists), never writing through a link at that name nor replacing one
  found there. It fsyncs the file before the rename and the directories after it, so a
  name that survives a power cut holds all its bytes.
* :class:`StagedTree` builds a whole directory tree in a fresh staging directory beside
  its destination, every entry made relative to the staging directory's descriptor,
  and publishes it with one ``rename`` onto a destination that is missing or an empty
  directory (never a link: :func:`check_destination` holds the one set of rules), once
  every directory of it is fsynced; or removes it, leaving the destination as it was.

Errors are ``OSError``; :class:`LinkRefused` (a ``FileNotFoundError``) names the link a
walk or a write met. An unusable destination of a :class:`StagedTree`, and a link or a
special file where :func:`open_plain_file` wants a plain file, are
:class:`~cairn.errors.InvalidInputError` naming it and saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from cairn.errors import InvalidInputError

__all__ = [
    "AtomicFile",
    "Dirs",
    "LinkRefused",
    "LocalDirectory",
    "StagedTree",
    "SyncFailed",
    "atomic_file_at",
    "check_destination",
    "is_link_at",
    "open_dir",
    "open_dirs",
    "open_file_at",
    "open_plain_file",
    "open_root",
    "run_to_end",
]

T = TypeVar("T")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How every directory below a root is opened: never through a link."""

_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
"""How a root is opened: a link there is the caller's choice, and followed."""

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC

_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""A file made here: a new one (never one that exists, nor a link's target)."""

_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
"""What open(O_NOFOLLOW) reports for a link: ELOOP on Linux and macOS, EMLINK on FreeBSD;
with O_DIRECTORY too, Linux reports ENOTDIR (as for any other non-directory)."""


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


def _mode_at(dir_fd: int, name: str) -> int | None:
    """The mode of ``name`` in ``dir_fd`` itself (a link's own); None if it is missing."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def is_link_at(dir_fd: int, name: str) -> bool:
    """Whether ``name`` in directory ``dir_fd`` is a symbolic link (False if missing)."""
    mode = _mode_at(dir_fd, name)
    return mode is not None and stat.S_ISLNK(mode)


def open_root(root: Path) -> int:
    """A descriptor of directory ``root``, which may be a link: the caller named it."""
    return os.open(root, _ROOT_FLAGS)


def open_dir(dir_fd: int, name: str) -> int | None:
    """A new descriptor of directory ``name`` in ``dir_fd``; None if it is missing, not a
    directory, or a symbolic link (never followed)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            return None
        raise


def open_file_at(dir_fd: int, name: str, depth: int) -> int:
    """A new read-only descriptor of ``name`` in ``dir_fd``, never through a link there
    (:class:`LinkRefused` of ``depth``). What it opened may be any kind of file: the
    caller checks ``os.fstat`` of it."""
    try:
        return os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise LinkRefused(depth) from None
        raise


def _new_file_at(dir_fd: int, name: str) -> int:
    """A new, empty file ``name`` in ``dir_fd``, open for writing; ``FileExistsError`` if
    the name is taken, by a link too (whose target is never created)."""
    return os.open(name, _NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)


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


def _step(dirs: Dirs, name: str, create: bool) -> int | None:
    """Open directory ``name`` below ``dirs.fds[-1]`` (made first, with ``create``, if
    missing); None where the walk stops, noting a link in ``dirs.link``."""
    for _ in range(8):  # made, then removed by a concurrent cleanup before the open: again
        fd = open_dir(dirs.fds[-1], name)
        if fd is not None:
            return fd
        mode = _mode_at(dirs.fds[-1], name)
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
def open_dirs(root: Path | int, names: Sequence[str], *, create: bool = False) -> Iterator[Dirs]:
    """Walk from ``root`` down ``names`` (each a directory); all descriptors close on exit.

    ``root`` is a path (which may be a link: the caller chose it) or the descriptor of
    a directory (duplicated: the caller's stays open). Stops at the first name that is
    missing, not a directory or a symbolic link (the result is not ``complete``). With
    ``create``, makes ``root`` (and its parents) and every missing directory instead,
    and raises where it would stop: :class:`LinkRefused` for a link,
    ``NotADirectoryError`` for a file.
    """
    dirs = Dirs(names)
    try:
        if isinstance(root, int):
            dirs.fds.append(os.dup(root))
        else:
            if create:
                root.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                dirs.fds.append(open_root(root))
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
                self.fd = _new_file_at(dir_fd, self.temp)
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


# -- reading a directory's plain files ------------------------------------------------------


def open_plain_file(dir_fd: int, relative: str, shown: Path) -> BinaryIO:
    """The plain file ``relative`` (``/``-separated) below directory ``dir_fd`` (``shown``
    in messages), open for reading, reached without following a link.

    ``FileNotFoundError`` if it (or a directory on its way) is missing;
    :class:`~cairn.errors.InvalidInputError` naming it for a link on its way or at its
    name, and for anything but a regular file.
    """
    *parents, name = relative.split("/")
    path = shown.joinpath(*relative.split("/"))
    with open_dirs(dir_fd, parents) as dirs:
        if dirs.link is not None:
            link = shown.joinpath(*parents[: dirs.link])
            raise InvalidInputError(
                f"cannot read {path}: {link} is a symbolic link, never followed"
            )
        if not dirs.complete:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        try:
            fd = open_file_at(dirs.fds[-1], name, len(parents) + 1)
        except LinkRefused:
            raise InvalidInputError(
                f"cannot read {path}: it is a symbolic link, never followed"
            ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidInputError(f"cannot read {path}: it is not a plain file")
    return os.fdopen(fd, "rb")


class LocalDirectory:
    """A directory whose plain files are read without following a link below it.

    The root is opened anew by each call, so nothing stays open between them.

    Args:
        root: The directory; it may itself be a link (the caller named it).
    """

    def __init__(self, root: Path) -> None:
        self.path = root

    def names(self) -> list[str]:
        """The names in the directory itself.

        Returns:
            The names, sorted.
        """
        fd = open_root(self.path)
        try:
            with os.scandir(fd) as entries:
                return sorted(entry.name for entry in entries)
        finally:
            os.close(fd)

    def open(self, relative: str) -> BinaryIO:
        """A plain file of the directory, open for reading (see :func:`open_plain_file`).

        Args:
            relative: The file's ``/``-separated path below the directory.

        Returns:
            The file, open for reading in binary mode.
        """
        fd = open_root(self.path)
        try:
            return open_plain_file(fd, relative, self.path)
        finally:
            os.close(fd)


# -- a staged directory tree, published whole ---------------------------------------------


def check_destination(parent_fd: int, dest: Path, action: str) -> None:
    """Refuse a destination ``dest`` (in directory ``parent_fd``) of a whole tree unless
    it is missing or an empty directory, with :class:`~cairn.errors.InvalidInputError`
    saying which rule it breaks: "cannot {action} into {dest}: ...".

    A symbolic link there is refused whatever it points at: it is never followed, nor
    replaced (a ``rename`` would replace the link itself, not fill its target).
    """

    def refuse(reason: str) -> InvalidInputError:
        return InvalidInputError(
            f"cannot {action} into {str(dest)!r}: {reason}; give a missing or empty directory"
        )

    mode = _mode_at(parent_fd, dest.name)
    if mode is None:
        return
    if stat.S_ISLNK(mode):
        raise refuse("it is a symbolic link, which is never followed")
    fd = open_dir(parent_fd, dest.name) if stat.S_ISDIR(mode) else None
    if fd is None:
        raise refuse("it is a file, not a directory")
    try:
        with os.scandir(fd) as entries:
            first = next(entries, None)
    finally:
        os.close(fd)
    if first is not None:
        raise refuse(
            f"it is a directory that is not empty ({first.name!r} is in it): a whole "
            "directory is written, never mixed with other files"
        )


def _sync_tree(dir_fd: int) -> None:
    """fsync every directory below ``dir_fd``, deepest first, then ``dir_fd`` itself."""
    with os.scandir(dir_fd) as entries:
        names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    for name in names:
        fd = open_dir(dir_fd, name)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "a staged directory is gone", name)
        try:
            _sync_tree(fd)
        finally:
            os.close(fd)
    os.fsync(dir_fd)


def _same_file(fd: int, dir_fd: int, name: str) -> bool:
    """Whether ``name`` in ``dir_fd`` (not followed) is the very file ``fd`` is open on."""
    try:
        there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


class StagedTree:
    """A directory tree that appears at ``dest`` whole and durable, or not at all.

    Made as a fresh directory beside ``dest`` (``.{name}.{random}.partial``, in ``dest``'s
    parent, which is made if missing: a link among the parents is the caller's choice),
    once :func:`check_destination` accepts ``dest``. Every file and directory of the tree
    is made relative to the staging directory's descriptor (:meth:`create`), so a link
    swapped in for it, or planted inside it, is never written through. Each file is
    fsynced by its writer; :meth:`publish` fsyncs every directory, checks ``dest`` again,
    checks that the staging name still holds the directory it made, and renames it onto
    ``dest`` relative to the parent's descriptor (a ``rename`` onto a missing name or an
    empty directory is atomic), then fsyncs the parent. Use it as a context manager:
    leaving it unpublished removes the staging directory (if the name still holds it),
    and ``dest`` is as it was. Its calls may come from several threads at once;
    :meth:`close` waits for those in flight, and a call after it raises ``ValueError``.

    Args:
        dest: Where the tree is to appear: missing, or an empty directory.
        action: What the tree is for, in error messages ("export a DCP checkpoint").

    Raises:
        InvalidInputError: ``dest`` is unusable (see :func:`check_destination`).
    """

    def __init__(self, dest: Path, action: str) -> None:
        if dest.name in ("", ".", ".."):
            raise InvalidInputError(
                f"cannot {action} into {str(dest)!r}: give the path of the directory itself"
            )
        self.dest, self.action = dest, action
        self.published = False
        self._lock = threading.Lock()
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.parent_fd = open_root(dest.parent)
        self.fd = -1
        try:
            check_destination(self.parent_fd, dest, action)
            self.name = f".{dest.name}.{secrets.token_hex(8)}.partial"
            os.mkdir(self.name, 0o777, dir_fd=self.parent_fd)
            opened = open_dir(self.parent_fd, self.name)
            if opened is None:
                raise FileNotFoundError(errno.ENOENT, "the staging directory is gone", self.path)
            self.fd = opened
        except BaseException:
            self.close()
            raise

    @property
    def path(self) -> Path:
        """Where the staging directory is (for messages: nothing opens it by this path)."""
        return self.dest.parent / self.name

    def __enter__(self) -> StagedTree:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _open_tree(self) -> Iterator[int]:
        """The staging directory's descriptor, held open until the block ends: a call
        from a worker thread that outlived its caller meets a closed tree, never a
        descriptor closed under it (and maybe reused for another directory)."""
        with self._lock:
            if self.fd < 0:
                raise ValueError(f"the staged tree {str(self.path)!r} is closed")
            yield self.fd

    def create(self, relative: str) -> BinaryIO:
        """A new file in the tree, open for writing; the directories on its way are made.

        Args:
            relative: The file's ``/``-separated path in the tree.

        Returns:
            The new file, open for writing in binary mode.

        Raises:
            FileExistsError: It exists.
            LinkRefused: A link is on its way.
            NotADirectoryError: A file is on its way.
        """
        *parents, name = relative.split("/")
        with self._open_tree() as fd, open_dirs(fd, parents, create=True) as dirs:
            return os.fdopen(_new_file_at(dirs.fds[-1], name), "wb")

    def open(self, relative: str) -> BinaryIO:
        """A plain file of the tree, open for reading (see :func:`open_plain_file`).

        Args:
            relative: The file's ``/``-separated path in the tree.

        Returns:
            The file, open for reading in binary mode.
        """
        with self._open_tree() as fd:
            return open_plain_file(fd, relative, self.path)

    def names(self) -> list[str]:
        """The names in the staging directory itself.

        Returns:
            The names, sorted.
        """
        with self._open_tree() as fd, os.scandir(fd) as entries:
            return sorted(entry.name for entry in entries)

    def publish(self) -> None:
        """fsync the tree, then rename it onto ``dest`` (see the class docstring)."""
        with self._open_tree() as fd:
            _sync_tree(fd)
            check_destination(self.parent_fd, self.dest, self.action)
            if not _same_file(fd, self.parent_fd, self.name):
                raise InvalidInputError(
                    f"cannot {self.action} into {str(self.dest)!r}: its staging directory "
                    f"{str(self.path)!r} was replaced while it was written; nothing was "
                    "published"
                )
            try:
                os.rename(
                    self.name, self.dest.name, src_dir_fd=self.parent_fd, dst_dir_fd=self.parent_fd
                )
            except OSError:
                check_destination(self.parent_fd, self.dest, self.action)  # filled meanwhile
                raise
            self.published = True
            os.fsync(self.parent_fd)

    def close(self) -> None:
        """Remove the staging directory unless published; close the descriptors. Waits
        for a call on the tree in flight in another thread to end first."""
        with self._lock:
            if self.fd >= 0:
                if not self.published and _same_file(self.fd, self.parent_fd, self.name):
                    # With dir_fd, rmtree opens each level relative to its parent and
                    # refuses (rather than follows) a link.
                    shutil.rmtree(self.name, dir_fd=self.parent_fd, ignore_errors=True)
                os.close(self.fd)
                self.fd = -1
            if self.parent_fd >= 0:
                os.close(self.parent_fd)
                self.parent_fd = -1


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
