"""Writing local files so that a reader never sees a partly written one.

:func:`write_atomic` writes to a temporary name in the target's own directory, flushes
and fsyncs it, renames it over the final name (an atomic replace on POSIX), then
fsyncs the directory so the rename itself survives a crash. If anything fails, or the
process is killed, the final name holds either nothing or a complete file (a killed
process may leave a ``.NAME.*.tmp`` file behind, never a torn ``NAME``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from cairn.cli.errors import CliError, ExitCode

__all__ = ["check_target_dir", "write_atomic"]


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


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` all at once: temp file, fsync, rename, fsync the dir.

    Raises :class:`CliError` (exit 2) naming the path when the file cannot be written.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}", ExitCode.USAGE) from None
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise CliError(f"cannot write {path}: {exc.strerror or exc}", ExitCode.USAGE) from None
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
