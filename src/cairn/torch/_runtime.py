"""What the DCP writer and reader share: their checkpointer, running cairn's async API,
and cairn's errors crossing processes.

DCP calls storage methods synchronously (from the training thread, or from the thread
or process ``dcp.async_save`` uses). They run cairn's one async implementation on the
private event-loop thread that :mod:`cairn.sync` keeps, and refuse to run from inside a
running event loop, which they would block.

DCP pickles each rank's exception to send it to the coordinator: cairn's errors pickle
as themselves (see :mod:`cairn.errors`), so a rank's
:class:`~cairn.IntegrityMismatchError` reaches the caller with its path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from obstore.store import MemoryStore, ObjectStore

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import InvalidInputError, PathsUnresolvedError, SyncInAsyncContextError
from cairn.format.layout import CheckpointPaths
from cairn.format.signing import SigningKey
from cairn.integrations._interface import (
    DEFAULT_LEASE,
    positive_int,
    run_blocking,
    start_blocking,
)
from cairn.stores import PartsInFlight, Store

__all__ = [
    "StoreArg",
    "known_paths",
    "make_checkpointer",
    "run",
    "start",
    "travels",
]

T = TypeVar("T")

StoreArg = Store | ObjectStore | str
"""Anything :class:`~cairn.ObjectStoreCheckpointer` accepts as its store."""


def run(coro: Coroutine[Any, Any, T], what: str) -> T:
    """Run ``coro`` on cairn's event-loop thread and wait for it; ``what`` names the caller."""
    _outside_a_loop(coro, what)
    return run_blocking(coro)


def start(coro: Coroutine[Any, Any, T], what: str) -> concurrent.futures.Future[T]:
    """Start ``coro`` on cairn's event-loop thread and return at once (``what`` names the
    caller): its future, which a coroutine run by :func:`run` awaits with
    :func:`asyncio.wrap_future`."""
    _outside_a_loop(coro, what)
    return start_blocking(coro)


def _outside_a_loop(coro: Coroutine[Any, Any, Any], what: str) -> None:
    """Raise :class:`SyncInAsyncContextError` (``coro`` closed unstarted) when called from
    inside a running event loop, which waiting on ``coro`` would block."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    coro.close()
    raise SyncInAsyncContextError(
        f"{what} was called from inside a running event loop, which it would block: "
        "call dcp.save/dcp.load from a thread without one (e.g. asyncio.to_thread)"
    )


def make_checkpointer(
    store: StoreArg,
    prefix: str | None,
    *,
    max_concurrent_uploads: int = 8,
    max_concurrent_downloads: int = 8,
    compression: str | None = None,
    lease: dt.timedelta = DEFAULT_LEASE,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    parts_in_flight: PartsInFlight | int | None = None,
) -> ObjectStoreCheckpointer:
    """The checkpointer a writer or reader works through (arguments checked here);
    ``prefix`` None: the library's default, chosen from the store on first use (see
    :meth:`~cairn.ObjectStoreCheckpointer.resolve_paths`)."""
    positive_int("max_concurrent_uploads", max_concurrent_uploads)
    positive_int("max_concurrent_downloads", max_concurrent_downloads)
    return ObjectStoreCheckpointer(
        store,
        None if prefix is None else CheckpointPaths(prefix),
        max_concurrent_uploads,
        max_concurrent_downloads=max_concurrent_downloads,
        compression=compression,
        lease=lease,
        signing_key=signing_key,
        parts_in_flight=parts_in_flight,
    )


def known_paths(ckpt: ObjectStoreCheckpointer, what: str) -> CheckpointPaths:
    """``ckpt.paths``, for a caller outside the event loop: resolved first (reading the
    store, once per checkpointer) when ``ckpt`` was given no prefix."""
    try:
        return ckpt.paths
    except PathsUnresolvedError:
        return run(ckpt.resolve_paths(), what)


def travels(store: StoreArg, what: str) -> None:
    """Raise :class:`InvalidInputError` if ``store`` means nothing in another process.

    A memory store's contents stay in the process that made it, so a writer over one
    that is pickled into another process (``dcp.async_save`` in process mode) would save
    where nobody can read.
    """
    memory = isinstance(store, MemoryStore) or (
        isinstance(store, str) and store.strip().lower().startswith("memory:")
    )
    if memory:
        raise InvalidInputError(
            f"{what} over a memory store cannot be sent to another process (as "
            "dcp.async_save in process mode does): its contents stay in this one; use a "
            "local directory or an object store URL"
        )
