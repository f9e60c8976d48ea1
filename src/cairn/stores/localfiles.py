"""Local files that tools and integrations write and read, never through a symbolic link.

What the command line and :mod:`cairn.torch` do with local files, as a small public
interface over cairn's link-safe file system module: ``cairn restore`` stages a
checkpoint's files (:func:`write_file`), checks them, then moves each into place
(:func:`move_file`); ``export_dcp`` writes a whole directory that appears at once
(:class:`StagedTree`); ``import_dcp`` reads a directory's plain files
(:class:`LocalDirectory`). Paths and bytes in; what a caller cannot use is a
:class:`~cairn.errors.InvalidInputError` naming the path, other failures of the file
system are ``OSError``.

Invariants:

* a root (the directory named by the caller) may itself be a symbolic link, and so may
  its parents: the caller named them. Below it no link is ever followed nor replaced: a
  link at a file's name, or at a directory on the way to it, is refused
  (:class:`~cairn.errors.InvalidInputError` naming the link) before anything is
  written there or read from it, also one swapped in meanwhile (every directory is
  opened relative to its parent's descriptor);
* :func:`write_file` gives a name all of its bytes or none: a staging file beside it,
  fsynced, renamed onto the name, then the directory fsynced. A process killed
  meanwhile may leave a ``.{name}.{random}.tmp`` file, never a torn ``name``;
* :func:`move_file` moves a file written under another root of the same file system
  (a staging directory) to its name with one ``rename``, then fsyncs the directory;
* a :class:`StagedTree` appears at its destination whole and durable, or not at all,
  and only where the destination is missing or an empty directory (never a link).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from cairn.errors import InvalidInputError
from cairn.stores._localfs import (
    LinkRefused,
    LocalDirectory,
    StagedTree,
    atomic_file_at,
    is_link_at,
    open_dirs,
    open_file_at,
    open_root,
)

__all__ = [
    "FileState",
    "LocalDirectory",
    "StagedTree",
    "file_state",
    "find_link",
    "move_file",
    "write_file",
]

FileState = Literal["absent", "same", "different", "other"]
"""What :func:`file_state` finds at a name."""


def _link_error(link: Path) -> InvalidInputError:
    return InvalidInputError(
        f"cannot write through {link}: it is a symbolic link, which cairn never follows "
        "nor replaces"
    )


@contextlib.contextmanager
def _refusing_links(root: Path, names: Sequence[str]) -> Iterator[None]:
    """A link met below ``root`` on the way to ``names`` as the error naming it."""
    try:
        yield
    except LinkRefused as exc:
        raise _link_error(root.joinpath(*names[: exc.depth])) from None


def _names(root: Path, path: Path) -> tuple[str, ...]:
    """The names from ``root`` down to ``path``, which must be below it."""
    try:
        names = path.relative_to(root).parts
    except ValueError:
        raise InvalidInputError(f"{str(path)!r} is not below {str(root)!r}") from None
    if not names or ".." in names:
        raise InvalidInputError(f"{str(path)!r} names no file below {str(root)!r}")
    return names


def find_link(root: Path, relatives: Iterable[str]) -> Path | None:
    """The first symbolic link at or on the way to ``root / relative``, for each
    relative path in turn (``root`` itself may be one).

    Args:
        root: The directory the paths are relative to.
        relatives: Paths below ``root``, looked at in this order.

    Returns:
        The first link met, or None when none meets a link.

    Raises:
        InvalidInputError: A relative path names no file below ``root``.
    """
    for relative in relatives:
        names = _names(root, root / relative)
        with open_dirs(root, names[:-1]) as dirs:
            if dirs.link is not None:
                return root.joinpath(*names[: dirs.link])
            if dirs.complete and is_link_at(dirs.fds[-1], names[-1]):
                return root / relative
    return None


def file_state(path: Path, data: bytes | memoryview) -> FileState:
    """What is at a name now, against the bytes meant for it.

    Reads the file only when its size matches; never follows a link at ``path``.

    Args:
        path: The name to look at.
        data: The bytes the file should hold.

    Returns:
        ``"absent"``, ``"same"`` (a regular file holding exactly ``data``),
        ``"different"`` (another regular file), or ``"other"`` (a directory, a link or
        a special file: nothing a file may replace).
    """
    try:
        fd = open_root(path.parent)
    except FileNotFoundError:
        return "absent"
    except NotADirectoryError:
        return "other"  # a file where its directory would be
    try:
        try:
            status = os.stat(path.name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return "absent"
        if not stat.S_ISREG(status.st_mode):
            return "other"
        view = memoryview(data)
        if status.st_size != view.nbytes:
            return "different"
        try:
            file_fd = open_file_at(fd, path.name, 1)
        except LinkRefused:
            return "other"  # swapped for a link since the stat
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as handle:
        return "same" if handle.read() == view else "different"


def _temp_name(name: str) -> str:
    # The shape of tempfile.mkstemp's names (14 bytes more than ``name``, which
    # cairn.format.layout allows for).
    return f".{name}.{secrets.token_hex(4)}.tmp"


def write_file(path: Path, data: bytes | memoryview, *, root: Path | None = None) -> None:
    """Write a file all at once: staging file, fsync, rename, fsync the directory.

    ``root`` (with its parents) and the directories between it and ``path`` are made if
    missing.

    Args:
        path: The file to write, below ``root``.
        data: Its bytes.
        root: The directory written into; None (the default) is ``path``'s parent.

    Raises:
        InvalidInputError: ``path`` is not below ``root``, or a symbolic link is at
            ``path`` or at a directory between ``root`` and ``path`` (the message
            names it); nothing is written there.
    """
    root = path.parent if root is None else root
    names = _names(root, path)
    with (
        _refusing_links(root, names),
        atomic_file_at(root, names, _temp_name, create=True) as (file, dirs),
    ):
        file.write(data)
        file.commit(dirs.fds[-1:])


def move_file(staged_root: Path, root: Path, relative: str) -> None:
    """Rename ``staged_root / relative`` to ``root / relative`` (one file system).

    The directories between ``root`` and the name are made as needed. A regular file at
    the name is replaced atomically; the directory is fsynced after the rename.

    Args:
        staged_root: The directory the file was staged under.
        root: The directory to move it under.
        relative: The file's path below both.

    Raises:
        InvalidInputError: ``relative`` names no file below ``root``, or a symbolic
            link is at the name or a directory on the way (the message names it);
            nothing is moved.
        FileNotFoundError: A staged directory on the way to the file is gone.
    """
    names = _names(root, root / relative)
    with (
        _refusing_links(root, names),
        open_dirs(root, names[:-1], create=True) as dirs,
        open_dirs(staged_root, names[:-1]) as staged,
    ):
        if is_link_at(dirs.fds[-1], names[-1]):
            raise LinkRefused(len(names))
        if not staged.complete:
            raise FileNotFoundError(errno.ENOENT, "the staged file is gone", str(staged_root))
        name = names[-1]
        os.replace(name, name, src_dir_fd=staged.fds[-1], dst_dir_fd=dirs.fds[-1])
        os.fsync(dirs.fds[-1])
