"""The ways to save: each runs the steps of the commit protocol in order.

The protocol, its steps and why each is where it is, is written down once, in
:mod:`cairn.protocol._commit`. Here are the ways through it: a save in one call
(:func:`save`); a save in two phases (:func:`start`, :func:`begin` and
:class:`PendingSave`: its uploads and its commit are separate calls, or processes); the
parts of a save that only upload (:func:`upload_partitions`, :func:`upload_write_once`),
whose commit comes from elsewhere; and the manifest of what was uploaded
(:func:`assemble_manifest`).

Invariants: every way writes its intent before it reads the fence (step 1) and checks
the preconditions before its commit (step 2; a save in two phases before it uploads
anything, a save in one call beside its last check of the artifacts, its intent and
uploads at once), uploads with names of its own attempt (step 3), and commits through
:func:`cairn.protocol._commit.commit_and_publish` (steps 4 and 5); one that fails before
its commit removes what its attempt uploaded, and its intent (best effort).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import cast

import msgspec

from cairn.data import ArtifactKey, CheckpointData, DirectoryCheck
from cairn.data.keyed import KeyedSnapshot
from cairn.errors import CheckpointerError, CheckpointExistsError, InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.layout import new_attempt
from cairn.format.manifest import (
    CheckpointManifest,
    DirectoryEntry,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SourceOffsetEntry,
)
from cairn.observe import _dispatch
from cairn.protocol import _catalog, _chains, _commit, _directories, _lease, _pointer, _upload
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context, check_id
from cairn.protocol._meter import SaveMeter

__all__ = [
    "InFlight",
    "PendingSave",
    "assemble_manifest",
    "begin",
    "save",
    "start",
    "upload_all",
    "upload_partitions",
    "upload_write_once",
]


@dataclasses.dataclass(frozen=True)
class InFlight:
    """Artifacts of a checkpoint that another task of this process is still uploading:
    their entries, final already (announced: see
    :func:`cairn.protocol._upload.upload_partitions`), and ``ended``, which returns once
    that upload has ended (raising what it raised)."""

    entries: Sequence[_upload.Entry]
    ended: Awaitable[object]


class PendingSave:
    """A save of one checkpoint that has begun (steps 1 and 2) and not ended.

    It holds the lease (renewed) until :meth:`commit` or :meth:`end`; its uploads run
    under it. ``record`` is the writer record its preconditions read (None for a part of
    a save that only uploads); ``parent_id`` the parent its lease names, the one checkpoint
    :meth:`upload_directories` carries files from.
    """

    def __init__(
        self,
        ctx: Context,
        checkpoint_id: CheckpointId,
        record: _pointer.WriterRecord | None,
        lease: _lease.Lease,
        parent_id: CheckpointId | None = None,
    ) -> None:
        self.ctx = ctx
        self.checkpoint_id = checkpoint_id
        self.record = record
        self.parent_id = parent_id
        self._lease = lease
        # What a check ahead of the commit found: the writer record it read, and the
        # artifacts it covers, with those uploaded beside it (see upload's ``ahead``).
        self._checked: tuple[_pointer.WriterRecord, frozenset[tuple[str, str]]] | None = None

    @property
    def intent(self) -> str:
        """The intent this save's lease renews (its own: see :meth:`CheckpointPaths.intent`)."""
        return self._lease.path

    async def written(self) -> None:
        """Return once the intent is written (raise what its write raised)."""
        await self._lease.written()

    async def read_latest(self) -> None:
        """Read ``_latest`` now, unless this save's context holds a version of it: the
        swap after the commit then needs no read of its own (call it beside an upload)."""
        hint = self.ctx.hints.latest
        if not hint.known:
            await _pointer.read_latest(self.ctx.store, self.ctx.paths.latest_pointer(), hint)

    async def upload(
        self,
        uploads: Sequence[_upload.PartitionUpload],
        metadata_key: str | None = None,
        attempt: str | None = None,
        ahead: CheckpointManifest | None = None,
        beside: InFlight | None = None,
    ) -> list[_upload.Entry]:
        """Step 3 for checked ``uploads``, as ``attempt`` (by default a new one); their
        entries. A failure ends the save: its objects and its intent are removed.

        ``ahead``: a manifest of this checkpoint naming what was uploaded before (by
        this process or others). Step 4's check before the create runs for it beside
        these uploads (:func:`cairn.protocol._commit.check_ahead`), so that a commit of
        a manifest naming no more than those and these creates at once; the check after
        the create covers these uploads too. ``beside``: uploads of this checkpoint
        still running elsewhere in this process, awaited with these (their failure is
        this call's): they count as these do, uploaded last, which the check after the
        create covers."""
        attempt = attempt if attempt is not None else new_attempt()
        try:
            # Every part ends before a failure is raised: the removal of this attempt's
            # objects must come after its last put, not race it.
            uploaded, checked, ended = await asyncio.gather(
                _upload.upload_partitions(
                    self.ctx, self.checkpoint_id, uploads, attempt, metadata_key
                ),
                _nothing() if ahead is None else _commit.check_ahead(self.ctx, ahead),
                _nothing() if beside is None else beside.ended,
                return_exceptions=True,
            )
            for outcome in (uploaded, ended, checked):
                if isinstance(outcome, BaseException):
                    raise outcome
        except BaseException:
            await self.abandon(uploads, attempt)
            raise
        entries = cast(list[_upload.Entry], uploaded)
        record = cast(_pointer.WriterRecord | None, checked)
        if ahead is not None and record is not None:
            last = [*entries, *(beside.entries if beside is not None else ())]
            covered = {_stored(owner, relative) for owner, relative, _ in ahead.stored_objects()}
            covered |= {_stored(None, entry.path) for _, entry in last}
            self._checked = (record, frozenset(covered))
        return entries

    async def upload_directories(
        self, directories: Mapping[ArtifactKey, Path], check: DirectoryCheck = "mtime"
    ) -> tuple[DirectoryEntry, ...]:
        """Step 3 for checked directory partitions (:mod:`cairn.protocol._directories`), as a new
        attempt; their entries. A file that the parent's partition of the same key holds
        (decided by ``check``) is carried from it; partitions ``directories`` does not
        name are not carried (the caller assembles the manifest). A parent that the
        writer record does not admit is refused before any file is read or sent. A
        failure ends the save: its objects and its intent are removed."""
        attempt = new_attempt()
        try:
            parent = None
            if self.parent_id is not None:
                parent = await _catalog.load_manifest(self.ctx, self.parent_id)
                if self.record is not None:
                    _chains.check_admitted(parent, self.record)
            return await _directories.upload_directories(
                self.ctx, self.checkpoint_id, directories, parent, check, attempt
            )
        except BaseException:
            await self.abandon([], attempt)
            raise

    async def abandon(
        self, uploads: Sequence[_upload.PartitionUpload], attempt: str, packs: int = 0
    ) -> None:
        """End the save as failed: stop the lease, remove ``attempt``'s objects for
        ``uploads``, its ``packs`` packs and its intent (best effort)."""
        await self._lease.stop()
        await _upload.discard_attempt(
            self.ctx, self.checkpoint_id, uploads, attempt, packs, self._lease.path
        )

    async def commit(
        self,
        manifest: CheckpointManifest,
        finish: Callable[[CheckpointManifest], CheckpointManifest] | None = None,
        discard: _commit.Discard | None = None,
        parent: CheckpointManifest | None = None,
        before_create: Callable[[], Awaitable[None]] | None = None,
    ) -> CheckpointManifest:
        """Steps 4 and 5 for ``manifest`` (of this checkpoint); the committed manifest.

        ``finish``, ``discard``, ``parent`` and ``before_create`` are those of
        :func:`cairn.protocol._commit.commit_and_publish`. The lease is renewed until the
        create has happened, and ends with the commit either way.
        """
        if manifest.checkpoint_id != self.checkpoint_id:
            raise InvalidInputError(
                f"manifest of {manifest.checkpoint_id} given to the save of {self.checkpoint_id}"
            )
        checked = None
        if self._checked is not None:
            record, covered = self._checked
            stored = (_stored(owner, relative) for owner, relative, _ in manifest.stored_objects())
            if all(key in covered for key in stored):
                checked = record
        try:
            return await _commit.commit_and_publish(
                self.ctx, manifest, self._lease, finish, discard, parent, before_create, checked
            )
        finally:
            await self._lease.stop()

    async def end(self) -> None:
        """Stop renewing the lease (idempotent; after a commit, nothing to do): the
        intent stays, and lapses a lease from its last renewal."""
        await self._lease.stop()


