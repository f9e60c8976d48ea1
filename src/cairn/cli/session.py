"""What every command shares: the store it talks to, its output, and its error handling.

The store is ``--store URL``, else ``$CAIRN_STORE``, else the local directory
``./checkpoints``. A plain path is a local directory; a string that starts with a scheme
must be a well-formed URL (:func:`cairn.stores.store_url`, the library's own parser, so
``s3:/x`` is refused with the library's message, exit 2). S3, GCS and Azure URLs read
their credentials, region, endpoint and options from the usual environment
(``AWS_*``, ``GOOGLE_*``, ``AZURE_*``).

The base prefix is ``--prefix``, else ``$CAIRN_PREFIX``, else the library's default
(:meth:`cairn.ObjectStoreCheckpointer.resolve_paths`): the store's root, or
``checkpoints/`` for a store that holds checkpoints there and none at its root (cairn
0.1's default; a ``warning:`` on stderr says to pass ``--prefix checkpoints/``). One
exception makes the README's first steps work: when neither is given, nothing is
under that default and the store holds runs of ``cairn demo`` (each under
``demo/<run>/``), the newest run's prefix is used, and a ``note:`` on stderr says so.
"Newest" is the run holding the newest checkpoint id (ids are time-ordered).

``$CAIRN_SIGNING_KEY`` (hex; several separated by commas, the first signing) makes every
command sign the manifests it writes (``copy``) and refuse those not signed by one of
the keys (see :mod:`cairn.format.signing`); a value that is not hex is a usage error naming
the variable. ``cairn demo`` neither signs nor verifies.

Commands validate everything they can before any I/O (ids, policies, URLs, target
directories, keys); :meth:`Session.open` is where the store is first touched.

:func:`run` runs one command's coroutine and turns any failure into its exit code (see
:mod:`cairn.cli.errors`), one line on stderr and, with ``--json``, the ``error`` of the
one JSON document on stdout.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import typer

from cairn import (
    CheckpointId,
    CheckpointPaths,
    InvalidInputError,
    ObjectStoreCheckpointer,
    __version__,
    open_store,
)
from cairn.cli.catalog import resolve
from cairn.cli.errors import CliError, ExitCode, describe, error_type, exit_code_for
from cairn.cli.output import Output
from cairn.cli.progress import Transfer
from cairn.format.signing import parse_hex_keys
from cairn.protocol.discover import checkpoint_prefixes as find_prefixes
from cairn.protocol.discover import newest_checkpoint_prefix
from cairn.stores import Store, store_url

__all__ = [
    "DEFAULT_STORE_DIR",
    "DEMO_PREFIX",
    "SIGNING_KEY_ENV",
    "Session",
    "checkpoint_prefixes",
    "cli_store_url",
    "distribution_version",
    "open_checkpointer",
    "run",
    "signing_key_from_env",
]

SIGNING_KEY_ENV = "CAIRN_SIGNING_KEY"
"""The environment variable holding the command's signing keys (hex, comma-separated)."""

DEFAULT_STORE_DIR = "checkpoints"
DEMO_PREFIX = "demo/"
"""Where ``cairn demo`` puts its runs: ``demo/<time>-<random>/``."""


DISTRIBUTION = "cairn-checkpoint"
"""The name cairn is installed under (``pip install cairn-checkpoint``)."""


def distribution_version() -> str:
    """The installed distribution's version; :data:`cairn.__version__` when cairn runs
    from a source tree that is not installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return __version__


def cli_store_url(raw: str | None) -> str:
    """The store URL for ``--store``: the default directory, or the library's parse."""
    if raw is None or raw == "":
        return Path(DEFAULT_STORE_DIR).absolute().as_uri()
    return store_url(raw)


def signing_key_from_env() -> list[bytes] | None:
    """The keys ``$CAIRN_SIGNING_KEY`` holds (None when unset or empty).

    A malformed value raises :class:`CliError` (exit 2) naming the variable, never the key.
    """
    text = os.environ.get(SIGNING_KEY_ENV, "").strip()
    if not text:
        return None
    try:
        return parse_hex_keys(text, SIGNING_KEY_ENV)
    except InvalidInputError as exc:
        raise CliError(str(exc), ExitCode.USAGE) from None


