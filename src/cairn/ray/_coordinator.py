"""The coordinator of a streaming job on Ray: it runs the rounds and the epochs, holds
the writer generation, and restores the partition actors after a failure.

On its first call after it (re)starts, the coordinator takes over the store
(``take_over``: every earlier coordinator of the job, a zombie included, is fenced and
can commit nothing), starts as many partition actors as the latest checkpoint has
partitions (the job's ``workers`` when there is none), and restores them all from it.

An epoch, between two rounds: ``barrier(generation, epoch, id)`` to every partition
actor, which uploads its groups and reports; once every report is in, each actor is
asked to confirm (the token of the incarnation that reported must answer); then
``commit_distributed`` checks every report against the store, commits, and moves
``_latest``.

Invariants:

* rounds and epochs never overlap (one lock): a barrier is sent only when no record is in
  flight, so each checkpoint holds the state after exactly the records below its offsets;
* anything that fails in a round or an epoch (an actor killed before, during or after
  its upload, or before the commit; a report the store does not match) commits nothing
  for that epoch; the previous checkpoint stays latest, and every partition actor is
  restored from it (a global restart, as Flink does by default): state and offsets from
  one checkpoint, so the source replays exactly what was lost. The failed epoch's
  uploads are left in an uncommitted directory, which GC's orphan sweep removes;
* a partition actor that does not answer a call of a round or an epoch within the job's
  ``actor_timeout`` is killed and replaced, and its round or epoch fails as above
  (:class:`~cairn.ray.ActorTimeoutError`): a hung actor stalls the stream for at most
  that long, never for good. A restore is not bounded: it includes starting the actor;
* a coordinator fenced by a newer one (:class:`~cairn.FencedError`) stops: it neither
  commits nor restores;
* after ``max_failures`` failures in all the job gives up (:class:`JobFailedError`).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterable, Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayError

from cairn.errors import CheckpointerError, FencedError, IncompleteCheckpointError
from cairn.format.ids import CheckpointId
from cairn.format.manifest import SourceOffsetEntry
from cairn.integrations.distributed import WorkerReport, commit_distributed
from cairn.ray._runner import PartitionRunner
from cairn.ray._spec import (
    ActorTimeoutError,
    JobEvent,
    JobFailedError,
    JobSpec,
    JobStatus,
    open_checkpointer,
)

__all__ = ["Coordinator"]

_RemoteRunner = ray.remote(PartitionRunner)


def _values(answers: Iterable[Any]) -> list[Any]:
    """The answers, or the first of them that is an error, raised."""
    values = list(answers)
    for value in values:
        if isinstance(value, BaseException):
            raise value
    return values


async def _value(ref: Any) -> Any:
    return await ref


def _why(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1] if text else ''}"


class Coordinator:
    """The job's coordinator; made a Ray actor (with ``max_restarts``) by
    :class:`~cairn.ray.StreamJob`."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.lock = asyncio.Lock()
        self.ckpt: Any = None
        self.generation = 0
        self.workers = spec.workers
        self.epoch = 0
        self.latest: str | None = None
        self.actors: list[Any] = []
        self.committed: list[int] = []
        self.failures: list[str] = []
        self.restarts = 0
        self.restored: list[dict[str, Any]] = []
        self.records = 0
        self.dirty = False  # records read since the last commit or restore
        self.rounds_since = 0
        self.last_commit = time.monotonic()

    # -- the public calls (each one under the lock) -------------------------------------------

    async def status(self) -> JobStatus:
        """Where the job stands (starting it first, if this incarnation has not)."""
        async with self.lock:
            await self._start()
            return self._status()

    async def partition_actors(self) -> list[Any]:
        """The partition actors' handles, in partition order (without waiting for the
        round or epoch in progress)."""
        if self.ckpt is None:
            async with self.lock:
                await self._start()
        return list(self.actors)

    async def run(self, until: int | None) -> JobStatus:
        """Run rounds until every source partition is at offset ``until`` (None: until
        the source has no more records), checkpointing as the spec says, and once at the
        end; restore and go on after each failure."""
        while True:
            async with self.lock:
                await self._start()
                try:
                    read = await self._round(until)
                    finished = read == 0
                    if (finished and self.dirty) or (not finished and self._due()):
                        await self._checkpoint()
                except FencedError:
                    raise
                except (RayError, CheckpointerError) as exc:
                    await self._recover(exc)
                    continue
                if finished:
                    return self._status()

    async def checkpoint(self) -> JobStatus:
        """Checkpoint now, between two rounds; a failed epoch restores every partition
        actor from the latest checkpoint (the returned status says so)."""
        async with self.lock:
            await self._start()
            try:
                await self._checkpoint()
            except FencedError:
                raise
            except (RayError, CheckpointerError) as exc:
                await self._recover(exc)
            return self._status()

    async def rescale(self, workers: int) -> JobStatus:
        """Checkpoint, stop the partition actors, start ``workers`` new ones, restore
        each from its groups, and checkpoint again at the new parallelism."""
        async with self.lock:
            await self._start()
            await self._checkpoint_surely()
            self._stop_actors()
            self.workers = workers
            self._spawn()
            await self._restore_surely()
            self.dirty = True  # the first checkpoint at ``workers`` is taken even if idle
            await self._checkpoint_surely()
            return self._status()

    async def stop(self) -> JobStatus:
        """Stop the partition actors (nothing is checkpointed); a later call starts the
        job again, as a restart does."""
        async with self.lock:
            self._stop_actors()
            self.ckpt = None
            return self._status()

    # -- starting, restoring ----------------------------------------------------------------

    async def _start(self) -> None:
        if self.ckpt is not None:
            return
        ckpt, _ = open_checkpointer(self.spec)
        self.generation = await ckpt.take_over()
        self.ckpt = ckpt
        latest = await ckpt.latest_id()
        if latest is not None:
            manifest = await ckpt.load_manifest(latest)
            self.latest, self.epoch = str(latest), manifest.epoch
            partitions = manifest.operators[self.spec.operator].partitions
            self.workers = len({entry.partition_id for entry in partitions})
        self._spawn()
        await self._restore_surely()

    def _spawn(self) -> None:
        self.actors = [self._new_actor(worker) for worker in range(self.workers)]

    def _new_actor(self, worker: int) -> Any:
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0}
        options.update(self.spec.actor_options)
        return _RemoteRunner.options(**options).remote(self.spec, worker, self.workers)

    def _replace(self, worker: int) -> None:
        """Kill partition ``worker``'s actor for good and start another in its place."""
        ray.kill(self.actors[worker], no_restart=True)
        self.actors[worker] = self._new_actor(worker)

    async def _answers(self, call: str, refs: Sequence[Any], *, bounded: bool = True) -> list[Any]:
        """What each partition actor answered ``call`` (``refs[w]`` is partition ``w``'s
        call): its value or its error, once all have answered. With ``bounded``, one
        that has not answered within the spec's ``actor_timeout`` is an
        :class:`ActorTimeoutError`, and its actor is replaced."""
        waits = [asyncio.ensure_future(_value(ref)) for ref in refs]
        limit = self.spec.actor_timeout if bounded else None
        if waits:
            await asyncio.wait(waits, timeout=None if limit is None else limit.total_seconds())
        answers: list[Any] = []
        for worker, wait in enumerate(waits):
            if wait.done():
                error = wait.exception()
                answers.append(error if error is not None else wait.result())
                continue
            assert limit is not None  # without a limit, every wait is done
            wait.cancel()
            self._replace(worker)
            answers.append(ActorTimeoutError(worker, call, limit.total_seconds()))
        return answers

    def _stop_actors(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []

    async def _restore_all(self) -> None:
        refs = [a.restore.remote(self.generation, self.epoch, self.latest) for a in self.actors]
        # Not bounded by actor_timeout: a restore includes starting the actor (which may
        # wait for the cluster's resources) and reads its whole state.
        results = await self._answers("restore", refs, bounded=False)
        for worker, result in enumerate(results):
            if isinstance(result, ActorDiedError):  # Ray will not restart it: start another
                self.actors[worker] = self._new_actor(worker)
        self.restored = _values(results)
        self.dirty, self.rounds_since, self.last_commit = False, 0, time.monotonic()
        await self._tell(JobEvent("restored", self.epoch, checkpoint=self.latest))

    async def _restore_surely(self) -> None:
        while True:
            try:
                await self._restore_all()
                return
            except (RayError, CheckpointerError) as exc:
                self._failed(exc)
                await asyncio.sleep(min(0.05 * len(self.failures), 1.0))

    async def _recover(self, error: BaseException) -> None:
        self._failed(error)
        await self._tell(JobEvent("failed", self.epoch + 1, detail=_why(error)))
        self.restarts += 1
        await self._restore_surely()

    def _failed(self, error: BaseException) -> None:
        if isinstance(error, FencedError):
            raise error
        self.failures.append(_why(error))
        if len(self.failures) > self.spec.max_failures:
            raise JobFailedError(tuple(self.failures)) from error

    # -- rounds and epochs ------------------------------------------------------------------

    async def _round(self, until: int | None) -> int:
        n = len(self.actors)
        polls = [a.poll.options(num_returns=n + 1).remote(until) for a in self.actors]
        applies = [
            actor.apply.remote(*[polls[s][d] for s in range(n)])
            for d, actor in enumerate(self.actors)
        ]
        # The polls first, so that an apply waiting for a hung actor's poll is not taken
        # for hung itself.
        polled = await self._answers("poll", [p[n] for p in polls])
        counts = _values(polled + await self._answers("apply", applies))
        read = sum(counts[:n])
        self.records += read
        if read:
            self.dirty = True
            self.rounds_since += 1
        return int(read)

    def _due(self) -> bool:
        spec = self.spec
        if spec.every_rounds is not None and self.rounds_since >= spec.every_rounds:
            return True
        elapsed = time.monotonic() - self.last_commit
        return spec.interval is not None and elapsed >= spec.interval.total_seconds()

    async def _checkpoint(self) -> None:
        spec, epoch, cid = self.spec, self.epoch + 1, CheckpointId.now()
        await self._tell(JobEvent("barrier", epoch))
        refs = [a.barrier.remote(self.generation, epoch, str(cid)) for a in self.actors]
        results = await self._answers("barrier", refs)
        for worker, result in enumerate(results):
            if not isinstance(result, BaseException):
                await self._tell(JobEvent("reported", epoch, worker=worker))
        answers: list[dict[str, Any]] = _values(results)
        await self._tell(JobEvent("committing", epoch))
        tokens = _values(await self._answers("confirm", [a.confirm.remote() for a in self.actors]))
        for worker, (answer, token) in enumerate(zip(answers, tokens, strict=True)):
            if answer["incarnation"] != token:
                raise IncompleteCheckpointError(
                    f"partition {worker} restarted after it reported epoch {epoch}"
                )
        offsets = {name: str(n) for a in answers for name, n in a["offsets"].items()}
        source = spec.source
        await commit_distributed(
            self.ckpt,
            cid,
            epoch,
            [(spec.operator, worker) for worker in range(len(self.actors))],
            [WorkerReport.from_json(a["report"]) for a in answers],
            source_offsets={
                source.name: SourceOffsetEntry(source.source_type, offsets, epoch),
            },
        )
        self.epoch, self.latest = epoch, str(cid)
        self.committed.append(epoch)
        self.dirty, self.rounds_since, self.last_commit = False, 0, time.monotonic()
        await self._tell(JobEvent("committed", epoch, checkpoint=self.latest))

    async def _checkpoint_surely(self) -> None:
        while self.dirty or self.latest is None:
            try:
                await self._checkpoint()
            except (RayError, CheckpointerError) as exc:
                await self._recover(exc)
                if not self.dirty and self.latest is not None:
                    return  # restored: the latest checkpoint holds the state

    async def _tell(self, event: JobEvent) -> None:
        hook = self.spec.on_event
        if hook is None:
            return
        told = JobEvent(
            event.kind,
            event.epoch,
            event.worker,
            event.checkpoint,
            event.detail,
            tuple(self.actors),
        )
        result = hook(told)
        if inspect.isawaitable(result):
            await result

    def _status(self) -> JobStatus:
        return JobStatus(
            generation=self.generation,
            workers=self.workers,
            epoch=self.epoch,
            latest=self.latest,
            committed=tuple(self.committed),
            restarts=self.restarts,
            failures=tuple(self.failures),
            restored=tuple(self.restored),
            records=self.records,
        )
