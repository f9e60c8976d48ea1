"""``CairnWriter``: DCP's ``StorageWriter`` on cairn. See :mod:`cairn.torch` for the design."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime as dt
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from cairn.checkpointer import ObjectStoreCheckpointer, PartitionUpload
from cairn.errors import CheckpointerError, InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.format.signing import SigningKey
from cairn.integrations._interface import (
    DEFAULT_LEASE,
    Entry,
    InFlight,
    SaveMeter,
    TwoPhaseSave,
    begin,
    is_int,
    upload_part,
)
from cairn.stores import PartsInFlight, capabilities_of
from cairn.torch._carry import Carried, Parent, carried_items, carry_for, open_parent
from cairn.torch._finish import commit_dcp, discard_uploads
from cairn.torch._format import rank_operator
from cairn.torch._itemtable import rank_items
from cairn.torch._rankobject import (
    OBJECT_BYTES,
    RANK_OBJECT_BYTES,
    Resolved,
    Written,
    rank_uploads,
)
from cairn.torch._runtime import StoreArg, known_paths, make_checkpointer, run, start, travels
from cairn.torch._target import Target, interpret, well_formed

__all__ = ["COPY_BUDGET", "CairnWriter"]

log = logging.getLogger("cairn")
T = TypeVar("T")

COPY_BUDGET = 256 << 20
"""Bytes of tensors that had to be copied (from a device, or made contiguous) that one
rank holds at once: past it, what is resolved so far is uploaded before resolving more."""


@dataclasses.dataclass(frozen=True)
class _PlanData:
    """What the coordinator tells every rank in the global plan: the checkpoint (its id
    and name), the rank, for an incremental save the parent's id and the first
    partition number the checkpoint's own artifacts take, how many ranks save, and
    whether the coordinator generated the id (a new UUIDv7, which no rank looks up)."""

    checkpoint_id: str
    rank: int
    name: str | None = None
    parent: str | None = None
    first_partition: int = 0
    ranks: int = 1
    generated: bool = False


class CairnWriter(StorageWriter):
    """A DCP ``StorageWriter`` that saves each ``dcp.save`` as one cairn checkpoint.

    Once a newer writer generation has taken over the store, a save is refused with
    :class:`~cairn.FencedError`. With a signing key, a :class:`CairnReader` given the
    key loads the checkpoint and refuses what someone without the key wrote.

    An incremental save builds on a parent DCP checkpoint: every item whose bytes
    (SHA-256), dtype and shape equal the parent's item of the same key (fully qualified
    name and chunk offsets) is carried by reference instead of uploaded, and the
    manifest names the parent. With no parent to build
    on, the save is a full one; an explicit ``parent`` that is not there raises
    :class:`~cairn.CheckpointNotFoundError`.

    Pickles (for ``dcp.async_save`` in process mode) unless its store is in memory.
    See :mod:`cairn.torch` for what is stored and what is guaranteed.

    Args:
        store: Anything :class:`~cairn.ObjectStoreCheckpointer` accepts (a URL, a plain
            path, an obstore store).
        epoch: Recorded in the manifest (the training step, say), >= 0.
        prefix: The checkpoint base inside the store; None (the default) is the
            store's root, or ``checkpoints/`` of a store that holds checkpoints only
            there, as :meth:`~cairn.ObjectStoreCheckpointer.resolve_paths` chooses.
        max_concurrent_uploads: Artifacts each rank uploads at once at most.
        compression: ``"zstd"`` stores artifacts compressed; None stores them raw.
        writer_generation: The generation this job holds after
            :meth:`~cairn.ObjectStoreCheckpointer.take_over` (0 if it never took over).
        lease: How long an interrupted save's uploads are protected from GC
            (docs/format.md, "Intents and leases").
        signing_key: The key, or keys, that sign the manifest (see
            :mod:`cairn.format.signing`).
        incremental: Build each save on a parent DCP checkpoint.
        parent: With ``incremental``: the parent, a checkpoint id or name (read as
            :meth:`reset` reads ``checkpoint_id``); None (the default) is the one
            :class:`CairnReader` would load as the latest.
        parts_in_flight: Parts of one rank object's multipart upload in flight at once
            (a :class:`~cairn.stores.PartsInFlight`, an int, or None: adaptive from 8,
            between 2 and 16; memory at most its ``maximum`` times 8 MiB beside the
            tensors); for a store cairn opens, not a :class:`~cairn.stores.Store` (see
            :class:`~cairn.ObjectStoreCheckpointer`).

    Raises:
        InvalidInputError: An argument is out of range, ``parent`` without
            ``incremental``, a ``parent`` that names nothing, or ``parts_in_flight``
            given with a :class:`~cairn.stores.Store`.
        CheckpointLocationError: ``parent`` is a location outside the store.
        CodecError: ``compression`` names no known or installed codec.
    """

    def __init__(
        self,
        store: StoreArg,
        *,
        epoch: int,
        prefix: str | None = None,
        max_concurrent_uploads: int = 8,
        compression: str | None = None,
        writer_generation: int = 0,
        lease: dt.timedelta = DEFAULT_LEASE,
        signing_key: SigningKey | Sequence[SigningKey] | None = None,
        incremental: bool = False,
        parent: CheckpointId | str | os.PathLike[str] | None = None,
        parts_in_flight: PartsInFlight | int | None = None,
    ) -> None:
        if parent is not None and not incremental:
            raise InvalidInputError("CairnWriter's parent= is for an incremental=True save")
        if not is_int(epoch) or epoch < 0:
            raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
        if not is_int(writer_generation) or writer_generation < 0:
            raise InvalidInputError(
                f"writer_generation must be an int >= 0, got {writer_generation!r}"
            )
        self._store = store
        self._settings: dict[str, Any] = {
            "max_concurrent_uploads": max_concurrent_uploads,
            "compression": compression,
            "lease": lease,
            "signing_key": signing_key,
            "parts_in_flight": parts_in_flight,
        }
        self._prefix = prefix
        self.epoch = epoch
        self.writer_generation = writer_generation
        self._ckpt: ObjectStoreCheckpointer | None = make_checkpointer(
            store, prefix, **self._settings
        )
        self.incremental = bool(incremental)
        self._parent: Target | None = (
            None
            if parent is None
            else interpret(parent, store, self._paths("CairnWriter"), "CairnWriter's parent")
        )
        self._built_on: CheckpointId | None = None
        self._requested: Target | None = None
        self._name: str | None = None
        self._pending: concurrent.futures.Future[TwoPhaseSave] | None = None
        """The coordinator's save begun (its lease taken), or still beginning."""
        self._meter: SaveMeter | None = None
        self._early: _EarlyUploads | None = None
        self._reset_save()

    def _reset_save(self) -> None:
        self._reset_lease()
        self._stop_early()
        self._meter = None
        self._is_coordinator = False
        self._rank = 0
        self._checkpoint_id: CheckpointId | None = None
        self._built_on = None
        self._save_id = str(uuid.uuid4())

    # -- pickling: the configuration travels, the store connection is made again ---------

    def __getstate__(self) -> dict[str, Any]:
        travels(self._store, "a CairnWriter")
        state = dict(self.__dict__)
        state["_ckpt"] = None
        state["_pending"] = None  # a lease is held by the process that took it
        state["_meter"] = None  # and a save is measured by the process that runs it
        state["_early"] = None  # as uploads run in the process that began them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def checkpointer(self) -> ObjectStoreCheckpointer:
        """The checkpointer this writer saves through (made on first use after unpickling)."""
        if self._ckpt is None:
            self._ckpt = make_checkpointer(self._store, self._prefix, **self._settings)
        self._ckpt.writer_generation = self.writer_generation
        return self._ckpt

    def _paths(self, what: str) -> CheckpointPaths:
        return known_paths(self.checkpointer, what)

    @property
    def checkpoint_id(self) -> CheckpointId | None:
        """The id of the checkpoint being saved (or last saved); None before planning."""
        return self._checkpoint_id

    @property
    def name(self) -> str | None:
        """The name of the checkpoint being saved (or last saved), if it was given one."""
        return self._name

    # -- StorageWriter -------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save; DCP passes the ``checkpoint_id`` given to ``dcp.save``.

        A checkpoint id (its text, or a :class:`~cairn.CheckpointId`) is the id the save
        commits under. Anything else (``step-100``, ``runs/a/step-100``, a path or URL
        inside this writer's store) is the checkpoint's *name*: the save commits a new
        checkpoint (a fresh UUIDv7) whose manifest records it, and a
        :class:`~cairn.torch.CairnReader` given the same ``checkpoint_id`` loads the
        newest checkpoint with that name. A location outside the store raises
        :class:`~cairn.CheckpointLocationError`. docs/pytorch.md has the whole
        mapping. Without a ``checkpoint_id``, each save gets a new id and no name.
        """
        self._requested = (
            None
            if checkpoint_id is None
            else interpret(
                checkpoint_id,
                self._store,
                self._paths("CairnWriter.reset"),
                "dcp.save's checkpoint_id",
            )
        )
        self._reset_save()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record this rank's role. (The parameter must be named ``kwargs``: DCP passes
        ``rank`` and ``use_collectives`` only to a method that has it.)"""
        if kwargs.get("use_collectives", True) is False:
            raise InvalidInputError(
                "CairnWriter needs dcp.save's use_collectives=True: one coordinator commits "
                "every rank's uploads as one checkpoint"
            )
        self._reset_save()
        self._is_coordinator = bool(is_coordinator)
        self._rank = int(kwargs.get("rank") or 0)

    def storage_meta(self) -> StorageMeta | None:
        """What DCP records of this save before it is planned: its save id."""
        return StorageMeta(save_id=self._save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Unchanged: the coordinator assigns the checkpoint id and the ranks."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Coordinator: choose the checkpoint id every rank uploads to, and take the lease.

        The id goes to every rank inside its plan (``storage_data``), so all ranks agree
        without another collective. From here to :meth:`finish` the coordinator holds
        the checkpoint's lease (renewed however long the ranks take). The save's
        statistics are measured from here (:meth:`finish` records them).

        The lease's intent and the fence read are written and read beside the ranks'
        uploads when the id is one this writer generates (a new UUIDv7, which no
        checkpoint holds) and the save builds on nothing: each rank writes an intent of
        its own beside its uploads (and does not look the id up), and the commit reads
        the fence again after the intent, so nothing waits for them. A writer fenced
        before the save began is then refused at :meth:`finish`, which removes what the
        ranks uploaded. An id given (which may be committed) and an incremental save
        (whose parent must be admitted by the fence read) are refused here, before
        anything is uploaded.
        """
        if not all(plan.usable for plan in plans):
            raise InvalidInputError(
                "CairnWriter needs a fresh global plan for every save (each save is a new "
                "checkpoint id): a planner with plan caching (enable_plan_caching=True) "
                "is not supported"
            )
        requested = self._requested
        cid = requested if isinstance(requested, CheckpointId) else CheckpointId.now()
        ckpt = self.checkpointer
        self._reset_lease()
        meter = SaveMeter()
        parent = self._open_parent(ckpt, meter)
        parent_id = parent.checkpoint_id if parent is not None else None
        generated = not isinstance(requested, CheckpointId)
        beginning = _counted(
            meter, functools.partial(begin, ckpt, cid, parent_id, generated=generated)
        )
        self._pending = start(beginning, "CairnWriter.prepare_global_plan")
        if not generated or parent is not None:
            pending = run(_outcome(self._pending), "CairnWriter.prepare_global_plan")
            if parent is not None and not pending.admits(parent.manifest):
                self._reset_lease()
                raise InvalidInputError(
                    f"parent {parent_id} was committed by a fenced writer after the "
                    "takeover: it is not one to build upon"
                )
        meter.uploading = time.perf_counter()
        self._meter = meter
        self._checkpoint_id = cid
        self._built_on = parent_id
        self._name = requested if isinstance(requested, str) else None
        return [
            dataclasses.replace(
                plan, storage_data=self._plan_data(cid, rank, len(plans), parent, generated)
            )
            for rank, plan in enumerate(plans)
        ]

    def _open_parent(self, ckpt: ObjectStoreCheckpointer, meter: SaveMeter) -> Parent | None:
        if not self.incremental:
            return None
        opening = _counted(meter, functools.partial(open_parent, ckpt, self._parent))
        parent = run(opening, "CairnWriter.prepare_global_plan")
        if parent is None:
            log.info("incremental save with no DCP checkpoint to build on: a full save")
        return parent

    def _plan_data(
        self, cid: CheckpointId, rank: int, ranks: int, parent: Parent | None, generated: bool
    ) -> _PlanData:
        if parent is None:
            return _PlanData(str(cid), rank, self._name, ranks=ranks, generated=generated)
        parent_id = str(parent.checkpoint_id)
        first = parent.first_partition
        return _PlanData(str(cid), rank, self._name, parent_id, first, ranks, generated)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Upload this rank's items into the checkpoint; their records.

        The items go into objects of ranges (:mod:`cairn.format.ranges`), as
        :func:`~cairn.torch._rankobject.split_into_objects` cuts them: a few objects of
        :data:`OBJECT_BYTES`, uploaded at once, each from one buffer, on an object store
        when the rank's share of the save allows; else one streamed object (one per
        :data:`RANK_OBJECT_BYTES`).
        Each item is resolved as the upload reaches it and hashed once. In an
        incremental save, the rank reads the parent's records of its items; the items
        the parent holds are first hashed (in parallel, at most :data:`COPY_BUDGET`
        bytes of copies at a time) and those equal to the parent's carried. With
        compression, each item is one frame of the checkpointer's codec in its object.
        The rank's store requests and retries travel to the coordinator in its
        results, for the save's statistics (a rank whose plan holds no item makes none).
        The coordinator returns once its objects' records are final (an object put
        whole: once hashed and joined), its puts still running: :meth:`finish` uploads
        DCP's metadata beside them and commits once they have ended.
        """
        data = plan.storage_data
        if not isinstance(data, _PlanData):
            raise InvalidInputError(
                f"the plan reached write_data without CairnWriter's global planning: {data!r}"
            )
        cid = CheckpointId.parse(data.checkpoint_id)
        self._checkpoint_id = cid
        self._name = data.name
        operator = rank_operator(data.rank)
        meter = SaveMeter()
        carry: dict[Any, Carried] = {}
        if data.parent is not None and plan.items:
            parent_id = CheckpointId.parse(data.parent)
            reading = _counted(
                meter, functools.partial(carry_for, self.checkpointer, parent_id, plan.items)
            )
            carry = run(reading, "CairnWriter.write_data")
        results = self._write_rank_objects(cid, operator, data, carry, plan, planner, meter)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write_rank_objects(
        self,
        cid: CheckpointId,
        operator: str,
        data: _PlanData,
        carry: dict[Any, Carried],
        plan: SavePlan,
        planner: SavePlanner,
        meter: SaveMeter,
    ) -> list[WriteResult]:
        """The rank's items carried (those equal to ``carry``'s) or uploaded as objects of
        ranges, the uploads' requests counted in ``meter``; their results."""
        results: list[WriteResult] = []
        items = list(plan.items)
        if carry:
            items = self._carry_equal(carry, items, planner, results)
        codec = self.checkpointer.codec
        first = data.first_partition
        sizes = (OBJECT_BYTES, RANK_OBJECT_BYTES)
        spread = capabilities_of(self.checkpointer.store).local_path is None
        uploads = rank_uploads(operator, items, planner, first, data.ranks, sizes, codec, spread)
        if uploads:
            sources = [u for u, _ in uploads]
            if self._is_coordinator:
                entries = self._upload_early(cid, sources, data.generated)
            else:
                upload = functools.partial(
                    upload_part, self.checkpointer, cid, sources, generated=data.generated
                )
                entries = run(_counted(meter, upload), "CairnWriter.write_data")
            for (_, source), entry in zip(uploads, entries, strict=True):
                results += source.results(operator, entry)
        return _as_rank_items(operator, plan.items, results, meter)

    def _upload_early(
        self, cid: CheckpointId, uploads: list[PartitionUpload], generated: bool
    ) -> list[Entry]:
        """The coordinator's own uploads, begun: their entries once all are final (an
        object put whole is, before its put is sent), the uploads left running for
        :meth:`finish` to await beside DCP's metadata, counted in the save's meter.

        DCP gives the coordinator its metadata only once every rank's ``write_data`` has
        returned: handing in its own records before its last puts end lets the
        metadata's upload, and the check of the other ranks' artifacts, overlap them."""
        ckpt = self.checkpointer
        if self._meter is None:  # a coordinator planned elsewhere (not DCP's sequence)
            self._meter = SaveMeter()
        meter = self._meter

        async def begun() -> tuple[list[Entry], asyncio.Task[list[Entry]]]:
            final: asyncio.Future[list[Entry]] = asyncio.get_running_loop().create_future()
            told: dict[int, Entry] = {}

            def announce(index: int, entry: Entry) -> None:
                told[index] = entry
                if len(told) == len(uploads) and not final.done():
                    final.set_result([told[i] for i in range(len(uploads))])

            with meter.counting():  # the task counts in the save's meter
                uploading = upload_part(ckpt, cid, uploads, announce=announce, generated=generated)
                task = asyncio.ensure_future(uploading)
            await asyncio.wait([final, task], return_when=asyncio.FIRST_COMPLETED)
            if not final.done():  # it ended before every entry was told: it failed
                return task.result(), task
            return final.result(), task

        entries, task = run(begun(), "CairnWriter.write_data")
        self._early = _EarlyUploads(entries, task)
        return entries

    def _stop_early(self) -> None:
        """Cancel the coordinator's uploads of a save DCP gave up before its commit (a
        cancelled upload removes what it wrote, and its intent)."""
        early, self._early = self._early, None
        if early is not None:
            run(_cancelled(early.task), "CairnWriter")

    def _carry_equal(
        self,
        carry: dict[Any, Carried],
        items: list[WriteItem],
        planner: SavePlanner,
        results: list[WriteResult],
    ) -> list[WriteItem]:
        """Carry the items equal to the parent's (their results appended to ``results``);
        the others, in plan order. Only items the parent holds are resolved here."""
        carried: set[Any] = set()
        window: list[tuple[WriteItem, Resolved]] = []
        held = 0

        def settle() -> None:
            matches = carried_items(
                [(carry.get(item.index), r.view, r.dtype, r.shape) for item, r in window]
            )
            for (item, resolved), match in zip(window, matches, strict=True):
                if match is not None:
                    results.append(WriteResult(item.index, resolved.view.nbytes, match))
                    carried.add(item.index)

        for item in items:
            if item.index not in carry:
                continue
            resolved = Resolved.of(item, planner.resolve_data(item))
            window.append((item, resolved))
            held += resolved.view.nbytes if resolved.copied else 0
            if held > COPY_BUDGET:
                settle()
                window, held = [], 0
        settle()
        return [item for item in items if item.index not in carried]

    def _reset_lease(self) -> None:
        """End the lease of a save that never reached its commit (DCP failed it)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            run(_end(pending), "CairnWriter")

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator: store DCP's metadata as an artifact, then commit the checkpoint.

        The manifest lists every rank's artifacts and the metadata's, with their
        SHA-256; it is written create-only (the commit), then ``_latest`` advances. A
        writer fenced meanwhile (or before the save began, when
        :meth:`prepare_global_plan` did not wait for the fence read) is refused
        (:class:`~cairn.FencedError`), nothing of the checkpoint stays committed, and
        what the ranks uploaded is removed (best effort; GC removes what is left). The
        manifest records the save's statistics (:class:`~cairn.format.manifest.SaveStats`),
        from :meth:`prepare_global_plan` to the commit point, every rank's requests and
        retries summed.
        """
        cid = self._checkpoint_id
        if cid is None:
            raise InvalidInputError("finish was called before CairnWriter planned the save")
        pending, self._pending = self._pending, None
        meter, self._meter = self._meter or SaveMeter(), None
        early, self._early = self._early, None
        ckpt = self.checkpointer

        async def commit() -> None:
            beside = InFlight(early.entries, early.task) if early is not None else None
            try:
                if pending is None:
                    save = await begin(ckpt, cid, self._built_on)
                else:
                    try:
                        save = await _outcome(pending)
                    except CheckpointerError:  # refused (or failed) beside the ranks' uploads
                        if early is not None:
                            await _cancelled(early.task)
                        await discard_uploads(ckpt, cid, results)
                        raise
                async with save:
                    epoch, save_id, name = self.epoch, self._save_id, self._name
                    await commit_dcp(
                        ckpt,
                        save,
                        epoch,
                        metadata,
                        results,
                        save_id,
                        name,
                        self._built_on,
                        meter,
                        beside,
                    )
            finally:  # ended already unless the commit failed first; either way, settled
                if early is not None:
                    await _cancelled(early.task)

        run(_counted(meter, commit), "CairnWriter.finish")
        self._requested = None  # an id or name given to one save is not reused by the next

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """True when :meth:`reset` accepts ``checkpoint_id``'s form: a checkpoint id, a
        name, or a well-formed URL or absolute path (which ``reset`` still refuses when
        it lies outside the writer's store, a thing a class method cannot know)."""
        return well_formed(checkpoint_id)


def _as_rank_items(
    operator: str, items: Sequence[WriteItem], results: list[WriteResult], meter: SaveMeter
) -> list[WriteResult]:
    """``results`` (one per item, each carrying its :class:`Written`) with the rank's
    :class:`RankItems` as every result's ``storage_data`` instead: what the coordinator
    stores as the rank's block of the chunk table (:mod:`cairn.torch._itemtable`), and
    the requests and retries ``meter`` counted."""
    written = []
    for result in results:
        data = result.storage_data
        assert isinstance(data, Written)  # made just above, by this rank
        written.append((result.index, data.record, data.operator, data.entry))
    requests, retries = meter.spent()
    summary = dataclasses.replace(
        rank_items(operator, items, written), requests=requests, retries=retries
    )
    return [WriteResult(r.index, r.size_in_bytes, summary) for r in results]


@dataclasses.dataclass(frozen=True)
class _EarlyUploads:
    """The coordinator's own uploads, handed in before they end: their entries (final)
    and the task uploading them, on cairn's event loop."""

    entries: list[Entry]
    task: asyncio.Task[list[Entry]]


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (if it has not ended) and wait for it to end, whatever it ends
    with; its failure counts as retrieved."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: its failure is the save's, already told or moot


async def _outcome(pending: concurrent.futures.Future[TwoPhaseSave]) -> TwoPhaseSave:
    """The save ``pending`` began, once it has (its error, if it failed)."""
    return await asyncio.wrap_future(pending)


async def _end(pending: concurrent.futures.Future[TwoPhaseSave]) -> None:
    """End the lease of the save ``pending`` began, once it has; a save that failed to
    begin ended its own lease and removed its intent."""
    try:
        save = await _outcome(pending)
    except Exception:  # the save is given up: why it failed no longer matters
        return
    await save.end()


async def _counted(meter: SaveMeter, call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()`` with ``meter`` counting its store requests and retries. (A call,
    not a coroutine: :func:`run` closes what it refuses to run, and a coroutine made for
    this one would be left unawaited.)"""
    with meter.counting():
        return await call()