def local_dir(url: str) -> Path | None:
    """The directory a ``file://`` URL names, or None for other stores."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "file" or parts.netloc not in ("", "localhost"):
        return None
    return Path(unquote(parts.path))


async def newest_demo_run(store: Store) -> str | None:
    """The prefix of the newest ``cairn demo`` run in ``store``, or None."""
    return await newest_checkpoint_prefix(store, DEMO_PREFIX)


async def checkpoint_prefixes(store: Store, exclude: str) -> list[str]:
    """Prefixes of ``store`` other than ``exclude`` that hold checkpoint directories: the
    library's bounded walk (:func:`cairn.protocol.discover.checkpoint_prefixes`), which finds the
    usual layouts cheaply and gives up quietly on a bucket with many unrelated folders."""
    return [prefix for prefix in await find_prefixes(store) if prefix != exclude]


def other_prefixes_hint(prefixes: list[str]) -> str:
    """``; the store holds checkpoints under prefix 'p/' (pass --prefix p/)``, or ``""``."""
    if not prefixes:
        return ""
    shown = ", ".join(repr(p) for p in prefixes[:5])
    more = f" and {len(prefixes) - 5} more" if len(prefixes) > 5 else ""
    example = prefixes[0] or "''"  # the store's root is passed as an empty prefix
    return f"; the store holds checkpoints under prefix {shown}{more} (pass --prefix {example})"


@dataclass
class Session:
    """One command's store (URL and base prefix), output streams and debug flag.

    ``url`` and ``prefix`` are known once :meth:`open` has run (``prefix``, when not
    given, is the library's default for the store, or the newest demo run's: see the
    module docstring).
    """

    store_option: str | None
    prefix_option: str | None
    output: Output
    debug: bool = False
    url: str = ""
    prefix: str = ""
    other_store: bool = False  # a second store is in play (copy): store errors name neither
    signing_key: list[bytes] | None = None
    missing_dir: Path | None = None
    """The local directory of the store, when it does not exist (see :meth:`open`)."""

    @classmethod
    def create(
        cls,
        store: str | None,
        prefix: str | None,
        json_mode: bool,
        debug: bool = False,
        *,
        wide: bool = False,
        full_ids: bool = False,
    ) -> Session:
        """A session for ``--store``, ``--prefix`` (None: not given) and ``--json``, its
        tables as ``--wide`` and ``--ids`` ask."""
        output = Output(json_mode=json_mode, wide=wide, full_ids=full_ids)
        return cls(store, prefix, output, debug)

    @property
    def default_store(self) -> bool:
        """True when the store is the default ``./checkpoints``."""
        return not self.store_option

    def where(self) -> str:
        """``URL (prefix 'p/')``: the store named in messages."""
        return f"{self.url} (prefix {self.prefix!r})"

    def doc(self) -> dict[str, str]:
        """The ``store`` and ``prefix`` members of every JSON document."""
        return {"store": self.url, "prefix": self.prefix}

    def parse(self) -> str:
        """The store URL (no I/O): raises :class:`cairn.InvalidStoreUrlError` if malformed."""
        self.url = cli_store_url(self.store_option)
        self.prefix = "" if self.prefix_option is None else self.prefix_option
        CheckpointPaths(self.prefix)  # a malformed prefix is bad input, found before any I/O
        return self.url

    async def open(
        self, *, create: bool = False, missing_is_empty: bool = False
    ) -> ObjectStoreCheckpointer:
        """The checkpointer over the session's store, with the prefix settled.

        Unless ``create``, a local directory that does not exist is reported as an
        unreachable store instead of being created empty; with ``missing_is_empty`` (the
        commands that list what a store holds) it is an empty store instead, left
        uncreated, and :attr:`missing_dir` names it.
        """
        self.parse()
        self.signing_key = signing_key_from_env()
        hint = " (the default store: pass --store URL or set CAIRN_STORE)"
        directory = local_dir(self.url)
        if missing_is_empty and directory is not None and not directory.exists():
            self.missing_dir = directory
            self.prefix = CheckpointPaths(self.prefix_option or "").base_prefix
            # Nothing to read, and nothing to create: an empty store in its place.
            return ObjectStoreCheckpointer(open_store("memory://"), CheckpointPaths(self.prefix))
        ckpt = open_checkpointer(
            self.url,
            self.prefix_option,
            create=create,
            hint=hint if self.default_store else "",
            signing_key=self.signing_key,
        )
        self.prefix = (await ckpt.resolve_paths()).base_prefix
        if self.prefix_option is None and not await ckpt.list_checkpoint_dirs():
            run_prefix = await newest_demo_run(ckpt.store)
            if run_prefix is not None:
                self.output.note(
                    f"nothing under prefix {self.prefix!r}; using the newest `cairn demo` "
                    f"run, prefix {run_prefix!r} (pass --prefix to choose)"
                )
                self.prefix = run_prefix
                ckpt = ObjectStoreCheckpointer(
                    ckpt.store, CheckpointPaths(run_prefix), signing_key=self.signing_key
                )
        return ckpt

    def transfer(self, description: str, total: float | None, unit: str = "bytes") -> Transfer:
        """A progress bar on stderr, drawn only when both streams are terminals and the
        output is not ``--json`` (a pipe or a file never receives one)."""
        output = self.output
        live = not output.json_mode and output.out.is_terminal and output.err.is_terminal
        return Transfer(output.err, description, total, unit=unit, enabled=live)

    async def elsewhere(self, ckpt: ObjectStoreCheckpointer) -> str:
        """A hint naming the other prefixes that hold checkpoints, or ``""``."""
        return other_prefixes_hint(await checkpoint_prefixes(ckpt.store, self.prefix))

    async def resolve(
        self, ckpt: ObjectStoreCheckpointer, ref: str, *, skip_newer_format: bool = False
    ) -> CheckpointId:
        """The checkpoint ``ref`` names (:func:`cairn.cli.catalog.resolve`); when there is
        none, the error names the other prefixes that hold checkpoints."""
        try:
            return await resolve(ckpt, ref, self.where(), skip_newer_format=skip_newer_format)
        except CliError as exc:
            hint = await self.elsewhere(ckpt)
            if not hint:
                raise
            raise CliError(exc.message + hint, exc.code, exc.kind) from None


def open_checkpointer(
    url: str,
    prefix: str | None,
    *,
    create: bool,
    hint: str = "",
    signing_key: list[bytes] | None = None,
) -> ObjectStoreCheckpointer:
    """An :class:`ObjectStoreCheckpointer` over ``url`` with base ``prefix`` (None: the
    library's default, chosen from what the store holds on first use).

    Unless ``create``, a local directory that does not exist raises :class:`CliError`
    (exit 3), with ``hint`` appended to the message. ``signing_key``: its keys (see
    :func:`signing_key_from_env`).
    """
    directory = local_dir(url)
    if directory is not None and not create and not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise CliError(
            f"store unreachable: local directory {directory} {what}{hint}", ExitCode.STORE
        )
    paths = None if prefix is None else CheckpointPaths(prefix)
    return ObjectStoreCheckpointer(open_store(url), paths, signing_key=signing_key)


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


def run(session: Session, command: Callable[[], Awaitable[ExitCode | None]]) -> None:
    """Run ``command`` on an event loop; exit with its code, or report its failure.

    Returns normally on success (exit 0); otherwise raises :class:`typer.Exit` with the
    exit code, after printing ``error: ...`` (and the traceback with ``--debug``). In
    ``--json`` mode the command's document (or, if it has none, one with the ``error``
    alone) is printed on stdout either way.
    """
    configure_logging(session.debug)
    output = session.output
    try:
        code = asyncio.run(_call(command))
    except KeyboardInterrupt:
        output.fail("Interrupted", "interrupted", ExitCode.INTERRUPTED)
        code = ExitCode.INTERRUPTED
    except Exception as exc:
        if session.debug:
            traceback.print_exc()
        code = exit_code_for(exc)
        named = session.url if session.url and not session.other_store else None
        output.fail(error_type(exc), describe(exc, named), code)
    output.emit()
    if code:
        raise typer.Exit(int(code))


async def _call(command: Callable[[], Awaitable[ExitCode | None]]) -> ExitCode | None:
    return await command()
