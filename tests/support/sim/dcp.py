"""The simulator for the DCP writer and reader: one coordinator, two ranks.

Each save is DCP's own sequence of storage calls, as ``dcp.save`` makes them over a
process group, with each rank an actor of the simulation: both ranks plan locally, rank
1 sends its plan to rank 0 (the coordinator), which plans globally (``CairnWriter``
picks the checkpoint id and takes the lease) and sends rank 1 its part; both write their
items (``write_data``); rank 1 sends back its results and the coordinator commits
(``finish``). A crash of either rank, a lost reply or a stall can fall anywhere in that
sequence; a rank that hears nothing for a while gives the save up, as a collective that
times out would. Saves are incremental (a tensor equal to the parent's is carried);
beside them a GC collects and a reader loads the latest checkpoint through
``CairnReader`` and DCP's load planner. The oracle of :mod:`support.sim.oracle` judges
the store after every step, and what a reader loads must equal, bit for bit, the state
its save was given.

DCP's storage methods are synchronous and run cairn's coroutines by blocking on them
(``cairn.torch._runtime.run``). Here each rank runs them in a greenlet whose ``run``
hands the coroutine back to the rank's task, which awaits it on the simulated loop: the
same code, on one thread, in an order only the seed decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import random
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar, cast

import greenlet
import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.checkpoint.storage import WriteResult

from cairn import CheckpointId
from cairn.errors import CheckpointerError
from cairn.format.manifest import CheckpointManifest
from cairn.torch import CairnReader, CairnWriter, SafeLoadPlanner, _dcpdir, _reader, _writer

from ..dcp import ShardSavePlanner, raw, sharded
from .mutants import mutated
from .oracle import Expected
from .scheduler import Actor, Faults
from .world import LEASE, Outcome, World, deterministic, outcome_of, play

__all__ = ["run_dcp"]

T = TypeVar("T")
ROUNDS = 3
PATIENCE = 3.0
"""Virtual seconds a rank waits for the other before it gives the save up."""
SHAPES = {"frozen": (6, 4), "moving": (6, 4), "bias": (4,)}


async def in_greenlet(function: Callable[[], T]) -> T:
    """Run synchronous ``function`` in this task; each coroutine it blocks on (through
    :func:`_await_in_task`) is awaited here, on the simulated loop."""
    child = greenlet.greenlet(function)
    child.gr_context = contextvars.copy_context()
    value: Any = child.switch()
    while not child.dead:
        try:
            awaited = await value
        except BaseException as exc:
            value = child.throw(exc)
        else:
            value = child.switch(awaited)
    return cast(T, value)


def _await_in_task(coro: Coroutine[Any, Any, T], what: str = "") -> T:
    parent = greenlet.getcurrent().parent
    if parent is None:
        coro.close()
        raise RuntimeError(f"{what}: a simulated DCP call outside its rank's greenlet")
    return cast(T, parent.switch(coro))


def _start_in_loop(coro: Coroutine[Any, Any, T], what: str = "") -> asyncio.Future[T]:
    """What ``start`` does, on the simulated loop: ``coro`` as a task of it."""
    return asyncio.ensure_future(coro)


@contextlib.contextmanager
def _blocking_in_greenlets() -> Iterator[None]:
    modules: tuple[Any, ...] = (_writer, _reader, _dcpdir)
    saved = [module.run for module in modules]
    writer: Any = _writer
    started = writer.start
    for module in modules:
        module.run = _await_in_task
    writer.start = _start_in_loop
    try:
        yield
    finally:
        for module, run in zip(modules, saved, strict=True):
            module.run = run
        writer.start = started


def global_state(seed: int, round_: int) -> dict[str, torch.Tensor]:
    """The state saved in round ``round_``: ``frozen`` never changes (incremental saves
    carry it), ``moving`` changes every round, ``bias`` every other one."""
    generator = torch.Generator().manual_seed(seed * 1000 + round_)
    bias = torch.Generator().manual_seed(seed * 1000 + round_ // 2)
    return {
        "frozen": torch.arange(24, dtype=torch.float32).reshape(SHAPES["frozen"]),
        "moving": torch.rand(SHAPES["moving"], generator=generator),
        "bias": torch.rand(SHAPES["bias"], generator=bias),
    }


class _Mailbox:
    """Messages between the ranks, tagged with the round they belong to (a rank that gave
    a round up may still hear of it late)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def receive(self, round_: int) -> Any:
        async def matching() -> Any:
            while True:
                tag, message = await self.queue.get()
                if tag == round_:
                    return message

        return await asyncio.wait_for(matching(), PATIENCE)

    def send(self, round_: int, message: Any) -> None:
        self.queue.put_nowait((round_, message))


