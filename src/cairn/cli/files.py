"""Writing local files so that a reader never sees a partly written one.

:func:`write_atomic` writes to a temporary name in the target's own directory, flushes
and fsyncs it, renames it over the final name (an atomic replace on POSIX), then
fsyncs the directory so the rename itself survives a crash. If anything fails, or the
process is killed, the final name holds either nothing or a complete file (a killed
process may leave a ``.NAME.*.tmp`` file behind, never a torn ``NAME``).

Symbolic links below the directory written into are never followed nor replaced: a
link at the file's name, or at any directory on the way to it, is refused (exit 2)
naming the link, before anything is written there. The files are written by the
library's :mod:`cairn.stores.localfiles`, whose every directory is opened relative to
its parent without following a link, so a directory swapped for a link while the file
is written is not followed either. :func:`find_link` lets a caller refuse before it
writes any file.

:func:`move_into` moves a file written elsewhere under the same root (a staging
directory) to its final name the same way: one atomic rename, relative to directory
descriptors opened without following links, then an fsync of the directory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from cairn.cli.errors import CliError, ExitCode
from cairn.errors import InvalidInputError
from cairn.stores.localfiles import FileState, file_state, find_link, move_file, write_file

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


_LINK_HINT = "remove it, or restore into another directory"


def refuse_link(link: Path) -> CliError:
    """The error (exit 2) for a symbolic link met where a restored file would go."""
    return CliError(
        f"cannot write through {link}: it is a symbolic link, which cairn never follows "
        f"nor replaces ({_LINK_HINT})",
        ExitCode.USAGE,
    )


@contextlib.contextmanager
def _refusing(path: Path) -> Iterator[None]:
    """CliError (exit 2) for what writing ``path`` met: a link (the library's error
    names it), or another OS error, naming ``path``."""
    try:
        yield
    except InvalidInputError as exc:
        raise CliError(f"{exc} ({_LINK_HINT})", ExitCode.USAGE) from None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}", ExitCode.USAGE) from None


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
    with _refusing(path):
        write_file(path, data, root=root)


def existing_kind(path: Path, data: bytes | memoryview) -> FileState:
    """What is at ``path`` now, against ``data``: ``absent``, ``same`` (a regular file
    holding exactly ``data``), ``different`` (another regular file), or ``other`` (a
    directory, a link or a special file: nothing to replace a file with).

    Reads the file only when its size matches. Does not follow a link at ``path``.
    """
    return file_state(path, data)


def move_into(staged_root: Path, root: Path, relative: str) -> None:
    """Rename ``staged_root / relative`` to ``root / relative`` (same file system).

    Directories between ``root`` and the name are created as needed; a symbolic link
    there, or at the name, is refused (exit 2) and nothing is moved. The rename replaces
    a regular file at the name atomically; the directory is fsynced after it.
    """
    with _refusing(root / relative):
        move_file(staged_root, root, relative)
