"""One simulated run: a store, actors running cairn's real code on it, and the oracle.

:func:`run` builds a :class:`World` from a seed: how many writers, what each saves
(full, incremental, through ``save_async``, or in two phases with workers), whether a
GC, a deleter, a copier and a takeover run beside them, and each actor's clock skew
(up to days either way). Every decision comes from the seed, so a run replays exactly.

The actors call the public API (and, for ``cairn copy``, the command line's copy
function) of one :class:`~cairn.ObjectStoreCheckpointer` each, as separate processes
would, on one :class:`~support.sim.store.SimStore`. When they have all ended or died, an
auditor with no faults loads every committed checkpoint and the latest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import logging
import random
import secrets
import time
import traceback
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    SourceOffsetEntry,
)
from cairn.cli.copy import copy_checkpoints
from cairn.cli.progress import Transfer
from cairn.errors import CheckpointerError
from cairn.format import ids as cairn_ids
from cairn.integrations.distributed import WorkerReport, commit_distributed, upload_partitions
from cairn.stores.retry import RetryPolicy

from .loop import Deadlock
from .mutants import mutated
from .oracle import Attempt, Expected, Oracle
from .scheduler import EPOCH, Actor, Faults, Killed, Scheduler
from .store import SimStore

__all__ = ["Outcome", "World", "run"]

LEASE = dt.timedelta(seconds=2)
RETRY = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.05)
KEYS = [("agg", 0), ("agg", 1), ("join", 0)]
SKEWS = [
    dt.timedelta(0),
    dt.timedelta(seconds=3),
    dt.timedelta(seconds=-3),
    dt.timedelta(hours=5),
    dt.timedelta(days=3),
    dt.timedelta(days=3),
    dt.timedelta(days=-3),
]
"""Local clock offsets an actor is drawn from (its skew from the store's clock)."""


@dataclass
class Outcome:
    """What one run found: its violations, its trace, and what happened in it (counts of
    commits, deletions, loads, faults; see :meth:`support.sim.oracle.Oracle.events`)."""

    seed: int
    violations: list[str]
    trace: list[str]
    steps: int
    events: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self, last: int = 80) -> str:
        lines = [f"seed {self.seed}: {len(self.violations)} violation(s) in {self.steps} steps"]
        lines += [f"  ! {v}" for v in self.violations[:10]]
        shown = self.trace[-last:]
        lines.append(f"trace (last {len(shown)} of {len(self.trace)} lines):")
        lines += [f"  {line}" for line in shown]
        lines.append(f"replay: python bench/simulate.py --seed {self.seed} --trace")
        return "\n".join(lines)


def _fixed_id(rng: random.Random, offset_ms: int) -> CheckpointId:
    """A valid UUIDv7 drawn from ``rng`` (an explicit id some writers share)."""
    ms = int(EPOCH.timestamp() * 1000) + offset_ms
    return CheckpointId(uuid.UUID(int=cairn_ids._pack(ms, rng.getrandbits(74))))


def derive(parent: Expected | None, data: CheckpointData) -> Expected:
    """What a save of ``data`` on ``parent`` holds once committed (cairn's chain rules)."""
    chains: dict[tuple[str, int], tuple[bytes, ...]] = dict(parent.chains) if parent else {}
    for key, body in data.snapshots.items():
        chains[key] = (bytes(body),)  # type: ignore[arg-type]
    for key, body in data.deltas.items():
        chains[key] = (*chains[key], bytes(body))  # type: ignore[arg-type]
    return Expected(chains, dict(data.source_offsets))


