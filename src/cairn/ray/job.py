"""A streaming job on Ray, from the driver: :class:`StreamJob` starts its coordinator
actor and calls it.

Every call goes to the coordinator, which Ray restarts (``coordinator_restarts`` times)
if its process dies: the call is then made again on the new incarnation, which takes
over the store first, fencing the one that died, and restores the partition actors from
the latest checkpoint. So a call returns once it is done, whatever died meanwhile, or
raises what the coordinator raised (:class:`~cairn.ray.JobFailedError` after too many
failures, :class:`~cairn.FencedError` when a newer coordinator of the same store took
over).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from cairn.errors import InvalidInputError
from cairn.format.keygroups import KeyGroups
from cairn.format.layout import CheckpointPaths, validate_name
from cairn.integrations._interface import is_int
from cairn.ray._coordinator import Coordinator
from cairn.ray._spec import EventHook, JobSpec, JobStatus
from cairn.ray.actor import PartitionActor, Source
from cairn.stores import Store

__all__ = ["StreamJob"]

_RemoteCoordinator = ray.remote(Coordinator)


def _at_least(name: str, value: int, least: int) -> int:
    if not is_int(value) or value < least:
        raise InvalidInputError(f"{name} must be an int >= {least}, got {value!r}")
    return value


class StreamJob:
    """A keyed streaming job on Ray: ``workers`` partition actors and one coordinator,
    its state checkpointed to ``store``, exactly-once through failures and rescaling.

    Needs a connected Ray (``ray.init``) before :meth:`start`. Use it as
    ``with StreamJob(...) as job:`` to start it and stop its actors at the end.

    Args:
        store: The store's URL (or a local directory's path), or a picklable function
            that opens the store in each actor (for a store that needs code to open).
        actor: The :class:`~cairn.ray.PartitionActor` subclass that holds a partition.
        source: The replayable source the job reads.
        workers: How many partition actors on a first start, >= 1 (a restart uses the
            latest checkpoint's number).
        key_groups: The key space, fixed for the life of the state (the most workers
            the job can ever have).
        operator: The name of the job's keyed state in its checkpoints.
        prefix: Where in the store the checkpoints are (``""``: the store's root).
        batch: Records each source partition gives in one round, >= 1.
        every_rounds: Checkpoint after this many rounds that read records (None: not by
            rounds).
        interval: Checkpoint when this long has passed since the last one, checked
            between rounds (None: not by time). With neither, checkpoints are taken on
            demand (:meth:`checkpoint`) and at the end of :meth:`run`.
        max_failures: How many failed rounds, epochs or restores the job survives in
            all before it raises :class:`~cairn.ray.JobFailedError`.
        coordinator_restarts: How many times Ray restarts a coordinator that died.
        actor_args: Positional arguments of ``actor``'s constructor.
        actor_kwargs: Keyword arguments of ``actor``'s constructor.
        actor_options: Ray options of the partition actors (``num_cpus``,
            ``resources``, ...); cairn's defaults are ``num_cpus=0``, ``max_restarts=-1``
            and ``max_task_retries=0``.
        on_event: Called in the coordinator with each :class:`~cairn.ray.JobEvent` of an
            epoch (it may be a coroutine function; the epoch waits for it).
        lease: How long an epoch's uploads hold their directory against GC after they
            end unless committed (the checkpointers' ``lease``); None: cairn's default.
        actor_timeout: How long the coordinator waits for a partition actor to answer
            one call of a round (poll, apply) or an epoch (barrier, which includes its
            upload, and confirm). An actor that does not answer in time is killed and
            replaced, and the round or epoch fails as if it had died
            (:class:`~cairn.ray.ActorTimeoutError`; an epoch commits nothing). A
            restore is not bounded: it includes starting the actor. None (the default):
            wait as long as it takes. Set it above the longest upload the job's state
            needs.

    Raises:
        InvalidInputError: An argument is out of range or of the wrong type.
    """

    def __init__(
        self,
        store: str | Callable[[], Store],
        actor: type[PartitionActor],
        source: Source,
        *,
        workers: int,
        key_groups: KeyGroups | None = None,
        operator: str = "state",
        prefix: str = "",
        batch: int = 1000,
        every_rounds: int | None = None,
        interval: dt.timedelta | None = None,
        max_failures: int = 10,
        coordinator_restarts: int = 3,
        actor_args: Sequence[Any] = (),
        actor_kwargs: Mapping[str, Any] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        on_event: EventHook | None = None,
        lease: dt.timedelta | None = None,
        actor_timeout: dt.timedelta | None = None,
    ) -> None:
        if not isinstance(store, str) and not callable(store):
            raise InvalidInputError(f"store must be a URL or a function, got {store!r}")
        if not (isinstance(actor, type) and issubclass(actor, PartitionActor)):
            raise InvalidInputError(f"actor must be a PartitionActor subclass, got {actor!r}")
        if not isinstance(source, Source):
            raise InvalidInputError(f"source must be a cairn.ray.Source, got {source!r}")
        key_groups = KeyGroups(128) if key_groups is None else key_groups
        if not isinstance(key_groups, KeyGroups):
            raise InvalidInputError(f"key_groups must be a KeyGroups, got {key_groups!r}")
        _at_least("workers", workers, 1)
        if workers > key_groups.count:
            raise InvalidInputError(
                f"workers must be at most the key-group count {key_groups.count}, got {workers}"
            )
        if every_rounds is not None:
            _at_least("every_rounds", every_rounds, 1)
        if interval is not None and (
            not isinstance(interval, dt.timedelta) or interval <= dt.timedelta(0)
        ):
            raise InvalidInputError(f"interval must be a positive timedelta, got {interval!r}")
        for name, value in (("lease", lease), ("actor_timeout", actor_timeout)):
            if value is not None and (
                not isinstance(value, dt.timedelta) or value <= dt.timedelta(0)
            ):
                raise InvalidInputError(f"{name} must be a positive timedelta, got {value!r}")
        self.spec = JobSpec(
            store=store,
            actor=actor,
            source=source,
            workers=workers,
            key_groups=key_groups,
            operator=validate_name("operator", operator),
            prefix=CheckpointPaths(prefix).base_prefix,
            batch=_at_least("batch", batch, 1),
            every_rounds=every_rounds,
            interval=interval,
            max_failures=_at_least("max_failures", max_failures, 0),
            actor_args=tuple(actor_args),
            actor_kwargs=dict(actor_kwargs or {}),
            actor_options=dict(actor_options or {}),
            on_event=on_event,
            lease=lease,
            actor_timeout=actor_timeout,
        )
        self.coordinator_restarts = _at_least("coordinator_restarts", coordinator_restarts, 0)
        self._coordinator: Any = None

    @property
    def coordinator(self) -> Any:
        """The coordinator's actor handle (after :meth:`start`)."""
        if self._coordinator is None:
            raise InvalidInputError("the job is not started: call start() first")
        return self._coordinator

    def start(self) -> JobStatus:
        """Start the coordinator; it takes over the store and restores the partition
        actors from the latest checkpoint (or starts them empty).

        Returns:
            The job's status after the restore.
        """
        if self._coordinator is None:
            self._coordinator = _RemoteCoordinator.options(
                num_cpus=0, max_restarts=self.coordinator_restarts, max_task_retries=0
            ).remote(self.spec)
        status: JobStatus = self._call("status")
        return status

    def run(self, until: int | None = None) -> JobStatus:
        """Process the source, checkpointing as configured and once at the end.

        Args:
            until: Stop when every source partition is at this offset (None: when the
                source has no more records).

        Returns:
            The job's status, its last checkpoint holding everything read.
        """
        if until is not None:
            _at_least("until", until, 0)
        status: JobStatus = self._call("run", until)
        return status

    def checkpoint(self) -> JobStatus:
        """Checkpoint now (between two rounds).

        Returns:
            The job's status: ``latest`` is the new checkpoint, or, if the epoch failed,
            still the previous one (the actors then restored from it).
        """
        status: JobStatus = self._call("checkpoint")
        return status

    def rescale(self, workers: int) -> JobStatus:
        """Checkpoint, stop the partition actors, start ``workers`` new ones, restore each
        from its key groups, re-split the source partitions, and checkpoint at the new
        parallelism.

        Args:
            workers: The new number of partition actors, 1 to the key-group count.

        Returns:
            The job's status.

        Raises:
            InvalidInputError: ``workers`` is out of range.
        """
        _at_least("workers", workers, 1)
        if workers > self.spec.key_groups.count:
            raise InvalidInputError(
                f"workers must be at most the key-group count {self.spec.key_groups.count}, "
                f"got {workers}"
            )
        status: JobStatus = self._call("rescale", workers)
        return status

    def status(self) -> JobStatus:
        """The job's status.

        Returns:
            Where the job stands.
        """
        status: JobStatus = self._call("status")
        return status

    def actors(self) -> list[Any]:
        """The partition actors' handles, in partition order (to kill one, say).

        Returns:
            The handles.
        """
        handles: list[Any] = self._call("partition_actors")
        return handles

    def stop(self) -> None:
        """Stop the partition actors and the coordinator; the checkpoints stay."""
        if self._coordinator is None:
            return
        with contextlib.suppress(RayActorError, ActorUnavailableError):  # they die with it
            ray.get(self._coordinator.stop.remote())
        ray.kill(self._coordinator, no_restart=True)
        self._coordinator = None

    def _call(self, method: str, *args: Any) -> Any:
        attempts = 0
        while True:
            try:
                return ray.get(getattr(self.coordinator, method).remote(*args))
            except (RayActorError, ActorUnavailableError):
                attempts += 1
                if attempts > self.coordinator_restarts:
                    raise
                time.sleep(0.2)  # Ray is restarting it; the call is made again

    def __enter__(self) -> StreamJob:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