async def start(
    ctx: Context,
    cid: CheckpointId,
    parent_id: CheckpointId | None = None,
    *,
    commits: bool = True,
    generated: bool = False,
) -> PendingSave:
    """Begin a save of ``cid`` building on ``parent_id``: the lease, and beside its
    intent's write :func:`cairn.protocol._commit.preconditions` (not whether the id is
    committed when it was ``generated`` here: a new UUIDv7 cannot be). The caller ends
    it (:meth:`PendingSave.commit` or :meth:`PendingSave.end`); one it drops stops
    renewing when it is garbage-collected.

    The fence read beside the intent only refuses early a writer fenced before the save
    began: the commit reads the fence again before its create, after the intent is
    written, which is what a takeover's search for intents relies on (see "Why the order
    is safe" in :mod:`cairn.protocol._commit`). Preconditions that fail end the lease and
    remove the intent (best effort)."""
    check_id(cid)
    # A save that commits has an intent of its own; the processes that only upload parts
    # of one save share one (``intent.json``), which its commit removes.
    intent = ctx.paths.intent(cid, new_attempt() if commits else None)
    lease = _lease.Lease.begin(ctx.store, intent, parent_id, ctx.lease)
    try:
        written, record = await asyncio.gather(
            lease.written(),
            _commit.preconditions(ctx, cid, commits=commits, committed=not generated),
            return_exceptions=True,
        )
        for outcome in (record, written):  # a refusal says more than a failed write
            if isinstance(outcome, BaseException):
                raise outcome
    except BaseException:
        await lease.stop()
        with contextlib.suppress(CheckpointerError):
            await ctx.store.delete([intent])
        raise
    assert not isinstance(record, BaseException)
    return PendingSave(ctx, cid, record, lease, parent_id)