@dataclass
class World:
    """The parts of one run (see the module docstring)."""

    seed: int
    faults: Faults
    paths: CheckpointPaths = field(default_factory=CheckpointPaths)
    oracle: Oracle = field(init=False)
    scheduler: Scheduler = field(init=False)
    store: SimStore = field(init=False)
    target: SimStore = field(init=False)
    plan: random.Random = field(init=False)
    shared: list[CheckpointId] = field(init=False)
    crashes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.oracle = Oracle(self.paths)
        self.scheduler = Scheduler(self.seed, self.faults, self.oracle)
        self.store = SimStore(self.scheduler, "src")
        self.target = SimStore(self.scheduler, "dst")
        self.plan = random.Random(f"plan-{self.seed}")
        self.shared = [_fixed_id(self.plan, 10 + i) for i in range(2)]

    def checkpointer(self, store: SimStore | None = None) -> ObjectStoreCheckpointer:
        return ObjectStoreCheckpointer(
            store or self.store,
            self.paths,
            max_concurrent_uploads=2,
            max_concurrent_downloads=2,
            retry=RETRY,
            lease=LEASE,
            max_saves_in_flight=2,
        )

    def actor(self, name: str) -> Actor:
        return Actor(name, skew=self.plan.choice(SKEWS))

    # -- scripts -----------------------------------------------------------------------

    async def guard(self, name: str, step: Coroutine[Any, Any, Any]) -> Any:
        """Run one operation; a cairn error is an outcome, anything else a violation."""
        try:
            return await step
        except CheckpointerError:
            return None
        except (Killed, asyncio.CancelledError):
            raise
        except Exception as exc:
            frames = traceback.format_exception(exc)
            self.oracle.violations.append(
                f"step {self.oracle.step} ({name}): unexpected {exc!r}\n" + "".join(frames[-6:])
            )
            return None

    def data(
        self,
        rng: random.Random,
        name: str,
        k: int,
        epoch: int,
        cid: CheckpointId,
        parent: tuple[CheckpointId, Expected] | None,
    ) -> CheckpointData:
        def body(key: tuple[str, int]) -> bytes:
            return f"{name}/{k}/{key[0]}/{key[1]};".encode() * rng.randint(1, 12)

        offsets = {"src": SourceOffsetEntry("kafka", {"0": str(epoch * 10 + k)}, epoch)}
        if parent is not None and rng.random() < 0.7:
            parent_id, expected = parent
            keys = rng.sample(KEYS, rng.randint(1, len(KEYS)))
            deltas = {
                key: body(key) for key in keys if key in expected.chains and rng.random() < 0.6
            }
            snapshots = {key: body(key) for key in keys if key not in deltas}
            return CheckpointData(
                epoch,
                snapshots=snapshots,
                deltas=deltas,
                source_offsets=offsets,
                parent_id=parent_id,
                checkpoint_id=cid,
            )
        keys = rng.sample(KEYS, rng.randint(1, len(KEYS)))
        return CheckpointData(
            epoch,
            snapshots={key: body(key) for key in keys},
            source_offsets=offsets,
            checkpoint_id=cid,
        )

    def new_id(self, rng: random.Random, parent: CheckpointId | None = None) -> CheckpointId:
        """A fresh id, or (one time in four) one of the ids some writers share."""
        shared = [cid for cid in self.shared if cid != parent]
        if rng.random() < 0.25:
            return rng.choice(shared)
        return CheckpointId.now()

    async def writer(self, actor: Actor, saves: int, takes_over: bool, kind: str) -> None:
        rng = random.Random(f"{self.seed}-{actor.name}")
        ckpt = self.checkpointer()
        name = actor.name
        if takes_over:
            generation = await self.guard(name, ckpt.take_over())
            if generation is not None:
                self.oracle.takeover_ended(self.store, generation)
        epoch = rng.randint(1, 3)
        last: tuple[CheckpointId, Expected] | None = None
        running: list[tuple[Attempt, asyncio.Task[Any], CheckpointId]] = []
        for k in range(saves):
            epoch += rng.randint(0, 2)
            cid = self.new_id(rng, last[0] if last else None)
            if kind == "two-phase":
                await self.two_phase(actor, ckpt, rng, k, epoch, cid)
                continue
            data = self.data(rng, name, k, epoch, cid, last)
            parent_expected = last[1] if data.parent_id is not None and last else None
            expected = derive(parent_expected, data)
            attempt = self.oracle.save_started([name], self.store, cid, expected, data.parent_id)
            if kind == "save-async":
                task = await self.guard(name, ckpt.save_async(data))
                if task is None:
                    self.oracle.save_ended(attempt, None, "not started")
                    continue
                running.append((attempt, task, cid))
                last = (cid, expected)  # the next save may build on it before it commits
                continue
            manifest = await self.guard(name, ckpt.save(data))
            self.oracle.save_ended(attempt, manifest, "failed")
            if manifest is not None:
                last = (cid, expected)
        for attempt, task, _ in running:
            manifest = await self.guard(name, _await(task))
            self.oracle.save_ended(attempt, manifest, "failed")
        await self.guard(name, ckpt.close())

    async def two_phase(
        self,
        actor: Actor,
        ckpt: ObjectStoreCheckpointer,
        rng: random.Random,
        k: int,
        epoch: int,
        cid: CheckpointId,
    ) -> None:
        """A coordinator (``actor``) and two workers, each a process of its own."""
        keys = rng.sample(KEYS, rng.randint(2, len(KEYS)))
        bodies = {key: f"{actor.name}/2p{k}/{key};".encode() * rng.randint(1, 9) for key in keys}
        split = [keys[::2], keys[1::2]]
        workers = [self.actor(f"{actor.name}.w{i}") for i in range(2)]
        expected = Expected({key: (body,) for key, body in bodies.items()})
        names = [actor.name, *(w.name for w in workers)]
        attempt = self.oracle.save_started(names, self.store, cid, expected)
        reports: list[asyncio.Future[WorkerReport]] = []
        for worker, part in zip(workers, split, strict=True):
            report: asyncio.Future[WorkerReport] = asyncio.get_running_loop().create_future()
            reports.append(report)
            uploads = [(op, p, False, bodies[(op, p)]) for op, p in part]
            self.scheduler.spawn(worker, self._worker(worker, cid, uploads, report))
        try:
            done = await asyncio.wait_for(asyncio.gather(*reports), timeout=LEASE.total_seconds())
        except TimeoutError:
            self.oracle.save_ended(attempt, None, "a worker did not report")
            return
        manifest = await self.guard(
            actor.name,
            commit_distributed(ckpt, cid, epoch, list(bodies), done),
        )
        self.oracle.save_ended(attempt, manifest, "commit failed")

    async def _worker(
        self,
        actor: Actor,
        cid: CheckpointId,
        uploads: list[Any],
        report: asyncio.Future[WorkerReport],
    ) -> None:
        ckpt = self.checkpointer()
        result = await self.guard(
            actor.name, upload_partitions(ckpt, cid, uploads, worker=actor.name)
        )
        if result is not None and not report.done():
            report.set_result(result)

    async def gc(self, actor: Actor, runs: int) -> None:
        rng = random.Random(f"{self.seed}-{actor.name}")
        ckpt = self.checkpointer()
        for _ in range(runs):
            await asyncio.sleep(rng.uniform(0, 1.5))
            policy = RetentionPolicy(keep_last=rng.randint(1, 3))
            min_age = rng.choice([dt.timedelta(0), dt.timedelta(seconds=1), dt.timedelta(hours=1)])
            self.oracle.gc_started(actor.name, policy)
            await self.guard(actor.name, ckpt.gc(policy, min_age=min_age))
            self.oracle.gc_ended(actor.name)

    async def deleter(self, actor: Actor) -> None:
        rng = random.Random(f"{self.seed}-{actor.name}")
        ckpt = self.checkpointer()
        await asyncio.sleep(rng.uniform(0, 1.5))
        ids = await self.guard(actor.name, ckpt.list_checkpoints())
        if not ids:
            return
        cid = rng.choice(ids)
        force = rng.random() < 0.3
        self.oracle.delete_started(actor.name, cid, force)
        await self.guard(actor.name, ckpt.delete_checkpoint(cid, force=force))
        self.oracle.delete_ended(actor.name)

    async def reader(self, actor: Actor, reads: int) -> None:
        rng = random.Random(f"{self.seed}-{actor.name}")
        ckpt = self.checkpointer()
        for _ in range(reads):
            await asyncio.sleep(rng.uniform(0, 1.0))
            started = self.oracle.step
            try:
                loaded = await ckpt.load_latest()
            except CheckpointerError:
                continue
            if loaded is None:
                self.oracle.loaded_none(self.store, started)
            else:
                self.oracle.loaded(self.store, loaded, started, latest=True)

    async def taker(self, actor: Actor) -> None:
        rng = random.Random(f"{self.seed}-{actor.name}")
        await asyncio.sleep(rng.uniform(0, 1.5))
        await self.writer(actor, rng.randint(0, 1), takes_over=True, kind="save")

    async def copier(self, actor: Actor) -> None:
        rng = random.Random(f"{self.seed}-{actor.name}")
        source = self.checkpointer()
        target = self.checkpointer(self.target)
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        ids = await self.guard(actor.name, source.list_checkpoints())
        if not ids:
            return
        cid = rng.choice(ids)
        progress = Transfer(Console(file=io.StringIO()), "copy", None, enabled=False)
        self.oracle.copying(self.store, self.target, cid)
        await self.guard(actor.name, copy_checkpoints(source, target, [cid], progress))

    async def audit(self) -> None:
        """After the run: every committed checkpoint loads and holds what was saved."""
        for store in (self.store, self.target):
            ckpt = self.checkpointer(store)
            for cid in await ckpt.list_checkpoints():
                try:
                    loaded = await ckpt.load(cid)
                except CheckpointerError as exc:
                    if not self.oracle.broken_by_force(store, cid):
                        self.oracle.violations.append(
                            f"audit: committed {store.name}:{cid} does not load: {exc}"
                        )
                    continue
                self.oracle.loaded(store, loaded, self.oracle.step, latest=False)
            latest = await ckpt.load_latest()
            if latest is None:
                self.oracle.loaded_none(store, self.oracle.step + 1)
            else:
                self.oracle.loaded(store, latest, self.oracle.step + 1, latest=True)

    # -- the cast ----------------------------------------------------------------------

    def cast(self) -> list[tuple[Actor, Callable[[], Coroutine[Any, Any, None]]]]:
        plan = self.plan
        cast: list[tuple[Actor, Callable[[], Coroutine[Any, Any, None]]]] = []
        for i in range(plan.randint(1, 2)):
            actor = self.actor(f"writer{i}")
            saves = plan.randint(1, 3)
            takes_over = plan.random() < 0.3
            kind = plan.choices(["save", "save-async", "two-phase"], [5, 3, 2])[0]
            cast.append((actor, _bind(self.writer, actor, saves, takes_over, kind)))
        if plan.random() < 0.7:
            actor = self.actor("gc")
            cast.append((actor, _bind(self.gc, actor, plan.randint(1, 3))))
        if plan.random() < 0.3:
            actor = self.actor("deleter")
            cast.append((actor, _bind(self.deleter, actor)))
        if plan.random() < 0.25:
            actor = self.actor("taker")
            cast.append((actor, _bind(self.taker, actor)))
        if plan.random() < 0.2:
            actor = self.actor("copier")
            cast.append((actor, _bind(self.copier, actor)))
        actor = self.actor("reader")
        cast.append((actor, _bind(self.reader, actor, plan.randint(1, 3))))
        return cast


