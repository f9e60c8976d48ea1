"""What every command shares: the store it talks to, its output, and its error handling.

The store is ``--store URL``, else ``$CAIRN_STORE``, else the local directory
``./checkpoints`` (as the ``file://`` URL of its absolute path). A plain path is taken
as a local directory. S3, GCS and Azure URLs read their credentials, region, endpoint
and options from the usual environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``).

:func:`run` runs one command's coroutine and turns any failure into its exit code (see
:mod:`cairn.cli.errors`) and one line on stderr.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import typer

from cairn import CheckpointPaths, ObjectStoreCheckpointer, open_store
from cairn.cli.errors import CliError, ExitCode, describe, exit_code_for
from cairn.cli.output import Output

__all__ = ["DEFAULT_PREFIX", "DEFAULT_STORE_DIR", "Session", "run", "store_url"]

DEFAULT_STORE_DIR = "checkpoints"
DEFAULT_PREFIX = "checkpoints/"


def store_url(raw: str | None) -> str:
    """The store URL for ``--store``: a URL as given, a plain path as a ``file://`` URL."""
    if raw is None or raw == "":
        return Path(DEFAULT_STORE_DIR).resolve().as_uri()
    if "://" in raw:
        return raw
    return Path(raw).expanduser().resolve().as_uri()


def local_dir(url: str) -> Path | None:
    """The directory a ``file://`` URL names, or None for other stores."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "file" or parts.netloc not in ("", "localhost"):
        return None
    return Path(unquote(parts.path))


@dataclass
class Session:
    """One command's store (URL and base prefix) and output streams."""

    url: str
    prefix: str
    output: Output
    default_store: bool = False

    @classmethod
    def create(cls, store: str | None, prefix: str, json_mode: bool) -> Session:
        """A session for ``--store``, ``--prefix`` and ``--json``."""
        return cls(
            url=store_url(store),
            prefix=prefix,
            output=Output(json_mode=json_mode),
            default_store=not store,
        )

    def where(self) -> str:
        """``URL (prefix 'p/')``: the store named in messages."""
        return f"{self.url} (prefix {self.prefix!r})"

    def checkpointer(self, *, create: bool = False) -> ObjectStoreCheckpointer:
        """A checkpointer over the session's store.

        Unless ``create``, a local directory that does not exist is reported as an
        unreachable store instead of being created empty.
        """
        hint = " (the default store: pass --store URL or set CAIRN_STORE)"
        return open_checkpointer(
            self.url, self.prefix, create=create, hint=hint if self.default_store else ""
        )


def open_checkpointer(
    url: str, prefix: str, *, create: bool, hint: str = ""
) -> ObjectStoreCheckpointer:
    """An :class:`ObjectStoreCheckpointer` over ``url`` with base ``prefix``.

    Unless ``create``, a local directory that does not exist raises :class:`CliError`
    (exit 3), with ``hint`` appended to the message.
    """
    directory = local_dir(url)
    if directory is not None and not create and not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise CliError(
            f"store unreachable: local directory {directory} {what}{hint}", ExitCode.STORE
        )
    return ObjectStoreCheckpointer(open_store(url), CheckpointPaths(prefix))


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {' '.join(record.getMessage().split())}"


def configure_logging(debug: bool) -> None:
    """cairn's warnings as ``warning: ...`` lines on stderr; everything with ``--debug``."""
    logger = logging.getLogger("cairn")
    handler = logging.StreamHandler()
    if debug:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    else:
        handler.setFormatter(_OneLine())
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    logger.propagate = False


def run(session: Session, debug: bool, command: Callable[[], Awaitable[ExitCode | None]]) -> None:
    """Run ``command`` on an event loop; exit with its code, or report its failure.

    Returns normally on success (exit 0); otherwise raises :class:`typer.Exit` with the
    exit code, after printing ``error: ...`` (and the traceback with ``debug``).
    """
    configure_logging(debug)
    try:
        code = asyncio.run(_call(command))
    except KeyboardInterrupt:
        session.output.error("interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:
        if debug:
            traceback.print_exc()
        session.output.error(describe(exc))
        raise typer.Exit(int(exit_code_for(exc))) from None
    if code:
        raise typer.Exit(int(code))


async def _call(command: Callable[[], Awaitable[ExitCode | None]]) -> ExitCode | None:
    return await command()
