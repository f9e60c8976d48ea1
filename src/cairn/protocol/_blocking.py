"""Blocking calls into the async implementation: one event loop on a daemon thread.

The blocking API (:mod:`cairn.sync`) and the integrations that offer blocking calls
(:mod:`cairn.torch`, through :mod:`cairn.integrations._interface`) run every coroutine
with :func:`run_blocking`, on the one loop this module keeps for the whole process: a
checkpointer's background saves and lease renewals run on the loop that started them,
so every blocking caller shares it.

Invariants: a coroutine is never run from a thread that is running an event loop (that
loop would deadlock waiting for itself): :class:`SyncInAsyncContextError` instead, and
the coroutine is closed unstarted; the loop thread starts on first use and stops at
interpreter exit.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from cairn.errors import SyncInAsyncContextError

__all__ = ["LoopThread", "run_blocking", "start_blocking"]

T = TypeVar("T")


class LoopThread:
    """One event loop on a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, its thread started on the first call (and stopped at exit)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="cairn-sync-loop", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                atexit.register(self.stop)
            return self._loop

    def stop(self) -> None:
        """Stop the loop and its thread (the next :meth:`loop` starts a new one)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not thread.is_alive():
            loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (see the module docstring)."""
        return self.start(coro).result()

    def start(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop and return at once: its future."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise SyncInAsyncContextError(
                "SyncCheckpointer was called from inside a running event loop; "
                "await the ObjectStoreCheckpointer methods there instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop())


_LOOP = LoopThread()
"""The loop every blocking call of the process runs on."""


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on cairn's loop thread and wait for its result.

    Raises :class:`~cairn.errors.SyncInAsyncContextError` when called from a thread
    running an event loop.
    """
    return _LOOP.run(coro)


def start_blocking(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on cairn's loop thread without waiting for it: its future, which a
    coroutine on that loop awaits with :func:`asyncio.wrap_future`.

    Raises :class:`~cairn.errors.SyncInAsyncContextError` as :func:`run_blocking` does.
    """
    return _LOOP.start(coro)