def _bind(
    function: Callable[..., Coroutine[Any, Any, None]], *args: Any, **kwargs: Any
) -> Callable[[], Coroutine[Any, Any, None]]:
    return lambda: function(*args, **kwargs)


async def _await(task: asyncio.Task[Any]) -> Any:
    return await task


@contextlib.contextmanager
def deterministic(world: World) -> Iterator[None]:
    """Make everything a run reads from outside the seed come from it: the local clocks
    (each actor's skewed one), the monotonic clock (the loop's), the random tokens and
    ids, and the retry jitter; and keep cairn's logging quiet."""
    entropy = random.Random(f"entropy-{world.seed}")
    scheduler = world.scheduler
    saved = (
        time.time_ns,
        time.perf_counter,
        secrets.randbits,
        secrets.token_hex,
        random.uniform,
        cairn_ids._generator,
    )

    def token_hex(nbytes: int | None = None) -> str:
        return entropy.randbytes(32 if nbytes is None else nbytes).hex()

    time.time_ns = scheduler.local_time_ns
    time.perf_counter = lambda: scheduler.loop.now
    secrets.randbits = entropy.getrandbits  # type: ignore[assignment]
    secrets.token_hex = token_hex
    random.uniform = entropy.uniform
    cairn_ids._generator = cairn_ids._MonotonicV7()
    logger = logging.getLogger("cairn")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
        (
            time.time_ns,
            time.perf_counter,
            secrets.randbits,
            secrets.token_hex,
            random.uniform,
            cairn_ids._generator,
        ) = saved


