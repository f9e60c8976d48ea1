"""Exit codes of the ``cairn`` command, and the one line that describes each failure.

=====  ==================================================================================
code   meaning
=====  ==================================================================================
0      success
1      a verification or integrity failure: :class:`cairn.IntegrityError` and its
       subclasses (digest mismatch, corrupt manifest, broken chain), a checkpoint that
       cannot be decoded (:class:`cairn.CodecError`), a copy that conflicts with what
       the target holds (:class:`cairn.CheckpointExistsError`, :class:`cairn.FencedError`)
2      bad usage or bad input: command-line errors, :class:`cairn.InvalidInputError`
       (bad URL, bad id, bad policy), an unknown checkpoint
       (:class:`cairn.CheckpointNotFoundError`), an unusable target directory
3      the store failed or cannot be reached: :class:`cairn.StoreError`
=====  ==================================================================================

A failure is reported as one line on stderr, ``error: <what went wrong>``, never a
traceback (unless ``--debug``).
"""

from __future__ import annotations

import enum
import importlib
from types import ModuleType

from cairn import (
    CheckpointerError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CodecError,
    FencedError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidInputError,
    InvalidStoreUrlError,
    StoreError,
    TransientStoreError,
)

__all__ = [
    "CliError",
    "ExitCode",
    "click_exceptions",
    "describe",
    "exit_code_for",
    "is_usage_error",
    "one_line",
]

MAX_MESSAGE = 600


class ExitCode(enum.IntEnum):
    """The process exit status of every ``cairn`` command."""

    OK = 0
    INTEGRITY = 1
    USAGE = 2
    STORE = 3


def click_exceptions() -> ModuleType:
    """click's exception classes as typer raises them.

    typer >= 0.26 vendors click as ``typer._click``; older versions use ``click`` itself.
    """
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("neither typer._click nor click is installed")


def is_usage_error(exc: BaseException) -> bool:
    """True for a command-line usage error (unknown option, missing argument, ...)."""
    return isinstance(exc, click_exceptions().UsageError)


class CliError(Exception):
    """A failure the command reports itself: ``message`` and the exit ``code``."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code for ``exc`` (see the module docstring); 1 for anything unexpected."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, IntegrityError | CodecError | CheckpointExistsError | FencedError):
        return ExitCode.INTEGRITY
    if isinstance(exc, InvalidInputError | CheckpointNotFoundError) or is_usage_error(exc):
        return ExitCode.USAGE
    if isinstance(exc, StoreError):
        return ExitCode.STORE
    return ExitCode.INTEGRITY


def one_line(text: str) -> str:
    """``text`` on one line (line breaks folded), cut to a readable length."""
    folded = " ".join(text.split())
    return folded if len(folded) <= MAX_MESSAGE else folded[: MAX_MESSAGE - 1] + "…"


def describe(exc: BaseException) -> str:
    """One line naming what went wrong, for ``error: ...`` on stderr."""
    if isinstance(exc, CliError):
        return one_line(exc.message)
    if isinstance(exc, IntegrityMismatchError):
        text = (
            f"integrity failure: artifact {exc.path!r} is damaged: "
            f"expected {exc.expected}, found {exc.actual}"
        )
    elif isinstance(exc, IntegrityError):
        text = f"integrity failure: {exc}"
    elif isinstance(exc, InvalidStoreUrlError):
        text = f"bad store URL {exc.url!r}: {exc.reason}"
    elif isinstance(exc, CheckpointNotFoundError):
        text = str(exc)
    elif isinstance(exc, InvalidInputError):
        text = f"invalid input: {exc}"
    elif isinstance(exc, TransientStoreError):
        text = f"store unreachable: {exc}"
    elif isinstance(exc, StoreError):
        text = f"store failure: {exc}"
    elif isinstance(exc, CheckpointerError):
        text = str(exc)
    elif isinstance(exc, click_exceptions().ClickException):
        text = exc.format_message()
    else:
        text = f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)"
    return one_line(text)
