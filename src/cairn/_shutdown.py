"""A clean interpreter exit after obstore calls, for every program that imports cairn.

The problem: obstore runs its I/O on a tokio runtime whose worker threads take the GIL
to hand results back to Python and to drop Python objects afterwards. That clean-up can
still be running a few microseconds after the ``await`` that returned the result. If the
program exits right then, CPython 3.11 finalizes while a worker waits for the GIL; the
interpreter makes such a thread exit with ``pthread_exit``, whose forced unwinding through
Rust frames aborts the whole process (SIGABRT, exit code 134). Measured here with a
20-line script that awaits one obstore put and one get on a local store and returns:
22 aborts in 60 runs.

The fix: an ``atexit`` handler that, when obstore's runtime has started in this process,
releases the GIL for a short grace period (``time.sleep``) before finalization starts,
so the workers finish their clean-up while the interpreter is still whole. atexit
handlers run before finalization and run LIFO; this one is registered when cairn is
imported, so it runs after the handlers registered later (the sync façade's loop
shutdown among them). It holds for every obstore call in the process, cairn's or the
program's own. It costs nothing in a process that never started obstore's runtime
(seen as ``tokio-*`` threads in ``/proc/self/task`` on Linux; elsewhere, any store call
through cairn counts) and :data:`GRACE_SECONDS` otherwise. Measured with the script
above, cairn imported: 0 aborts in 60 runs with a 5 ms grace; cairn uses 25 ms.
"""

from __future__ import annotations

import atexit
import os
import threading
import time

__all__ = ["GRACE_SECONDS", "install", "note_store_call"]

GRACE_SECONDS = 0.025
"""How long exit waits for obstore's runtime threads to finish their clean-up."""

_lock = threading.Lock()
_installed = False
_store_called = False


def note_store_call() -> None:
    """Record that a store call was made through cairn (for systems without /proc)."""
    global _store_called
    _store_called = True


def _runtime_started() -> bool:
    """Whether obstore's tokio runtime has threads in this process."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return _store_called
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith("tokio-"):
                    return True
        except OSError:  # the thread ended while we looked
            continue
    return False


def _grace_at_exit() -> None:
    if _runtime_started():
        time.sleep(GRACE_SECONDS)


def install() -> None:
    """Register the exit handler once per process (idempotent, cheap)."""
    global _installed
    with _lock:
        if not _installed:
            atexit.register(_grace_at_exit)
            _installed = True
