"""Writing local files so that a reader never sees a partly written one.

:func:`write_atomic` writes to a temporary name in the target's own directory, flushes
and fsyncs it, renames it over the final name (an atomic replace on POSIX), then
fsyncs the directory so the rename itself survives a crash. If anything fails, or the
process is killed, the final name holds either nothing or a complete file (a killed
process may leave a ``.NAME.*.tmp`` file behind, never a torn ``NAME``).

Symbolic links below the directory written into are never followed nor replaced: a
link at the file's name, or at any directory on the way to it, is refused (exit 2)
naming the link, before anything is written there. Each directory is opened relative to
its parent with ``O_NOFOLLOW`` and the file is created and renamed relative to that
descriptor, so a directory swapped for a link while the file is written is not
followed either. :func:`find_link` lets a caller refuse before it writes any file.

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
from collections.abc import Iterable
from pathlib import Path

from cairn.cli.errors import CliError, ExitCode

__all__ = [
    "check_target_dir",
    "existing_kind",
    "find_link",
    "move_into",
    "refuse_link",
    "write_atomic",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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

    ``root`` itself may be a link (the caller chose it); below it, one ``lstat`` per
    existing component. None when no path meets a link.
    """
    seen: set[Path] = set()
    for relative in relatives:
        current = root
        for part in Path(relative).parts:
            current = current / part
            if current in seen:
                continue
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                break
            if stat.S_ISLNK(mode):
                return current
            seen.add(current)
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


def _open_dirs(root: Path, path: Path) -> list[int]:
    """Descriptors of ``root`` and of each directory from it to ``path``'s parent.

    Creates missing directories; refuses a link among them. The caller closes them.
    """
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        current = root
        for part in path.parent.relative_to(root).parts:
            current = current / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fds[-1])
            try:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            except OSError:
                # A link fails with ENOTDIR or ELOOP (EMLINK on FreeBSD): say which it is.
                mode = os.stat(part, dir_fd=fds[-1], follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    raise refuse_link(current) from None
                raise
    except BaseException:
        for fd in reversed(fds):
            os.close(fd)
        raise
    return fds


def _create_temp(name: str, dir_fd: int) -> tuple[int, str]:
    # The shape of tempfile.mkstemp's names (14 bytes more than ``name``, which
    # cairn.layout allows for), created relative to the directory's descriptor.
    for _ in range(100):
        temp = f".{name}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(temp, flags, 0o600, dir_fd=dir_fd), temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name")


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
    try:
        root.mkdir(parents=True, exist_ok=True)
        fds = _open_dirs(root, path)
    except OSError as exc:
        raise _fail(path, exc) from None
    dir_fd, temp = fds[-1], None
    try:
        try:
            mode = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            raise refuse_link(path)
        fd, temp = _create_temp(path.name, dir_fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # rename() replaces whatever entry holds the name (a link swapped in since the
        # check above included) and never writes through it.
        os.replace(temp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        temp = None
        os.fsync(dir_fd)
    except OSError as exc:
        raise _fail(path, exc) from None
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
        for fd in reversed(fds):
            os.close(fd)


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
    source, path = staged_root / relative, root / relative
    try:
        fds = _open_dirs(root, path)
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        source_fds = _open_dirs(staged_root, source)
    except OSError as exc:
        for fd in reversed(fds):
            os.close(fd)
        raise _fail(source, exc) from None
    try:
        try:
            mode = os.stat(path.name, dir_fd=fds[-1], follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            raise refuse_link(path)
        os.replace(path.name, path.name, src_dir_fd=source_fds[-1], dst_dir_fd=fds[-1])
        os.fsync(fds[-1])
    except OSError as exc:
        raise _fail(path, exc) from None
    finally:
        for fd in (*reversed(source_fds), *reversed(fds)):
            os.close(fd)
