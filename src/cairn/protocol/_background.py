"""Background saves: the caller goes on while a checkpoint uploads and commits.

:class:`BackgroundSaves` is how both façades save: :meth:`BackgroundSaves.save` (a save
the caller waits for) and :meth:`BackgroundSaves.save_async` (one in the background) run
the one-call save of :mod:`cairn.protocol._save` in the pipeline this module keeps.

Invariants:

* at most ``limit`` background saves are in flight; a further submission waits for a
  slot (back-pressure: a job that checkpoints faster than the store takes them slows
  down instead of piling copies of its state in memory);
* saves commit in submission order (a save the caller waits for too,
  :meth:`BackgroundSaves.save`): each waits, just before its commit point, for the
  one submitted before it to finish (uploads still overlap), so ``_latest`` moves in
  call order and never backwards;
* a save commits only if the one submitted before it, still running when it was
  submitted, committed: when that one failed or was cancelled, the next fails at its
  commit point with
  :class:`~cairn.errors.CheckpointAbortedError` and commits nothing, and so does every
  later one. A pipeline never skips a link: the save after a failed one may build on it
  (its parent), and committing it would publish a chain with a checkpoint missing, or
  built on whatever another writer committed under that id;
* a save whose parent is a save of the same pipeline still in flight takes the parent's
  chains from the manifest that save commits, once it has (its own uploads go on
  meanwhile), never from the store, which holds no manifest of it yet, or another
  writer's under that id; if the parent commits nothing, it fails with
  :class:`~cairn.errors.CheckpointAbortedError` and commits nothing;
* a failure is never lost: it is raised from the save's own future, and, if nobody
  looked at that future, from the next submission (also when it ended while that
  submission waited for its slot: the save submitted is then not started), ``wait()``
  or ``close()`` of the checkpointer (once).

After each commit, a checkpointer given a retention policy collects garbage in the
background (:class:`BackgroundGc`): at most one GC runs at a time, requests made while
one runs coalesce into one more run after it, a GC never delays the save that asked
for it, and its failure is logged and kept (``last_error``), never raised into a save.

Whether a failure was looked at is what asyncio itself tracks to warn that "exception
was never retrieved" (a task's ``_log_traceback`` flag, cleared by ``await``,
``result()`` and ``exception()``); a blocking caller's future reports its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from cairn.data import CheckpointData
from cairn.errors import CheckpointAbortedError, InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.manifest import CheckpointManifest
from cairn.observe import Observer, _dispatch
from cairn.protocol import _save
from cairn.protocol._context import Context

__all__ = ["BackgroundGc", "BackgroundSaves", "close_background"]

log = logging.getLogger("cairn")

BeforeCommit = Callable[[], Awaitable[None]]
"""Awaited by a save just before its commit point."""


@dataclass
class _Failure:
    error: BaseException
    seen: Callable[[], bool]
    """Whether the caller already saw this failure through the save's own future."""
    mark_seen: Callable[[], None]