@contextlib.asynccontextmanager
async def begin(
    ctx: Context,
    cid: CheckpointId,
    parent_id: CheckpointId | None = None,
    *,
    commits: bool = True,
) -> AsyncIterator[PendingSave]:
    """:func:`start` for a block; the lease ends with the block at the latest."""
    pending = await start(ctx, cid, parent_id, commits=commits)
    try:
        yield pending
    finally:
        await pending.end()


async def upload_partitions(
    ctx: Context,
    cid: CheckpointId,
    uploads: Sequence[_upload.PartitionUpload],
    metadata_key: str | None,
    announce: _upload.Announce | None = None,
    generated: bool = False,
) -> list[_upload.Entry]:
    """A part of a save that only uploads (its commit comes from elsewhere): steps 1 to
    3 for checked ``uploads``, at once: the intent's write, the check that the id is not
    committed, and the uploads (as a save in one call writes its intent beside its
    uploads: see "Why the order is safe" in :mod:`cairn.protocol._commit`). The lease
    lapses a lease after they end; a failure removes the uploads and the intent.
    ``announce`` is told each entry once it is final
    (:func:`cairn.protocol._upload.upload_partitions`). ``generated``: the committer made
    the id (a new UUIDv7, which no checkpoint can hold), so whether it is committed is
    not looked up."""
    check_id(cid)
    lease = _lease.Lease.begin(ctx.store, ctx.paths.intent(cid), None, ctx.lease)
    pending = PendingSave(ctx, cid, None, lease)
    attempt = new_attempt()
    try:
        written, checked, uploaded = await asyncio.gather(
            lease.written(),
            _commit.preconditions(ctx, cid, commits=False, committed=not generated),
            _upload.upload_partitions(ctx, cid, uploads, attempt, metadata_key, announce),
            return_exceptions=True,
        )
        for outcome in (checked, written, uploaded):  # a refusal says the most
            if isinstance(outcome, BaseException):
                raise outcome
    except BaseException:
        await pending.abandon(uploads, attempt)
        raise
    finally:
        await pending.end()
    assert not isinstance(uploaded, BaseException)
    return uploaded


async def upload_write_once(
    ctx: Context, cid: CheckpointId, upload: _upload.PartitionUpload
) -> PartitionSnapshotEntry:
    """One checked partition to the reference's attempt-less name, create-only
    (:func:`cairn.protocol._upload.put_write_once`), as a part of a save that only uploads."""
    async with begin(ctx, cid, commits=False):
        encoded = await _upload.encode_write_once(ctx, cid, upload)
        return await _upload.put_write_once(ctx, cid, encoded)


async def save(
    ctx: Context,
    data: CheckpointData,
    before_commit: Callable[[], Awaitable[None]] | None = None,
    parent_committing: Callable[[], Awaitable[CheckpointManifest]] | None = None,
) -> CheckpointManifest:
    """Every step of the module docstring for ``data``; the committed manifest.

    ``before_commit`` is awaited after the uploads and the checks before the create,
    just before the commit point (a background save waits there for the one before it,
    so that its uploads and checks overlap that save's commit). ``parent_committing``,
    when ``data``'s parent is a save still running in the same pipeline, waits for the
    manifest that save commits: the parent's chains are taken from it once it is
    committed, while this save's own uploads go on. The manifest records
    :class:`~cairn.format.manifest.SaveStats` of this save.
    """
    if not isinstance(data, CheckpointData):
        raise InvalidInputError(f"save takes a CheckpointData, got {data!r}")
    with _dispatch.counting_retries() as retries:
        async with _dispatch.observed(None, "save", checkpoint_id=data.id, epoch=data.epoch) as op:
            op.manifest = await _save(ctx, data, before_commit, retries, parent_committing)
            return op.manifest


