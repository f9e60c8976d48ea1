"""Writing local files so that a reader never sees a partly written one.

:func:`write_atomic` writes to a temporary name in the target's own directory, flushes
and fsyncs it, renames it over the final name (an atomic replace on POSIX), then
fsyncs the directory so the rename itself survives a crash. If anything fails, or the
process is killed, the final name holds either nothing or a complete file (a killed
process may leave a ``.NAME.*.tmp`` file behind, never a torn ``NAME``).

Symbolic links below the directory written into are never followed nor replaced: a
link at the file's name, or at any directory on the way to it, is refused (exit 2)
naming the link, before anything is written there. The directories are walked and the
file written by the primitives every local file of cairn goes through
(:mod:`cairn.stores._localfs`): each directory opened relative to its parent with
``O_NOFOLLOW``, the file created and renamed relative to that descriptor, so a
directory swapped for a link while the file is written is not followed either.
:func:`find_link` lets a caller refuse before it writes any file.

:func:`move_into` moves a file written elsewhere under the same root (a staging
directory) to its final name the same way: one atomic rename, relative to directory
descriptors opened without following links, then an fsync of the directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from cairn.cli.errors import CliError, ExitCode
from cairn.stores._localfs import LinkRefused, atomic_file_at, is_link_at, open_dirs

__all__ = [
    "check_target_dir",
    "existing_kind",
    "find_link",
    "move_into",
    "refuse_link",
    "write_atomic",
]


def check_target_dir(target: Path) -> None:
    """Refuse (exit 2) a target that exists and is not a directory, or is under a file."""
    for candidate in (target, *target.parents):
        if candidate.exists():
            if not candidate.is_dir():
                which = "it is" if candidate == target else f"{candidate} is"
                raise CliError(
                    f"cannot restore into {target}: {which} a file, not a directory",
                    ExitCode.USAGE,
                )
            return


def find_link(root: Path, relatives: Iterable[str]) -> Path | None:
    """The first symbolic link at or on the way to ``root / relative``, for each relative.

    ``root`` itself may be a link (the caller chose it). None when no path meets a link.
    """
    for relative in relatives:
        names = Path(relative).parts
        with open_dirs(root, names[:-1]) as dirs:
            if dirs.link is not None:
                return root.joinpath(*names[: dirs.link])
            if dirs.complete and is_link_at(dirs.fds[-1], names[-1]):
                return root / relative
    return None


def refuse_link(link: Path) -> CliError:
    """The error (exit 2) for a symbolic link met where a restored file would go."""
    return CliError(
        f"cannot write through {link}: it is a symbolic link, which cairn never follows "
        "nor replaces (remove it, or restore into another directory)",
        ExitCode.USAGE,
    )


def _fail(path: Path, exc: OSError) -> CliError:
    return CliError(f"cannot write {path}: {exc.strerror or exc}", ExitCode.USAGE)


def _temp_name(name: str) -> str:
    # The shape of tempfile.mkstemp's names (14 bytes more than ``name``, which
    # cairn.format.layout allows for).
    return f".{name}.{secrets.token_hex(4)}.tmp"


@contextlib.contextmanager
def _refusing_links(root: Path, names: Sequence[str], path: Path) -> Iterator[None]:
    """CliError (exit 2) for what writing ``names`` under ``root`` met: a link, named, or
    another OS error, naming ``path``."""
    try:
        yield
    except LinkRefused as exc:
        raise refuse_link(root.joinpath(*names[: exc.depth])) from None
    except OSError as exc:
        raise _fail(path, exc) from None


def write_atomic(path: Path, data: bytes | memoryview, *, root: Path | None = None) -> None:
    """Write ``data`` to ``path`` all at once: temp file, fsync, rename, fsync the dir.

    ``root`` (default: ``path``'s parent) is the directory written into; ``path`` must
    be under it. ``root`` and the directories between it and ``path`` are created if
    missing (``root`` and its parents as any path the caller names; links there are the
    caller's choice and are followed). A symbolic link at
    ``path`` or at any directory between ``root`` and ``path`` is refused, never followed
    nor replaced. Raises :class:`CliError` (exit 2) naming the path or the link when
    the file cannot be written.
    """
    root = path.parent if root is None else root
    names = path.relative_to(root).parts
    with (
        _refusing_links(root, names, path),
        atomic_file_at(root, names, _temp_name, create=True) as (file, dirs),
    ):
        file.write(data)
        file.commit(dirs.fds[-1:])


def existing_kind(path: Path, data: bytes | memoryview) -> str:
    """What is at ``path`` now, against ``data``: ``absent``, ``same`` (a regular file
    holding exactly ``data``), ``different`` (another regular file), or ``other`` (a
    directory, a link or a special file: nothing to replace a file with).

    Reads the file only when its size matches. Does not follow a link at ``path``.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    except NotADirectoryError:
        return "other"
    if not stat.S_ISREG(st.st_mode):
        return "other"
    view = memoryview(data)
    if st.st_size != view.nbytes:
        return "different"
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        return "same" if handle.read() == view else "different"


def move_into(staged_root: Path, root: Path, relative: str) -> None:
    """Rename ``staged_root / relative`` to ``root / relative`` (same file system).

    Directories between ``root`` and the name are created as needed; a symbolic link
    there, or at the name, is refused (exit 2) and nothing is moved. The rename replaces
    a regular file at the name atomically; the directory is fsynced after it.
    """
    names = Path(relative).parts
    path = root / relative
    with (
        _refusing_links(root, names, path),
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
