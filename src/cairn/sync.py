"""A blocking façade over the async checkpointer, for code without an event loop.

There is one implementation of every operation, the async one: each method here submits
the async call to cairn's private event loop, running on a daemon thread
(:mod:`cairn._blocking`), and waits for it.
Calling a method from a thread that is running an event loop raises
:class:`SyncInAsyncContextError` instead of deadlocking that loop; use the async API there.

The methods are written out (so that editors and type checkers see real signatures);
``tests/protocol/test_sync.py`` compares each with its async twin, so they cannot drift apart.
The constructor takes the async checkpointer's parameters, written once, there, and each
method's documentation is its async twin's, copied when the class is made
(:func:`_blocking_docs`), so ``help(SyncCheckpointer.save)`` says what ``save`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread
import datetime as dt
import functools
import inspect
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, BinaryIO, Concatenate, ParamSpec, Self, TypeVar, cast

from cairn._blocking import run_blocking
from cairn.checkpointer import ObjectStoreCheckpointer, PartitionUpload
from cairn.data import ChainLink, CheckpointData, LoadedCheckpoint
from cairn.data.inputs import ArtifactData
from cairn.errors import SyncInAsyncContextError
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest, FileEntry, PartitionSnapshotEntry
from cairn.protocol._download import RESTORE_CHUNK
from cairn.protocol.discover import ManifestOrDamage
from cairn.protocol.retention import GcResult, RetentionPolicy

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


_POINTER = re.compile(r"See :meth:`ObjectStoreCheckpointer\.(\w+)`[;.]?\s*")

_BLOCKING = (
    "Blocks until it is done (the work runs on cairn's private event loop; called inside "
    "a running event loop it raises :class:`SyncInAsyncContextError`: await the async "
    "method there)."
)


def _blocking_doc(method: str, async_doc: str, own: str) -> str:
    """The documentation of blocking ``method``: its async twin's, said of a blocking
    call, then what the method's own docstring adds after its pointer to the twin."""
    summary, _, body = inspect.cleandoc(async_doc).partition("\n")
    body = body.strip()
    body = re.sub(r"\bawait (:meth:`)", r"call \1", body)
    body = re.sub(r"\bAwait (:meth:`)", r"Call \1", body)
    extra = _POINTER.sub("", inspect.cleandoc(own), count=1).strip()
    parts = [summary.strip(), _BLOCKING, body, extra]
    twin = f"(The blocking form of :meth:`ObjectStoreCheckpointer.{method}`.)"
    return "\n\n".join(part for part in [*parts, twin] if part) + "\n"


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
        """A blocking façade over an existing async checkpointer."""
        façade = cls.__new__(cls)
        façade.async_checkpointer = checkpointer
        return façade

    @property
    def paths(self) -> CheckpointPaths:
        """The layout of the store: :meth:`resolve_paths`, so it reads the store on its
        first use when no ``paths`` was given."""
        return self.resolve_paths()

    def resolve_paths(self) -> CheckpointPaths:
        """See :meth:`ObjectStoreCheckpointer.resolve_paths`."""
        return run_blocking(self.async_checkpointer.resolve_paths())

    def save_manifest(self, manifest: CheckpointManifest) -> None:
        """See :meth:`ObjectStoreCheckpointer.save_manifest`."""
        run_blocking(self.async_checkpointer.save_manifest(manifest))

    def exists(self, checkpoint_id: CheckpointId | str) -> bool:
        """See :meth:`ObjectStoreCheckpointer.exists`."""
        return run_blocking(self.async_checkpointer.exists(checkpoint_id))

    def load_manifest(self, checkpoint_id: CheckpointId | str) -> CheckpointManifest:
        """See :meth:`ObjectStoreCheckpointer.load_manifest`."""
        return run_blocking(self.async_checkpointer.load_manifest(checkpoint_id))

    def save_snapshot(
        self, checkpoint_id: CheckpointId | str, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """See :meth:`ObjectStoreCheckpointer.save_snapshot`."""
        return run_blocking(
            self.async_checkpointer.save_snapshot(checkpoint_id, operator, partition, data)
        )

    def save_delta(
        self, checkpoint_id: CheckpointId | str, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """See :meth:`ObjectStoreCheckpointer.save_delta`."""
        return run_blocking(
            self.async_checkpointer.save_delta(checkpoint_id, operator, partition, data)
        )

    def load_artifact(self, path: str, *, expected_sha256: str | None = None) -> Buffer:
        """See :meth:`ObjectStoreCheckpointer.load_artifact`."""
        return run_blocking(
            self.async_checkpointer.load_artifact(path, expected_sha256=expected_sha256)
        )

    def load_artifact_to(
        self,
        path: str,
        dest: os.PathLike[str] | BinaryIO,
        *,
        expected_sha256: str | None = None,
        chunk_size: int = RESTORE_CHUNK,
        codec: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> str:
        """See :meth:`ObjectStoreCheckpointer.load_artifact_to` (``progress`` is called on
        the checkpointer's event-loop thread)."""
        return run_blocking(
            self.async_checkpointer.load_artifact_to(
                path,
                dest,
                expected_sha256=expected_sha256,
                chunk_size=chunk_size,
                codec=codec,
                progress=progress,
            )
        )

    def update_latest(self, checkpoint_id: CheckpointId | str, *, force: bool = False) -> bool:
        """See :meth:`ObjectStoreCheckpointer.update_latest`."""
        return run_blocking(self.async_checkpointer.update_latest(checkpoint_id, force=force))

    def read_latest(self) -> CheckpointId | None:
        """See :meth:`ObjectStoreCheckpointer.read_latest`."""
        return run_blocking(self.async_checkpointer.read_latest())

    def latest_id(self) -> CheckpointId | None:
        """See :meth:`ObjectStoreCheckpointer.latest_id`."""
        return run_blocking(self.async_checkpointer.latest_id())

    def list_checkpoints(self) -> list[CheckpointId]:
        """See :meth:`ObjectStoreCheckpointer.list_checkpoints`."""
        return run_blocking(self.async_checkpointer.list_checkpoints())

    def delete_checkpoint(self, checkpoint_id: CheckpointId | str, *, force: bool = False) -> None:
        """See :meth:`ObjectStoreCheckpointer.delete_checkpoint`."""
        run_blocking(self.async_checkpointer.delete_checkpoint(checkpoint_id, force=force))

    def dependents(self, checkpoint_id: CheckpointId | str) -> list[CheckpointId]:
        """See :meth:`ObjectStoreCheckpointer.dependents`."""
        return run_blocking(self.async_checkpointer.dependents(checkpoint_id))

    def save_partitions_concurrent(
        self,
        checkpoint_id: CheckpointId | str,
        uploads: Sequence[PartitionUpload],
        *,
        metadata_key: str | None = None,
    ) -> list[tuple[str, PartitionSnapshotEntry]]:
        """See :meth:`ObjectStoreCheckpointer.save_partitions_concurrent`."""
        return run_blocking(
            self.async_checkpointer.save_partitions_concurrent(
                checkpoint_id, uploads, metadata_key=metadata_key
            )
        )

    def take_over(self) -> int:
        """See :meth:`ObjectStoreCheckpointer.take_over`."""
        return run_blocking(self.async_checkpointer.take_over())

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
        """
        future = _WatchedFuture()

        async def submit() -> None:  # on the loop thread: tasks are not thread-safe
            saves = self.async_checkpointer.background
            task = await saves.save_async(data, copy=copy, seen=future.seen)
            task.add_done_callback(future.take_outcome)

        run_blocking(submit())
        _in_flight_at_exit.add(self)
        return future

    def wait_for_saves(self) -> None:
        """See :meth:`ObjectStoreCheckpointer.wait_for_saves`."""
        run_blocking(self.async_checkpointer.wait_for_saves())

    def close(self) -> None:
        """See :meth:`ObjectStoreCheckpointer.close`."""
        run_blocking(self.async_checkpointer.close())

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

    def load(
        self,
        checkpoint_id: CheckpointId | str,
        *,
        verify: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> LoadedCheckpoint:
        """See :meth:`ObjectStoreCheckpointer.load` (``progress`` is called on the
        checkpointer's event-loop thread)."""
        return run_blocking(
            self.async_checkpointer.load(checkpoint_id, verify=verify, progress=progress)
        )

    def load_latest(self) -> LoadedCheckpoint | None:
        """See :meth:`ObjectStoreCheckpointer.load_latest`."""
        return run_blocking(self.async_checkpointer.load_latest())

    def commit(self, manifest: CheckpointManifest) -> CheckpointManifest:
        """See :meth:`ObjectStoreCheckpointer.commit`."""
        return run_blocking(self.async_checkpointer.commit(manifest))

    def load_chain(
        self, checkpoint_id: CheckpointId | str, operator: str, partition: int
    ) -> list[ChainLink]:
        """See :meth:`ObjectStoreCheckpointer.load_chain`."""
        return run_blocking(self.async_checkpointer.load_chain(checkpoint_id, operator, partition))

    def gc(
        self,
        policy: RetentionPolicy,
        *,
        dry_run: bool = False,
        min_age: dt.timedelta = dt.timedelta(hours=1),
    ) -> GcResult:
        """See :meth:`ObjectStoreCheckpointer.gc`."""
        return run_blocking(self.async_checkpointer.gc(policy, dry_run=dry_run, min_age=min_age))

    def list_checkpoint_dirs(self) -> list[CheckpointId]:
        """See :meth:`ObjectStoreCheckpointer.list_checkpoint_dirs`."""
        return run_blocking(self.async_checkpointer.list_checkpoint_dirs())

    def load_manifests(self, ids: Sequence[CheckpointId | str]) -> list[ManifestOrDamage]:
        """See :meth:`ObjectStoreCheckpointer.load_manifests`."""
        return run_blocking(self.async_checkpointer.load_manifests(ids))

    def restore_directory(
        self,
        checkpoint_id: CheckpointId,
        operator: str,
        partition: int,
        dest: os.PathLike[str] | str,
    ) -> list[FileEntry]:
        """See :meth:`ObjectStoreCheckpointer.restore_directory`."""
        return run_blocking(
            self.async_checkpointer.restore_directory(checkpoint_id, operator, partition, dest)
        )