async def _save(
    ctx: Context,
    data: CheckpointData,
    before_commit: Callable[[], Awaitable[None]] | None,
    retries: _dispatch.RetryCounter,
    parent_committing: Callable[[], Awaitable[CheckpointManifest]] | None,
) -> CheckpointManifest:
    meter = SaveMeter(retries=retries)
    cid = data.id
    with meter.counting():
        check_id(cid)
        attempt = new_attempt()
        plan = _upload.plan_packs(_uploads_of(data))  # before anything is written
        intent = ctx.paths.intent(cid, new_attempt())
        pending = PendingSave(
            ctx,
            cid,
            None,
            _lease.Lease.begin(ctx.store, intent, data.parent_id, ctx.lease),
            data.parent_id,
        )
        directories: tuple[DirectoryEntry, ...] = ()
        try:
            meter.uploading = time.perf_counter()
            entries, parent = await _upload_beside_intent(
                ctx, data, pending, plan, attempt, parent_committing
            )
            directories = await _directories.save_directories(ctx, data, attempt, parent)
            meter.uploaded = time.perf_counter()
        except BaseException:
            await _directories.discard_files(ctx, cid, directories)
            await pending.abandon(plan.alone, attempt, packs=len(plan.packs))
            raise
        manifest = assemble_manifest(
            data.id,
            data.epoch,
            entries,
            parent_id=data.parent_id,
            source_offsets=data.source_offsets,
            watermark=data.watermark,
            timestamp_ms=data.timestamp_ms,
            writer_generation=ctx.generation,
        )
        if directories:
            manifest = msgspec.structs.replace(
                manifest,
                directories=directories,
                total_size_bytes=manifest.total_size_bytes
                + sum(d.total_bytes for d in directories),
            )

        async def discard(written: CheckpointManifest) -> None:
            await _directories.discard_files(ctx, cid, written.directories)
            await _upload.discard_attempt(
                ctx, cid, plan.alone, attempt, len(plan.packs), pending.intent
            )

        try:
            return await pending.commit(manifest, meter.finish(ctx), discard, parent, before_commit)
        finally:
            await pending.end()


_Carried = tuple[CheckpointManifest, dict[ArtifactKey, list[_upload.Entry]]]
"""The parent's manifest, and the chains a save carries from it."""


async def _upload_beside_intent(
    ctx: Context,
    data: CheckpointData,
    pending: PendingSave,
    plan: _upload.PackPlan,
    attempt: str,
    parent_committing: Callable[[], Awaitable[CheckpointManifest]] | None = None,
) -> tuple[list[_upload.Entry], CheckpointManifest | None]:
    """Steps 1 to 3 of a save in one call, at once: the intent's write, the uploads, and
    what needs no intent before it: the parent's chains, ``_latest`` (when this
    checkpointer holds no version of it to swap) and, for an id that was given rather
    than generated, whether it is committed. Returns once all of it has ended (nothing of
    it still lands after a failure): the entries, and the parent's manifest (None without
    a parent), which the commit then checks against the fence it reads after the intent.
    A parent still committing in the same pipeline (``parent_committing``) is waited
    for here, so the commit's checks, listing the parent's manifest too, come after it.
    """
    chains: Awaitable[_Carried | None]
    uploads: Awaitable[list[_upload.Entry]]
    if data.parent_id is not None and any(
        isinstance(snapshot, KeyedSnapshot) for snapshot in data.snapshots.values()
    ):
        # The parent's chains decide which key groups need no upload: them first.
        carried = asyncio.ensure_future(
            _chains.carried_chains(ctx, data, parent_committing=parent_committing)
        )
        chains = carried

        async def after_chains() -> list[_upload.Entry]:
            await carried
            return await upload_all(ctx, data, None, plan, attempt, chains=False)

        uploads = after_chains()
    else:
        chains = (
            _chains.carried_chains(ctx, data, parent_committing=parent_committing)
            if data.parent_id is not None
            else _nothing()
        )
        uploads = upload_all(ctx, data, None, plan, attempt, chains=False)
    jobs: list[Awaitable[object]] = [pending.written(), uploads, chains, pending.read_latest()]
    if not data.generated_id:
        jobs.append(_refuse_committed(ctx, data.id))
    outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    entries = cast("list[_upload.Entry]", outcomes[1])
    found = cast("_Carried | None", outcomes[2])
    if found is None:
        return entries, None
    parent, inherited = found
    return [link for links in inherited.values() for link in links] + entries, parent