def run(seed: int, faults: Faults | None = None, mutant: str | None = None) -> Outcome:
    """Run the world of ``seed`` and audit it; the outcome with its trace. ``mutant``
    names a historical bug to bring back for the run (:mod:`support.sim.mutants`)."""
    world = World(seed, faults or Faults())
    with deterministic(world), mutated(mutant):
        play(world, world.cast(), world.audit)
    return outcome_of(world)


def play(
    world: World,
    cast: list[tuple[Actor, Callable[[], Coroutine[Any, Any, None]]]],
    audit: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    """Run ``cast`` on ``world``'s scheduler, then ``audit`` alone; a run that cannot go
    on (every task waiting for what never comes) is a violation, with its trace."""
    try:
        world.scheduler.run(cast)
        world.scheduler.run_auditor(Actor("auditor", faults=False), audit)
    except Deadlock as exc:
        world.oracle.violations.append(f"step {world.scheduler.step}: deadlock: {exc}")
    finally:
        world.scheduler.close()


def outcome_of(world: World) -> Outcome:
    """What a finished run of ``world`` found."""
    violations = world.oracle.violations + world.scheduler.errors
    events = dict(world.oracle.events)
    for step in world.scheduler.trace:
        for fault in ("crashed", "reply lost", "transient failure", "store clock", "frozen"):
            if fault in step.what:
                events[fault] = events.get(fault, 0) + 1
    trace = [str(step) for step in world.scheduler.trace]
    return Outcome(world.seed, violations, trace, world.scheduler.step, events)
