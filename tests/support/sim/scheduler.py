"""The seeded scheduler: who runs next, and what the store does to each call.

Every store call of every actor waits in :attr:`Scheduler.pending` until the loop is
idle (every task blocked, see :mod:`support.sim.loop`). Then the scheduler draws, from
one seeded :class:`random.Random`, one of:

* complete a pending call, chosen among the actors not frozen: apply it and answer;
  or apply it and lose the reply (the caller hears a transient failure); or answer a
  transient failure without applying it; or crash its actor, before or after applying
  it (a process death: that actor's tasks never run again);
* freeze an actor for a number of steps (a GC pause, a slow VM): its calls wait while
  the others run;
* move the store's clock forwards (by seconds up to hours), as a long pause of every
  process would look to the store. A jump never lets a live actor's oldest pending call
  wait longer than :data:`MAX_STALL` of store time: the protocol's guarantee assumes no
  save stalls as long as a tombstone is kept (``cairn.protocol._lease.TOMBSTONE_RETENTION``);
* when no call is pending, move the loop's clock to the next timer.

Each applied call is a *step*: the oracle sees its effect before it happens and checks
the invariants after. The same seed gives the same choices, the same steps and the
same trace.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from cairn.errors import TransientStoreError

from .loop import Deadlock, SimLoop

if TYPE_CHECKING:
    from .oracle import Oracle
    from .store import SimStore

__all__ = ["ACTOR", "MAX_STALL", "Actor", "Faults", "Killed", "Scheduler"]

T = TypeVar("T")

EPOCH = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
"""The store's time when a simulation starts."""

UNIX_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

MAX_STALL = dt.timedelta(hours=20)
"""The longest a live actor's pending call may wait, in store time (see the module
docstring): below ``TOMBSTONE_RETENTION`` (one day)."""


class Killed(BaseException):
    """Raised into a dead actor's tasks when a run is torn down (never during a run:
    a dead actor's calls then simply never return)."""


@dataclass(eq=False)
class Actor:
    """One simulated process: its name, its local clock's offset from the store's, and
    whether it still runs."""

    name: str
    skew: dt.timedelta = dt.timedelta(0)
    alive: bool = True
    done: bool = False
    frozen_until: int = 0
    faults: bool = True
    """False for the auditor, which checks the store after the run."""


ACTOR: contextvars.ContextVar[Actor | None] = contextvars.ContextVar("sim_actor", default=None)
"""The actor whose task is running (every task an actor starts inherits it)."""


@dataclass(frozen=True)
class Faults:
    """How often each fault is drawn, per step (probabilities)."""

    crash: float = 0.004
    lost_reply: float = 0.02
    transient: float = 0.02
    freeze: float = 0.02
    clock_jump: float = 0.01
    commit_stall: float = 0.1
    """Of the manifest creates drawn, the share stalled right there (see
    :meth:`Scheduler._stall_at_commit`)."""
    latency: tuple[float, float] = (0.001, 0.05)
    """Virtual seconds an applied call takes (uniform)."""

    @classmethod
    def none(cls) -> Faults:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(eq=False)
class _Pending:
    seq: int
    actor: Actor
    store: SimStore
    operation: str
    path: str
    apply: Callable[[], Any]
    future: asyncio.Future[Any]
    issued: dt.datetime


@dataclass
class Step:
    """One line of a trace."""

    step: int
    actor: str
    what: str

    def __str__(self) -> str:
        return f"{self.step:5d} {self.actor:<10} {self.what}"