def _stored(owner: CheckpointId | None, relative: str) -> tuple[str, str]:
    """An artifact a manifest names, as a key: its owner (``""``: the checkpoint's own)
    and its path."""
    return (str(owner) if owner is not None else "", relative)


async def _nothing() -> None:
    return None


async def _refuse_committed(ctx: Context, cid: CheckpointId) -> None:
    if await _catalog.committed(ctx, cid):
        raise CheckpointExistsError(str(cid), ctx.paths.manifest(cid))


def _uploads_of(data: CheckpointData) -> list[_upload.PartitionUpload]:
    """Every snapshot and delta ``data`` holds, as uploads."""
    return [
        *((op, p, False, buf) for (op, p), buf in data.snapshots.items()),
        *((op, p, True, buf) for (op, p), buf in data.deltas.items()),
    ]


async def upload_all(
    ctx: Context,
    data: CheckpointData,
    record: _pointer.WriterRecord | None,
    plan: _upload.PackPlan | None = None,
    attempt: str | None = None,
    *,
    chains: bool = True,
) -> list[_upload.Entry]:
    """Upload what ``data`` holds as ``plan`` says (by default
    :func:`~cairn.protocol._upload.plan_packs` of all of it: small artifacts merged into packs) as
    ``attempt`` (by default a new one); the entries, with those carried from the parent
    (unless not ``chains``: the caller carries them), whose manifest ``record`` must
    admit. The source offsets live in the manifest itself."""
    cid = data.id
    plan = plan if plan is not None else _upload.plan_packs(_uploads_of(data))
    attempt = attempt if attempt is not None else new_attempt()
    inherited: dict[ArtifactKey, list[_upload.Entry]] = {}
    if data.parent_id is not None and chains:
        _, inherited = await _chains.carried_chains(ctx, data, record)
    jobs: list[Callable[[], Awaitable[list[_upload.Entry]]]] = [
        _upload.pack_job(ctx, cid, index, members, attempt)
        for index, members in enumerate(plan.packs)
    ]
    jobs += [_alone(_upload.upload_job(ctx, cid, *upload, attempt)) for upload in plan.alone]
    results = await bounded_gather(ctx.max_concurrent_uploads, jobs)
    entries = [link for links in inherited.values() for link in links]
    entries += [entry for result in results for entry in result]
    return entries


def _alone(
    job: Callable[[], Awaitable[_upload.Entry]],
) -> Callable[[], Awaitable[list[_upload.Entry]]]:
    async def run() -> list[_upload.Entry]:
        return [await job()]

    return run


def assemble_manifest(
    checkpoint_id: CheckpointId,
    epoch: int,
    entries: Iterable[_upload.Entry],
    *,
    parent_id: CheckpointId | None = None,
    source_offsets: Mapping[str, SourceOffsetEntry] | None = None,
    watermark: int | None = None,
    timestamp_ms: int | None = None,
    writer_generation: int = 0,
    name: str | None = None,
    directories: Iterable[DirectoryEntry] = (),
) -> CheckpointManifest:
    """The manifest of ``(operator, entry)`` pairs: entries per operator, in chain order;
    with ``directories`` (:meth:`PendingSave.upload_directories`), ordered by key."""
    per_operator: dict[str, list[PartitionSnapshotEntry]] = {}
    for operator, entry in entries:
        per_operator.setdefault(operator, []).append(entry)
    operators = {op: OperatorSnapshotEntry.from_partitions(p) for op, p in per_operator.items()}
    listed = tuple(sorted(directories, key=lambda d: (d.operator, d.partition_id)))
    base = CheckpointManifest.new(checkpoint_id, epoch)
    if timestamp_ms is not None:  # a copy keeps its original's time
        base = msgspec.structs.replace(base, timestamp_ms=timestamp_ms)
    return msgspec.structs.replace(
        base,
        operators=operators,
        source_offsets=dict(source_offsets or {}),
        parent_id=parent_id,
        watermark=watermark,
        total_size_bytes=sum(op.total_bytes for op in operators.values())
        + sum(d.total_bytes for d in listed),
        writer_generation=writer_generation or None,
        name=name,
        directories=listed,
    )