class DcpWorld(World):
    """A :class:`World` whose actors save and load through DCP."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.saved: dict[CheckpointId, int] = {}
        """The round whose state each committed checkpoint holds."""
        self.to_coordinator = _Mailbox()
        self.to_rank1 = _Mailbox()

    def new_writer(self) -> CairnWriter:
        return CairnWriter(
            self.store, epoch=1, prefix="", max_concurrent_uploads=2, lease=LEASE, incremental=True
        )

    async def rank(self, actor: Actor, rank: int) -> None:
        writer = self.new_writer()
        for round_ in range(ROUNDS):
            try:
                await self._save(actor, rank, writer, round_)
            except TimeoutError:
                continue  # the other rank went quiet: DCP's collective fails this save
            except CheckpointerError:
                continue

    async def _save(self, actor: Actor, rank: int, writer: CairnWriter, round_: int) -> None:
        planner = ShardSavePlanner()
        writer.epoch = round_ + 1
        shard = sharded(global_state(self.seed, round_), 2, rank)

        def plan_locally() -> SavePlan:
            writer.reset()
            planner.set_up_planner(shard, writer.storage_meta(), rank == 0)
            writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
            return writer.prepare_local_plan(planner.create_local_plan())

        local = await in_greenlet(plan_locally)
        if rank == 1:
            self.to_coordinator.send(round_, local)
            plan = await self.to_rank1.receive(round_)
            results = await in_greenlet(
                lambda: writer.write_data(planner.finish_plan(plan), planner).value()
            )
            self.to_coordinator.send(round_, results)
            return
        remote = await self.to_coordinator.receive(round_)

        def plan_globally() -> tuple[list[SavePlan], Metadata]:
            plans, metadata = planner.create_global_plan([local, remote])
            return writer.prepare_global_plan(plans), metadata

        plans, metadata = await in_greenlet(plan_globally)
        cid = writer.checkpoint_id
        assert cid is not None
        attempt = self.oracle.save_started(
            [actor.name, "rank1"], self.store, cid, Expected({}), writer._built_on
        )
        attempt.leased = True
        attempt.parent_named = self.oracle.parent_objects(self.store, writer._built_on)
        self.to_rank1.send(round_, plans[1])
        try:
            mine = await in_greenlet(
                lambda: writer.write_data(planner.finish_plan(plans[0]), planner).value()
            )
            theirs: list[WriteResult] = await self.to_coordinator.receive(round_)
            await in_greenlet(lambda: writer.finish(metadata, [mine, theirs]))
        except (TimeoutError, CheckpointerError) as exc:
            self.oracle.save_ended(attempt, None, repr(exc))
            raise
        self.saved[cid] = round_
        self.oracle.save_ended(attempt, cast(CheckpointManifest, True), "")

    async def dcp_reader(self, actor: Actor, reads: int) -> None:
        rng = random.Random(f"{self.seed}-{actor.name}")
        for _ in range(reads):
            await asyncio.sleep(rng.uniform(0, 2.0))
            reader = CairnReader(self.store, prefix="")
            try:
                state = await in_greenlet(functools.partial(_load, reader))
            except CheckpointerError:
                continue
            cid = reader.checkpoint_id
            assert cid is not None
            self.oracle.events["load_latest returned a checkpoint"] += 1
            self._check_loaded(cid, state)

    def _check_loaded(self, cid: CheckpointId, state: dict[str, torch.Tensor]) -> None:
        round_ = self.saved.get(cid)
        candidates = [round_] if round_ is not None else list(range(ROUNDS))
        for candidate in candidates:
            saved = global_state(self.seed, candidate)
            if all(torch.equal(raw(state[fqn]), raw(saved[fqn])) for fqn in SHAPES):
                return
        self.oracle.violations.append(
            f"step {self.oracle.step} (dcp-reader): loaded {cid}, whose tensors equal no "
            f"state saved under it (round {round_})"
        )

    def cast(self) -> list[tuple[Actor, Callable[[], Coroutine[Any, Any, None]]]]:
        rank0, rank1 = self.actor("rank0"), self.actor("rank1")
        cast_: list[tuple[Actor, Callable[[], Coroutine[Any, Any, None]]]] = [
            (rank0, lambda: self.rank(rank0, 0)),
            (rank1, lambda: self.rank(rank1, 1)),
        ]
        if self.plan.random() < 0.7:
            gc = self.actor("gc")
            cast_.append((gc, lambda: self.gc(gc, self.plan.randint(1, 2))))
        reader = self.actor("reader")
        cast_.append((reader, lambda: self.dcp_reader(reader, self.plan.randint(1, 3))))
        return cast_

    async def audit(self) -> None:
        """After the run: every committed DCP checkpoint loads and holds its state."""
        for cid in await self.checkpointer().list_checkpoints():
            reader = CairnReader(self.store, checkpoint_id=cid, prefix="")
            try:
                state = await in_greenlet(functools.partial(_load, reader))
            except CheckpointerError as exc:
                self.oracle.violations.append(f"audit: DCP checkpoint {cid} does not load: {exc}")
                continue
            self._check_loaded(cid, state)


def _load(reader: CairnReader) -> dict[str, torch.Tensor]:
    """``dcp.load`` of one process through ``reader``, as DCP makes the storage calls; the
    state loaded."""
    state = {fqn: torch.zeros(shape) for fqn, shape in SHAPES.items()}
    metadata = reader.read_metadata()
    reader.set_up_storage_reader(metadata, True)
    planner = SafeLoadPlanner()
    planner.set_up_planner(state, metadata, True)
    local = reader.prepare_local_plan(planner.create_local_plan())
    plans = reader.prepare_global_plan(planner.create_global_plan([local]))
    reader.read_data(planner.finish_plan(plans[0]), planner).wait()
    return state


def run_dcp(seed: int, faults: Faults | None = None, mutant: str | None = None) -> Outcome:
    """Run the DCP world of ``seed`` and audit it (see :func:`support.sim.world.run`)."""
    world = DcpWorld(seed, faults or Faults())
    with deterministic(world), mutated(mutant), _blocking_in_greenlets():
        play(world, world.cast(), world.audit)
    return outcome_of(world)
