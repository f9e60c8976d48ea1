"""A blocking façade over the async checkpointer, for code without an event loop.

There is one implementation of every operation, the async one: each method here submits
the async call to cairn's private event loop, running on a daemon thread
(:mod:`cairn.protocol._blocking`), and waits for it.
Calling a method from a thread that is running an event loop raises
:class:`SyncInAsyncContextError` instead of deadlocking that loop; use the async API there.

Parameters are written once, on the async side: the constructor takes the async
checkpointer's (:func:`_arguments_of`), and each blocking method its async twin's
(:func:`_twin_of`), for callers, type checkers and :func:`inspect.signature` alike;
``tests/protocol/test_sync.py`` checks that every async method has its twin here. Each
method's documentation is its async twin's, copied when the class is made
(:func:`_blocking_docs`), so ``help(SyncCheckpointer.save)`` says what ``save`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread
import functools
import inspect
import logging
import re
import threading
import weakref
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, cast

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.data import CheckpointData
from cairn.errors import SyncInAsyncContextError
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest
from cairn.protocol._blocking import run_blocking

__all__ = ["SyncCheckpointer", "SyncInAsyncContextError"]

T = TypeVar("T")
P = ParamSpec("P")
log = logging.getLogger("cairn")


class _WatchedFuture(concurrent.futures.Future[CheckpointManifest]):
    """A future that knows whether its outcome was taken (``result()``/``exception()``)."""

    def __init__(self) -> None:
        super().__init__()
        self._taken = False

    def seen(self) -> bool:
        """True once the caller took the outcome (so a failure was reported to it)."""
        return self._taken

    def result(self, timeout: float | None = None) -> CheckpointManifest:
        outcome = super().result(timeout)
        self._taken = True
        return outcome

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = super().exception(timeout)
        self._taken = True
        return error

    def take_outcome(self, task: asyncio.Task[CheckpointManifest]) -> None:
        """Copy the outcome of the save's task (a done callback, on the loop thread)."""
        if not self.set_running_or_notify_cancel():
            return
        if task.cancelled():
            self.set_exception(concurrent.futures.CancelledError())
        elif (error := task.exception()) is not None:
            self.set_exception(error)
        else:
            self.set_result(task.result())


_in_flight_at_exit: weakref.WeakSet[SyncCheckpointer] = weakref.WeakSet()


def _wait_at_exit() -> None:
    """Let background saves and retention GC finish before the interpreter stops them
    (failures are logged)."""
    for checkpointer in list(_in_flight_at_exit):
        try:
            checkpointer.close()
        except BaseException as exc:
            log.error("a background save failed before exit: %s", exc)


# Exit runs threading's exit hooks (last registered, first run) before atexit's, and one of
# them stops the thread pools that saves hash in; a wait in an atexit handler would come too
# late. So the wait is a threading exit hook, registered after the thread pool's own (whose
# module is imported above for that reason). It is the hook concurrent.futures itself uses.
threading._register_atexit(_wait_at_exit)  # type: ignore[attr-defined]


