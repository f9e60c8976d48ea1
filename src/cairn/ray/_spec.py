"""What every actor of a streaming job on Ray is given: the job's spec, and how each one
opens its own checkpointer on the job's store.

Invariant: a spec is plain, picklable data; every actor (coordinator or partition) opens
its own store and checkpointer from it, so nothing of one process's I/O state travels to
another.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import CheckpointerError
from cairn.format.keygroups import KeyGroups
from cairn.format.layout import CheckpointPaths
from cairn.ray.actor import PartitionActor, Source
from cairn.stores import ForwardingStore, Store, StoreMethod, as_store, open_store

__all__ = [
    "ActorTimeoutError",
    "CountingStore",
    "JobEvent",
    "JobFailedError",
    "JobSpec",
    "JobStatus",
    "open_checkpointer",
]

T = TypeVar("T")


@dataclass(frozen=True)
class JobEvent:
    """One step of an epoch, told to the job's ``on_event`` in the coordinator.

    Attributes:
        kind: ``"barrier"`` (the barriers are about to be sent), ``"reported"``
            (``worker`` reported its uploads), ``"committing"`` (every report is in; the
            commit begins), ``"committed"``, ``"failed"`` (the epoch or round committed
            nothing; ``detail`` says why) or ``"restored"`` (every partition restored
            ``checkpoint``, or started empty when it is None).
        epoch: The epoch the step belongs to.
        worker: The partition that reported (``"reported"`` only).
        checkpoint: The checkpoint committed or restored, or None.
        detail: Why the epoch failed (``"failed"`` only).
        actors: The partition actors' handles at that moment, in partition order.
    """

    kind: str
    epoch: int
    worker: int | None = None
    checkpoint: str | None = None
    detail: str = ""
    actors: tuple[Any, ...] = ()


@dataclass(frozen=True)
class JobStatus:
    """Where a streaming job stands, as its coordinator sees it.

    Attributes:
        generation: The coordinator's writer generation (it took over the store with it).
        workers: How many partition actors run now.
        epoch: The epoch of the latest checkpoint (0: none yet).
        latest: The latest checkpoint's id, or None.
        committed: The epochs this coordinator committed, in order.
        restarts: How many times the partition actors were restored after a failure.
        failures: Why each failed epoch or round failed, in order.
        restored: What each partition actor read at its last restore: ``worker``,
            ``checkpoint``, ``groups`` (first, end), ``restored_groups``, ``bytes_read``.
        records: Records the actors read from the source (replays after a restore
            included).
    """

    generation: int
    workers: int
    epoch: int
    latest: str | None
    committed: tuple[int, ...]
    restarts: int
    failures: tuple[str, ...]
    restored: tuple[dict[str, Any], ...]
    records: int


class JobFailedError(CheckpointerError):
    """A streaming job gave up: more failures than its ``max_failures`` allow.

    Attributes:
        failures: Why each attempt failed, in order.
    """

    def __init__(self, failures: tuple[str, ...]) -> None:
        self.failures = failures
        last = failures[-1] if failures else "no failure recorded"
        super().__init__(f"the job failed {len(failures)} times; the last: {last}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures,))


class ActorTimeoutError(CheckpointerError):
    """A partition actor did not answer a call within the job's ``actor_timeout``.

    The coordinator kills that actor and starts another in its place; the round or epoch
    fails as if the actor had died (an epoch commits nothing), and every partition actor
    is restored from the latest checkpoint.

    Attributes:
        worker: The partition the actor holds.
        call: What it was asked (``"poll"``, ``"apply"``, ``"barrier"``, ``"confirm"``).
        seconds: How long the coordinator waited.
    """

    def __init__(self, worker: int, call: str, seconds: float) -> None:
        self.worker, self.call, self.seconds = worker, call, seconds
        super().__init__(
            f"partition {worker} did not answer its {call} within {seconds:g} s "
            "(actor_timeout): its actor was replaced"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.worker, self.call, self.seconds))


EventHook = Callable[[JobEvent], Awaitable[None] | None]


@dataclass(frozen=True)
class JobSpec:
    """Everything the coordinator and the partition actors are made from (see
    :class:`cairn.ray.StreamJob`, whose arguments these are)."""

    store: str | Callable[[], Store]
    actor: type[PartitionActor]
    source: Source
    workers: int
    key_groups: KeyGroups
    operator: str
    prefix: str
    batch: int
    every_rounds: int | None
    interval: dt.timedelta | None
    max_failures: int
    actor_args: tuple[Any, ...] = ()
    actor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    actor_options: Mapping[str, Any] = field(default_factory=dict)
    on_event: EventHook | None = None
    lease: dt.timedelta | None = None
    actor_timeout: dt.timedelta | None = None


class CountingStore(ForwardingStore):
    """Adds up the bytes every read returns: what a partition actor restored."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.bytes_read = 0

    async def _around(
        self, operation: StoreMethod, path: str, call: Callable[[], Awaitable[T]], **_: object
    ) -> T:
        result = await call()
        if operation == "get":
            self.bytes_read += memoryview(result.data).nbytes  # type: ignore[attr-defined]
        elif operation == "get_range":
            self.bytes_read += memoryview(result).nbytes  # type: ignore[arg-type]
        return result


def open_checkpointer(spec: JobSpec) -> tuple[ObjectStoreCheckpointer, CountingStore]:
    """A checkpointer of the job's store, in this process, and the store it reads through.

    Args:
        spec: The job.

    Returns:
        The checkpointer and its counting store.
    """
    raw = open_store(spec.store) if isinstance(spec.store, str) else spec.store()
    store = CountingStore(as_store(raw))
    if spec.lease is None:
        return ObjectStoreCheckpointer(store, CheckpointPaths(spec.prefix)), store
    return ObjectStoreCheckpointer(store, CheckpointPaths(spec.prefix), lease=spec.lease), store