@dataclass
class Scheduler:
    """The scheduler of one simulated run (see the module docstring)."""

    seed: int
    faults: Faults
    oracle: Oracle
    rng: random.Random = field(init=False)
    loop: SimLoop = field(init=False)
    pending: list[_Pending] = field(default_factory=list)
    trace: list[Step] = field(default_factory=list)
    step: int = 0
    jump: dt.timedelta = dt.timedelta(0)
    errors: list[str] = field(default_factory=list)
    actors: list[Actor] = field(default_factory=list)
    unwinding: bool = False
    _seq: int = 0
    _settled: asyncio.Event | None = None
    _frozen_calls: list[asyncio.Future[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.loop = SimLoop(self._idle)
        self.loop.set_exception_handler(self._unhandled)
        self.loop.set_task_factory(self._task)
        self._tasks: list[tuple[asyncio.Task[Any], Actor | None]] = []

    # -- clocks ------------------------------------------------------------------------

    def store_time(self) -> dt.datetime:
        """The store's clock: the loop's virtual time, plus every jump drawn."""
        return EPOCH + dt.timedelta(seconds=self.loop.now) + self.jump

    def local_time_ns(self) -> int:
        """The running actor's local clock, in ns since the Unix epoch: the store's time
        plus its skew (the scheduler's own code sees the store's time)."""
        actor = ACTOR.get()
        skew = actor.skew if actor is not None else dt.timedelta(0)
        moment = self.store_time() + skew
        return (
            (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000
        )

    # -- what actors call -------------------------------------------------------------

    async def call(self, store: SimStore, operation: str, path: str, apply: Callable[[], T]) -> T:
        """A store call of the running actor: waits for the scheduler to decide it."""
        actor = ACTOR.get()
        if actor is None:
            raise RuntimeError(f"store call {operation} {path!r} outside any actor")
        future: asyncio.Future[T] = self.loop.create_future()
        if not actor.alive:
            if self.unwinding:
                raise Killed
            self._frozen_calls.append(future)  # a dead process sends nothing
        else:
            self._seq += 1
            self.pending.append(
                _Pending(self._seq, actor, store, operation, path, apply, future, self.store_time())
            )
        return await future

    # -- running -----------------------------------------------------------------------

    def run(self, actors: list[tuple[Actor, Callable[[], Coroutine[Any, Any, None]]]]) -> None:
        """Run every actor's script to its end or its death, then tear down."""
        self.actors = [actor for actor, _ in actors]

        async def main() -> None:
            self._settled = asyncio.Event()
            for actor, script in actors:
                context = contextvars.copy_context()
                context.run(ACTOR.set, actor)
                self.loop.create_task(self._script(actor, script), context=context)
            await self._settled.wait()

        try:
            self.loop.run_until_complete(main())
        finally:
            self._tear_down()

    async def _script(self, actor: Actor, script: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            await script()
        except (Killed, asyncio.CancelledError):
            raise
        except Exception as exc:
            self.errors.append(f"{actor.name} failed: {exc!r}")
        finally:
            actor.done = True
            self._check_settled()

    def spawn(self, actor: Actor, script: Coroutine[Any, Any, None]) -> None:
        """Start one more actor while the run goes on (a worker a coordinator starts); a
        dead actor's code starts nothing (a timer may still wake one of its tasks)."""
        parent = ACTOR.get()
        if parent is not None and not parent.alive:
            script.close()
            return
        self.actors.append(actor)
        context = contextvars.copy_context()
        context.run(ACTOR.set, actor)
        self.loop.create_task(self._script(actor, lambda: script), context=context)

    def _check_settled(self) -> None:
        if self._settled is not None and all(a.done or not a.alive for a in self.actors):
            self._settled.set()

    def run_auditor(self, actor: Actor, script: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run one more actor alone after the others, without faults."""
        self.unwinding = False
        self.actors = [actor]

        async def main() -> None:
            context = contextvars.copy_context()
            context.run(ACTOR.set, actor)
            await self.loop.create_task(script(), context=context)

        try:
            self.loop.run_until_complete(main())
        finally:
            self._tear_down()

    def _tear_down(self) -> None:
        """Let every task that is left end: the calls of dead actors raise :class:`Killed`
        (they reach no store), and unfinished tasks are cancelled."""
        self._unretrieved()
        self.unwinding = True
        for actor in self.actors:
            actor.alive = False
        for future in self._frozen_calls:
            if not future.done():
                future.set_exception(Killed())
        self._frozen_calls.clear()
        for pending in self.pending:
            if not pending.future.done():
                pending.future.set_exception(Killed())
        self.pending.clear()
        left = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self.unwinding = False

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def _task(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **options: Any
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **options)
        context = options.get("context")
        owner = context.get(ACTOR) if context is not None else ACTOR.get()
        self._tasks.append((task, owner))
        return task

    def _unretrieved(self) -> None:
        """Record every task of the run that failed with nobody looking (asyncio would
        say so when the task is garbage-collected, at a moment no seed decides)."""
        for task, owner in self._tasks:
            if task.done() and not task.cancelled() and getattr(task, "_log_traceback", False):
                exc = task.exception()  # retrieved: asyncio will not report it again
                if not isinstance(exc, Killed) and (owner is None or owner.alive):
                    name = owner.name if owner is not None else "?"
                    self.errors.append(f"a task of {name} failed and nobody looked: {exc!r}")
        self._tasks.clear()

    def _unhandled(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, Killed | asyncio.CancelledError) or self.unwinding:
            return
        if "never retrieved" in str(context.get("message")):
            return  # reported by _unretrieved, when the run ends
        self.errors.append(f"unhandled in a background task: {context.get('message')}: {exc!r}")

    # -- the one decision point --------------------------------------------------------

    def _idle(self, timeout: float | None) -> None:
        if self.unwinding:
            if timeout is None:
                raise Deadlock("tasks left at tear-down wait for nothing that can happen")
            self.loop.advance(timeout)
            return
        self.pending = [p for p in self.pending if not p.future.done()]
        ready = [p for p in self.pending if p.actor.frozen_until <= self.step] or self.pending
        if not ready:
            if timeout is None:
                raise Deadlock(
                    "every actor is blocked and no store call or timer can wake one: "
                    + ", ".join(a.name for a in self.actors if a.alive and not a.done)
                )
            self.loop.advance(timeout)
            return
        chosen = ready[self.rng.randrange(len(ready))]
        faults = self.faults if chosen.actor.faults else Faults.none()
        if self._stall_at_commit(chosen, faults, len({p.actor.name for p in ready})):
            return
        draw = self.rng.random()
        if draw < faults.freeze and len({p.actor.name for p in ready}) > 1:
            chosen.actor.frozen_until = self.step + self.rng.randint(3, 40)
            self._note(chosen.actor, f"-- frozen until step {chosen.actor.frozen_until}")
            return
        draw -= faults.freeze
        if draw < faults.clock_jump:
            self._jump_clock()
            return
        draw -= faults.clock_jump
        self.pending.remove(chosen)
        self.loop.advance(self.rng.uniform(*faults.latency))
        if draw < faults.crash:
            if self.rng.random() < 0.5:
                self._apply(chosen, answer=False)
            self._crash(chosen)
            return
        draw -= faults.crash
        if draw < faults.transient:
            self._note(
                chosen.actor,
                f"{chosen.operation} {chosen.store.name}:{chosen.path} -> transient failure",
            )
            chosen.future.set_exception(
                TransientStoreError(chosen.operation, chosen.path, "simulated transient failure")
            )
            return
        draw -= faults.transient
        self._apply(chosen, answer=draw >= faults.lost_reply)

    def _stall_at_commit(self, call: _Pending, faults: Faults, actors: int) -> bool:
        """Now and then stall a save right at its commit point, the create of its manifest,
        long enough for its lease to lapse (the interleaving the protocol's hardest rules
        are about); True when it did."""
        if (
            actors < 2
            or call.operation != "put"
            or not call.path.endswith("/manifest.json")
            or call.actor.frozen_until > self.step
            or self.rng.random() >= faults.commit_stall
        ):
            return False
        call.actor.frozen_until = self.step + self.rng.randint(20, 150)
        self._note(call.actor, f"-- stalled at its commit until step {call.actor.frozen_until}")
        self._jump_clock(at_least=dt.timedelta(seconds=5))
        return True

    def _apply(self, call: _Pending, *, answer: bool) -> None:
        self.step += 1
        self.oracle.acting = call.actor.name
        self.oracle.step = self.step
        failed: BaseException | None = None
        try:
            result = call.apply()
        except BaseException as exc:
            outcome, failed = f"raised {type(exc).__name__}", exc
        else:
            outcome = "ok"
        lost = "" if answer else " (reply lost)"
        self._note(call.actor, f"{call.operation} {call.store.name}:{call.path} -> {outcome}{lost}")
        if not answer:
            call.future.set_exception(
                TransientStoreError(call.operation, call.path, "simulated lost reply")
            )
        elif failed is not None:
            call.future.set_exception(failed)
        else:
            call.future.set_result(result)
        self.oracle.after_step(self)

    def _crash(self, call: _Pending) -> None:
        actor = call.actor
        actor.alive = False
        self._note(actor, "-- crashed")
        self._frozen_calls.append(call.future)
        for pending in [p for p in self.pending if p.actor is actor]:
            self.pending.remove(pending)
            self._frozen_calls.append(pending.future)
        self.oracle.on_crash(actor)
        self._check_settled()

    def _jump_clock(self, at_least: dt.timedelta = dt.timedelta(0)) -> None:
        now = self.store_time()
        oldest = min((p.issued for p in self.pending if p.actor.alive), default=now)
        room = MAX_STALL - (now - oldest)
        if room <= at_least:
            return
        span = self.rng.choice(
            [dt.timedelta(seconds=2), dt.timedelta(minutes=2), dt.timedelta(hours=2), room]
        )
        jump = max(at_least, min(span, room) * self.rng.random())
        self.jump += jump
        self._note(None, f"-- store clock +{jump.total_seconds():.0f}s")

    def _note(self, actor: Actor | None, what: str) -> None:
        self.trace.append(Step(self.step, actor.name if actor else "scheduler", what))
