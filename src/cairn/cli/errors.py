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
4      nothing to do: ``verify --all`` found no checkpoint (an empty store, or the
       wrong prefix; the message names the prefixes that hold checkpoints)
5      a checkpoint needs a newer cairn: its manifest requires format features this
       cairn does not know (:class:`cairn.NewerFormatError`). Not damage: a cairn that
       knows them reads it. Damage found in the same run wins (exit 1)
130    interrupted (Ctrl-C)
=====  ==================================================================================

A failure is reported as one line on stderr, ``error: <what went wrong>``, never a
traceback (unless ``--debug``). With ``--json`` the same failure is also one JSON
object on stdout: ``{"schema_version": 1, "error": {"type", "message", "exit_code"}}``
(see :func:`error_doc`).
"""

from __future__ import annotations

import enum
from typing import Any

import typer

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
    NewerFormatError,
    StoreError,
    TransientStoreError,
)

SCHEMA_VERSION = 1
"""The version of every JSON document ``cairn --json`` prints (``schema_version``)."""

__all__ = [
    "EXIT_CODES_HELP",
    "SCHEMA_VERSION",
    "CliError",
    "ExitCode",
    "describe",
    "error_doc",
    "error_type",
    "exit_code_for",
    "is_usage_error",
    "needs_newer_text",
    "one_line",
]

MAX_MESSAGE = 600


class ExitCode(enum.IntEnum):
    """The process exit status of every ``cairn`` command."""

    OK = 0
    INTEGRITY = 1
    USAGE = 2
    STORE = 3
    NOTHING_VERIFIED = 4
    NEWER_FORMAT = 5
    INTERRUPTED = 130


EXIT_CODES_HELP = """\b
Exit codes:
  0    ok
  1    a checkpoint does not verify (damaged artifact or manifest, broken chain)
  2    bad usage or input: option, URL, id, unknown checkpoint
  3    the store failed or cannot be reached
  4    verify --all found no checkpoint to verify (empty store or wrong prefix)
  5    a checkpoint needs a newer cairn (unknown format features; not damage)
  130  interrupted (Ctrl-C)"""
"""The exit codes as ``cairn --help`` lists them (``\\b``: printed as written)."""

_KIND_OF_CODE = {
    ExitCode.OK: "Ok",
    ExitCode.INTEGRITY: "IntegrityError",
    ExitCode.USAGE: "UsageError",
    ExitCode.STORE: "StoreError",
    ExitCode.NOTHING_VERIFIED: "NothingVerified",
    ExitCode.NEWER_FORMAT: "NewerFormatError",
    ExitCode.INTERRUPTED: "Interrupted",
}


def is_usage_error(exc: BaseException) -> bool:
    """True for a command-line usage error (unknown option, missing argument, ...).

    typer raises the errors of the command line as instances of
    :class:`typer.TyperException` (:class:`typer.BadParameter` is one), each with the
    exit code it stands for: 2 for bad usage.
    """
    return isinstance(exc, typer.TyperException) and exc.exit_code == ExitCode.USAGE


class CliError(Exception):
    """A failure the command reports itself: ``message``, the exit ``code``, and its
    ``kind`` for JSON (default: the kind of failure the code stands for)."""

    def __init__(self, message: str, code: ExitCode, kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.kind = kind or _KIND_OF_CODE[code]


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code for ``exc`` (see the module docstring); 1 for anything unexpected."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, NewerFormatError):
        return ExitCode.NEWER_FORMAT
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


def needs_newer_text(exc: NewerFormatError) -> str:
    """What a checkpoint a newer cairn wrote is, in the words every command uses:
    ``needs a newer cairn (written by cairn X; unknown format features: a, b)``."""
    writer = f"cairn {exc.written_by}" if exc.written_by is not None else "a cairn that did not say"
    return (
        f"needs a newer cairn (written by {writer}; "
        f"unknown format features: {', '.join(exc.features)})"
    )


def describe(exc: BaseException, store_url: str | None = None) -> str:
    """One line naming what went wrong, for ``error: ...`` on stderr (``store_url``: the
    store the command talks to; the library's store errors name their bucket or
    container and what to set themselves, so it is not repeated)."""
    del store_url
    if isinstance(exc, CliError):
        return one_line(exc.message)
    if isinstance(exc, IntegrityMismatchError):
        of = f" of {exc.location}" if exc.location else ""
        text = (
            f"integrity failure: artifact {exc.path!r}{of} is damaged: "
            f"expected {exc.expected}, found {exc.actual}"
        )
    elif isinstance(exc, NewerFormatError):
        which = f"checkpoint {exc.checkpoint_id}" if exc.checkpoint_id else repr(exc.path)
        text = f"{which} {needs_newer_text(exc)}"
    elif isinstance(exc, IntegrityError):
        text = f"integrity failure: {exc}"
    elif isinstance(exc, InvalidStoreUrlError):
        text = str(exc)  # the library's own message: one parser, one message
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
    elif isinstance(exc, typer.TyperException):
        text = exc.format_message()
    else:
        text = f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)"
    return one_line(text)


def error_type(exc: BaseException) -> str:
    """The ``type`` of a failure in JSON: the cairn error's class name, or its kind."""
    if isinstance(exc, CliError):
        return exc.kind
    if isinstance(exc, KeyboardInterrupt):
        return "Interrupted"
    if is_usage_error(exc):
        return "UsageError"
    return type(exc).__name__


def error_doc(kind: str, message: str, code: int) -> dict[str, Any]:
    """The ``error`` member of a failed command's JSON document."""
    return {"type": kind, "message": message, "exit_code": int(code)}