class BackgroundSaves:
    """The saves of one checkpointer, in call order (see the module docstring).

    ``limit`` saves at most run in the background at once. Each save runs on the
    checkpointer's ``context`` as it is when the save starts, reports to ``observers``
    (the saves in flight too), and hands its committed manifest to ``committed``.
    """

    def __init__(
        self,
        limit: int,
        context: Callable[[], Awaitable[Context]],
        observers: Sequence[Observer] = (),
        committed: Callable[[CheckpointManifest], CheckpointManifest] = lambda manifest: manifest,
    ) -> None:
        self.limit = limit
        self._context = context
        self._observers = observers
        self._committed = committed
        self._slots: asyncio.Semaphore | None = None
        self._last: asyncio.Task[CheckpointManifest] | None = None
        self._running: set[asyncio.Task[CheckpointManifest]] = set()
        self._failures: list[_Failure] = []
        self._uncommitted: set[asyncio.Task[CheckpointManifest]] = set()
        """Saves that ended without committing (kept while a later save may ask)."""
        self._committing: dict[CheckpointId, asyncio.Future[CheckpointManifest | None]] = {}
        """Each background save in flight, by id: what it commits (None: nothing)."""

    @property
    def in_flight(self) -> int:
        """Background saves submitted and not finished."""
        return len(self._running)

    async def save(self, data: CheckpointData) -> CheckpointManifest:
        """A save of ``data`` the caller waits for, in call order with the background ones.

        First raises a failure nobody saw. While background saves are in flight, the
        save is submitted as one more (:meth:`save_async`) and awaited, so it commits
        after them; otherwise it runs now.
        """
        self.raise_unobserved()
        if self.in_flight:
            return await (await self.save_async(data))
        with _dispatch.watching(self._observers):
            return self._committed(await _save.save(await self._context(), data))

    async def save_async(
        self,
        data: CheckpointData,
        *,
        copy: bool = False,
        seen: Callable[[], bool] | None = None,
    ) -> asyncio.Task[CheckpointManifest]:
        """A save of ``data`` in the background; its task, once a slot is free (see
        :meth:`submit`). With ``copy``, every buffer of ``data`` is copied first.

        ``seen`` is for a caller who watches another future than the task (the
        blocking façade's): it tells whether that caller saw the save's failure.
        """
        if not isinstance(data, CheckpointData):
            raise InvalidInputError(f"save_async takes a CheckpointData, got {data!r}")
        if copy:
            data = data.copied()
        context = await self._context()
        label = (str(data.id), context.paths.manifest(data.id))
        parent = self._parent_committing(data, label)
        outcome: asyncio.Future[CheckpointManifest | None] = (
            asyncio.get_running_loop().create_future()
        )
        with _dispatch.watching(self._observers):  # the task copies this context

            async def run(in_order: BeforeCommit) -> CheckpointManifest:
                manifest = self._committed(await _save.save(context, data, in_order, parent))
                outcome.set_result(manifest)
                return manifest

            task = await self.submit(run, seen, checkpoint=label)
        self._committing[data.id] = outcome

        def ended(_: object) -> None:
            if not outcome.done():
                outcome.set_result(None)
            if self._committing.get(data.id) is outcome:
                del self._committing[data.id]

        task.add_done_callback(ended)
        return task

    def _parent_committing(
        self, data: CheckpointData, checkpoint: tuple[str, str]
    ) -> Callable[[], Awaitable[CheckpointManifest]] | None:
        """A wait for what ``data``'s parent commits, when the parent is a save of this pipeline
        still in flight: its manifest once committed, or
        :class:`CheckpointAbortedError` (naming ``checkpoint``) if it commits nothing.
        None when the parent is not in flight here (the store has it, or not)."""
        outcome = self._committing.get(data.parent_id) if data.parent_id is not None else None
        if outcome is None:
            return None
        committing = outcome

        async def parent() -> CheckpointManifest:
            manifest = await asyncio.shield(committing)
            if manifest is None:
                raise CheckpointAbortedError(
                    *checkpoint, f"the save of its parent {data.parent_id} did not commit"
                )
            return manifest

        return parent

    async def submit(
        self,
        run: Callable[[BeforeCommit], Awaitable[CheckpointManifest]],
        seen: Callable[[], bool] | None = None,
        *,
        checkpoint: tuple[str, str] = ("", ""),
    ) -> asyncio.Task[CheckpointManifest]:
        """Start ``run`` once a slot is free; its task. ``run`` gets the wait-for-order hook,
        which raises :class:`CheckpointAbortedError` (naming ``checkpoint``, its id and
        manifest path) when the save submitted before it did not commit.

        ``seen`` tells whether the caller saw the save's failure through its own future
        (default: asyncio's record of whether the task's exception was retrieved).
        """
        self.raise_unobserved()
        if self._slots is None:  # bound to the running loop on first use
            self._slots = asyncio.Semaphore(self.limit)
        await self._slots.acquire()
        try:  # a save that failed while this one waited for its slot: the caller learns first
            self.raise_unobserved()
        except BaseException:
            self._slots.release()
            raise
        # A save that ended before this submission needs no wait, and its failure, if
        # any, was raised above or seen: this save is the caller's answer to it.
        previous = self._last if self._last is not None and not self._last.done() else None
        self._uncommitted.intersection_update({previous})

        async def in_order() -> None:
            if previous is None:
                return
            if not previous.done():
                await asyncio.wait([previous])
            if previous in self._uncommitted:
                raise CheckpointAbortedError(
                    *checkpoint, "the save submitted before it did not commit"
                )

        async def guarded() -> CheckpointManifest:
            try:
                return await run(in_order)
            except asyncio.CancelledError:
                self._uncommitted.add(task)
                raise  # a cancelled save commits nothing and is not a failure to report
            except BaseException as exc:
                self._uncommitted.add(task)
                self._failures.append(
                    _Failure(exc, seen or _retrieved(task), lambda: _mark_retrieved(task))
                )
                raise

        task = asyncio.create_task(guarded())
        self._last = task
        self._running.add(task)
        task.add_done_callback(self._finished)
        self._changed()
        return task

    def _finished(self, task: asyncio.Task[CheckpointManifest]) -> None:
        self._running.discard(task)
        assert self._slots is not None
        self._slots.release()
        self._changed()

    def _changed(self) -> None:
        _dispatch.saves_in_flight(self._observers, len(self._running))

    async def wait(self) -> None:
        """Wait for every save in flight; raise a failure nobody looked at."""
        while self._running:
            await asyncio.wait(list(self._running))
        self.raise_unobserved()

    def raise_unobserved(self) -> None:
        """Raise the first failure nobody saw (once); forget those that were seen."""
        pending = [failure for failure in self._failures if not failure.seen()]
        self._failures = pending[1:]
        if pending:
            pending[0].mark_seen()
            raise pending[0].error