def _arguments_of(
    init: Callable[Concatenate[Any, P], None],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """Give the decorated ``__init__`` the parameters of ``init``, for callers, type
    checkers and :func:`inspect.signature` alike: the parameters are written once."""

    def give(func: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        return cast(
            "Callable[Concatenate[Any, P], None]",
            functools.update_wrapper(func, init, assigned=(), updated=()),
        )

    return give


def _twin_of(
    twin: Callable[Concatenate[ObjectStoreCheckpointer, P], Coroutine[Any, Any, T]],
) -> Callable[[Callable[..., Any]], Callable[Concatenate[SyncCheckpointer, P], T]]:
    """Give the decorated blocking method the parameters and the result of its async
    ``twin``, for callers, type checkers and :func:`inspect.signature` alike: they are
    written once, on the twin."""

    def give(method: Callable[..., Any]) -> Callable[Concatenate[SyncCheckpointer, P], T]:
        return cast(
            "Callable[Concatenate[SyncCheckpointer, P], T]",
            functools.update_wrapper(method, twin, assigned=(), updated=()),
        )

    return give


_POINTER = re.compile(r"See :meth:`ObjectStoreCheckpointer\.(\w+)`[;.]?\s*")

_BLOCKING = (
    "Blocks until it is done (the work runs on cairn's private event loop; called inside "
    "a running event loop it raises :class:`SyncInAsyncContextError`: await the async "
    "method there)."
)


_SECTION = re.compile(r"^(Args|Returns|Yields|Raises):\s*$", re.MULTILINE)

_IN_LOOP = "    SyncInAsyncContextError: Called from inside a running event loop."


def _with_in_loop_error(sections: str) -> str:
    """Google-style ``sections`` with :class:`SyncInAsyncContextError` last in ``Raises:``
    (a ``Raises:`` section added when there is none)."""
    lines = sections.splitlines()
    if "Raises:" not in lines:
        return "\n\n".join(part for part in [sections, f"Raises:\n{_IN_LOOP}"] if part)
    end = lines.index("Raises:") + 1
    while end < len(lines) and (not lines[end] or lines[end].startswith(" ")):
        end += 1
    while not lines[end - 1]:
        end -= 1
    return "\n".join([*lines[:end], _IN_LOOP, *lines[end:]])


def _blocking_doc(method: str, async_doc: str, own: str) -> str:
    """The documentation of blocking ``method``: its async twin's, said of a blocking
    call (after the twin's first paragraph, however many lines it takes); before the
    twin's sections, what the method's own docstring adds after its pointer to the twin
    and the twin's name; :class:`SyncInAsyncContextError` among the errors it raises."""
    summary, _, body = inspect.cleandoc(async_doc).partition("\n\n")
    body = re.sub(r"\bawait (:meth:`)", r"call \1", body.strip())
    body = re.sub(r"\bAwait (:meth:`)", r"Call \1", body)
    heading = _SECTION.search(body)
    start = len(body) if heading is None else heading.start()
    prose, sections = body[:start].strip(), body[start:].strip()
    extra = _POINTER.sub("", inspect.cleandoc(own), count=1).strip()
    twin = f"(The blocking form of :meth:`ObjectStoreCheckpointer.{method}`.)"
    parts = [summary.strip(), _BLOCKING, prose, extra, twin, _with_in_loop_error(sections)]
    return "\n\n".join(part for part in parts if part) + "\n"


def _blocking_docs(cls: type[T]) -> type[T]:
    """Give each method of ``cls`` whose docstring points at its async twin
    (``See :meth:`ObjectStoreCheckpointer.name```) the twin's documentation."""
    for name, member in vars(cls).items():
        own = inspect.getdoc(member) or ""
        pointer = _POINTER.match(own)
        if name.startswith("_") or pointer is None or not callable(member):
            continue
        twin = getattr(ObjectStoreCheckpointer, pointer.group(1), None)
        if twin is not None and twin.__doc__:
            member.__doc__ = _blocking_doc(pointer.group(1), twin.__doc__, own)
    return cls


@_blocking_docs
class SyncCheckpointer:
    """The methods of :class:`ObjectStoreCheckpointer`, blocking.

    Takes the same arguments as :class:`ObjectStoreCheckpointer`, or wraps an existing
    one with :meth:`wrap`. ``.async_checkpointer`` is the instance doing the work. Use
    it as ``with SyncCheckpointer(...) as ckpt:``; leaving the block closes it, waiting
    for saves in flight and the retention GC (see :meth:`__exit__`).
    """

    @_arguments_of(ObjectStoreCheckpointer.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.async_checkpointer = ObjectStoreCheckpointer(*args, **kwargs)

    @classmethod
    def wrap(cls, checkpointer: ObjectStoreCheckpointer) -> SyncCheckpointer:
        """A blocking façade over an existing async checkpointer.

        Args:
            checkpointer: The checkpointer to do the work.

        Returns:
            The façade; its ``async_checkpointer`` is ``checkpointer``.
        """
        façade = cls.__new__(cls)
        façade.async_checkpointer = checkpointer
        return façade

    @property
    def paths(self) -> CheckpointPaths:
        """The layout of the store: :meth:`resolve_paths`, so it reads the store on its
        first use when no ``paths`` was given."""
        return self.resolve_paths()

    @_twin_of(ObjectStoreCheckpointer.resolve_paths)
    def resolve_paths(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.resolve_paths`."""
        return run_blocking(self.async_checkpointer.resolve_paths(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.save_manifest)
    def save_manifest(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.save_manifest`."""
        return run_blocking(self.async_checkpointer.save_manifest(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.exists)
    def exists(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.exists`."""
        return run_blocking(self.async_checkpointer.exists(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_manifest)
    def load_manifest(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_manifest`."""
        return run_blocking(self.async_checkpointer.load_manifest(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.save_snapshot)
    def save_snapshot(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.save_snapshot`."""
        return run_blocking(self.async_checkpointer.save_snapshot(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.save_delta)
    def save_delta(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.save_delta`."""
        return run_blocking(self.async_checkpointer.save_delta(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_artifact)
    def load_artifact(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_artifact`."""
        return run_blocking(self.async_checkpointer.load_artifact(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_artifact_to)
    def load_artifact_to(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_artifact_to` (``progress`` is called on
        the checkpointer's event-loop thread)."""
        return run_blocking(self.async_checkpointer.load_artifact_to(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.update_latest)
    def update_latest(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.update_latest`."""
        return run_blocking(self.async_checkpointer.update_latest(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.read_latest)
    def read_latest(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.read_latest`."""
        return run_blocking(self.async_checkpointer.read_latest(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.latest_id)
    def latest_id(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.latest_id`."""
        return run_blocking(self.async_checkpointer.latest_id(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.newest_id)
    def newest_id(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.newest_id`."""
        return run_blocking(self.async_checkpointer.newest_id(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.list_checkpoints)
    def list_checkpoints(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.list_checkpoints`."""
        return run_blocking(self.async_checkpointer.list_checkpoints(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.delete_checkpoint)
    def delete_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.delete_checkpoint`."""
        return run_blocking(self.async_checkpointer.delete_checkpoint(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.dependents)
    def dependents(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.dependents`."""
        return run_blocking(self.async_checkpointer.dependents(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.save_partitions_concurrent)
    def save_partitions_concurrent(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.save_partitions_concurrent`."""
        return run_blocking(self.async_checkpointer.save_partitions_concurrent(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.take_over)
    def take_over(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.take_over`."""
        return run_blocking(self.async_checkpointer.take_over(*args, **kwargs))

    def save(self, data: CheckpointData) -> CheckpointManifest:
        """See :meth:`ObjectStoreCheckpointer.save`."""
        manifest = run_blocking(self.async_checkpointer.save(data))
        if self.async_checkpointer.retention is not None:
            _in_flight_at_exit.add(self)  # its retention GC runs on: let it end at exit
        return manifest

    def save_async(
        self, data: CheckpointData, *, copy: bool = False
    ) -> concurrent.futures.Future[CheckpointManifest]:
        """Start :meth:`save` in the background; returns a blocking future once ``data``
        is handed over.

        Blocks only while ``max_saves_in_flight`` saves are already running. The future's
        ``result()`` is the committed manifest, or raises the save's failure; a failure
        nobody took from the future is raised by the next :meth:`save_async`,
        :meth:`save`, :meth:`wait_for_saves` or :meth:`close`. At interpreter exit, saves
        still in flight are waited for (their failures are logged). Saves commit in call
        order, so ``_latest`` never moves backwards.

        The artifacts are read while the save runs, after this returns: do not change a
        buffer handed in until its future is done, or pass ``copy=True`` to have cairn
        copy every buffer before returning (files and streams are read in the background
        either way). (The blocking form of :meth:`ObjectStoreCheckpointer.save_async`.)

        Args:
            data: The checkpoint to save.
            copy: Copy every buffer of ``data`` before returning, so the caller may reuse
                them at once.

        Returns:
            The save's future; its ``result()`` is the committed manifest.

        Raises:
            SyncInAsyncContextError: Called from inside a running event loop.
        """
        future = _WatchedFuture()

        async def submit() -> None:  # on the loop thread: tasks are not thread-safe
            saves = self.async_checkpointer.background
            task = await saves.save_async(data, copy=copy, seen=future.seen)
            task.add_done_callback(future.take_outcome)

        run_blocking(submit())
        _in_flight_at_exit.add(self)
        return future

    @_twin_of(ObjectStoreCheckpointer.wait_for_saves)
    def wait_for_saves(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.wait_for_saves`."""
        return run_blocking(self.async_checkpointer.wait_for_saves(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.close)
    def close(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.close`."""
        return run_blocking(self.async_checkpointer.close(*args, **kwargs))

    def __enter__(self) -> Self:
        """The checkpointer itself: ``with SyncCheckpointer(...) as ckpt``."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """:meth:`close`: wait for the saves in flight and the retention GC.

        Saves in flight are waited for, never cancelled, also when the block raised (a
        second Ctrl-C stops the wait). A save failure nobody looked at is raised from
        here after a block that ended normally; after a block that raised, the block's
        exception goes on, and the save failure is logged and added to it as a note.
        """
        run_blocking(self.async_checkpointer.__aexit__(exc_type, exc, traceback))

    @_twin_of(ObjectStoreCheckpointer.load)
    def load(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load` (``progress`` is called on the
        checkpointer's event-loop thread)."""
        return run_blocking(self.async_checkpointer.load(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_latest)
    def load_latest(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_latest`."""
        return run_blocking(self.async_checkpointer.load_latest(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.commit)
    def commit(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.commit`."""
        return run_blocking(self.async_checkpointer.commit(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_chain)
    def load_chain(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_chain`."""
        return run_blocking(self.async_checkpointer.load_chain(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_key_groups)
    def load_key_groups(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_key_groups`."""
        return run_blocking(self.async_checkpointer.load_key_groups(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.restore_plan)
    def restore_plan(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.restore_plan`."""
        return run_blocking(self.async_checkpointer.restore_plan(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_assignment)
    def load_assignment(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_assignment`."""
        return run_blocking(self.async_checkpointer.load_assignment(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.gc)
    def gc(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.gc`."""
        return run_blocking(self.async_checkpointer.gc(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.list_checkpoint_dirs)
    def list_checkpoint_dirs(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.list_checkpoint_dirs`."""
        return run_blocking(self.async_checkpointer.list_checkpoint_dirs(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.load_manifests)
    def load_manifests(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.load_manifests`."""
        return run_blocking(self.async_checkpointer.load_manifests(*args, **kwargs))

    @_twin_of(ObjectStoreCheckpointer.restore_directory)
    def restore_directory(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`ObjectStoreCheckpointer.restore_directory`."""
        return run_blocking(self.async_checkpointer.restore_directory(*args, **kwargs))