def _retrieved(task: asyncio.Task[CheckpointManifest]) -> Callable[[], bool]:
    """Whether ``task``'s exception was retrieved (awaited, ``result()``, ``exception()``)."""
    return lambda: task.done() and not getattr(task, "_log_traceback", False)


def _mark_retrieved(task: asyncio.Task[CheckpointManifest]) -> None:
    """Retrieve ``task``'s exception: reported by the checkpointer, asyncio need not warn."""
    if task.done() and not task.cancelled():
        task.exception()


class BackgroundGc:
    """GC after commits, in the background, one at a time (see the module docstring).

    ``run`` is one GC. :meth:`request` starts it unless one is running, in which case
    one more run follows that one however many requests came meanwhile (a GC that began
    before the newest commit might not see it). :meth:`wait` waits until none runs.
    """

    def __init__(self, run: Callable[[], Awaitable[object]]) -> None:
        self._run = run
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self.runs = 0
        """GC runs finished (failed ones included)."""
        self.last_error: Exception | None = None
        """The failure of the latest GC run, None if it succeeded (or none ran)."""

    @property
    def running(self) -> bool:
        """Whether a GC is running or about to."""
        return self._task is not None and not self._task.done()

    def request(self) -> None:
        """Ask for a GC (on the event loop's thread); returns at once."""
        if self.running:
            self._again = True
            return
        self._task = asyncio.create_task(self._runs(), name="cairn-retention-gc")

    async def _runs(self) -> None:
        while True:
            self._again = False
            try:
                await self._run()
                self.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed GC must not fail the saves
                self.last_error = exc
                log.warning("retention GC after a commit failed: %s", exc)
            self.runs += 1
            if not self._again:
                return

    async def wait(self) -> None:
        """Wait until no GC runs (a failure is in ``last_error``, not raised)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait([self._task])


async def close_background(
    saves: BackgroundSaves, gc: BackgroundGc, exc: BaseException | None = None
) -> None:
    """Wait for the ``saves`` in flight, never cancelled, then for the ``gc`` they started
    (its failure is logged, not raised). A save failure nobody looked at is raised once
    both have ended; after a block that raised ``exc``, it is logged and added to ``exc``
    as a note instead, so that neither is lost."""
    try:
        try:
            await saves.wait()
        finally:
            await gc.wait()
    except Exception as failure:
        if exc is None:
            raise
        log.error("a background save failed while the checkpointer closed: %s", failure)
        exc.add_note(f"while closing the checkpointer, a background save failed: {failure!r}")
