"""The commit protocol: how a checkpoint comes to exist, atomically, or not at all.

This is the one place the protocol is written down; every way to commit goes through
it: a save in one call (:func:`save`), a save in two phases whose uploads and commit
are separate calls or processes (:func:`start` and :class:`PendingSave`, used by
``save_partitions_concurrent``, :mod:`cairn.integrations.distributed` and :mod:`cairn.torch` through
:mod:`cairn.integrations._interface`), and a commit of artifacts the caller uploaded
(:func:`commit`, :func:`save_manifest`).

The steps, in order:

1. **Lease** (:mod:`cairn.protocol._lease`): the save writes its intent,
   ``{id}/intent.{attempt}.json`` (the processes that only upload parts of one save
   share ``{id}/intent.json``), naming the parent its manifest will name (None when it
   carries nothing), and renews it every third of the lease until its commit, whatever
   happens between its steps: GC sweeps nothing of a live lease and keeps the parent's
   chain. One rule for every path: the lease is held from the intent to the commit by
   whoever will commit (a worker that only uploads holds it while it uploads). A lease
   nobody renews lapses; GC may then claim the id (step 4's race). The intent comes
   before anything is read: a takeover raises the writer generation, then claims every
   save whose intent it finds, so a save either reads the new generation below, or
   cannot commit.
2. **Preconditions** (:func:`preconditions`, the one check every path makes before it
   uploads anything): a writer that will commit is not fenced, i.e. no newer writer
   generation holds ``_writer`` (:mod:`cairn.protocol._pointer`); the record read is what the
   parent must be admitted by. And the id is not committed (committed ids are
   immutable). A process that only uploads part of a save checks the id alone: the fence
   is the committer's to check. A save refused here removes its intent.
3. **Uploads** (:mod:`cairn.protocol._upload`): every snapshot and delta goes under ``{base}{id}/``
   with a name carrying this attempt's token (:func:`cairn.format.layout.new_attempt`),
   concurrently and bounded, hashed as it travels (a one-phase save merges small ones
   into packs, each artifact a range of its own); the parent's chains are carried over
   by reference (:mod:`cairn.protocol._chains`); a directory partition's files are uploaded or
   carried one by one (:mod:`cairn.protocol._directories`). Source offsets live in the manifest.
   Nothing is visible to any reader yet. A failure removes this attempt's objects and its intent.
4. **Commit point**: check that every artifact the manifest names is in the store, then
   write ``{base}{id}/manifest.json`` only if absent: **this single write is the
   commit**; then check the artifacts once more. A manifest of more than
   :data:`~cairn.format.manifest.PART_ENTRIES` entries first writes its parts, named by their
   digests, which the manifest then records with their sizes and digests (see
   :mod:`cairn.format.manifest`): still one write commits. GC claims an uncommitted id with a
   tombstone, a create-only write on that very path, so a commit and a claim race for
   one object and the store lets exactly one win.
5. **Publish**: stop renewing the lease, advance ``_latest`` by compare-and-swap, only
   forwards, and only if not fenced (fenced there, the commit is rolled back: its
   manifest becomes a tombstone, so its id can never commit again), then delete the
   intents. Until then an intent says the save has not finished: a deletion of the
   checkpoint meanwhile retires its id rather than free it for the create this save may
   still retry.

Invariants:

* before step 4's write the checkpoint does not exist for any reader (listing and
  loading go through the manifest); after it, it is immutable: the manifest is never
  overwritten, and no write through cairn replaces an artifact it names, because every
  object a save uploads carries that save attempt's own token and the reference's fixed
  names are written create-only; a second writer of the same id writes objects of its
  own, fails at its create with :class:`CheckpointExistsError`, and leaves garbage that
  GC sweeps;
* a failed save removes only objects of its own attempt, never the directory: another
  writer of the same id may have committed there;
* no manifest reported as committed names an artifact that is gone, whatever the clocks
  say and however long the save paused. Every way to commit checks the artifacts before
  the create and again after it. The check before makes the usual failure invisible.
  The check after closes the window between the two: GC sweeps an uncommitted directory
  only after claiming its id with a tombstone, so while the tombstone stands the create
  fails (:class:`CheckpointAbortedError`). GC removes a tombstone only once its
  directory is empty and the tombstone is a day old by the store's own time
  (:mod:`cairn.protocol.retention`), which a save paused in that window can outlast. Once the
  create has succeeded no claim can succeed, so nothing GC decides later sweeps the
  directory; a sweep decided earlier is over before the tombstone can go. So if the
  artifacts are all there after the create, they stay; if they are not, or the check
  after the create cannot be made (a store failure), the manifest (ours: create-only)
  is deleted again before anything else sees it named by ``_latest``, and the save
  fails;
* a create that meets "already exists" is resolved by reading the manifest back: our own
  bytes mean our commit happened (a retried write whose reply was lost), a tombstone
  means GC claimed the id first (:class:`CheckpointAbortedError`, nothing committed),
  anything else is :class:`CheckpointExistsError`;
* a manifest that landed but could not be made durable (:class:`NotDurableError`) is
  deleted again and the save fails: a crash could lose it, so it never counts as a
  commit;
* a save that fails before its commit removes what it uploaded (best effort: GC sweeps
  the rest); a commit fenced at its pointer swap is rolled back and raises
  :class:`FencedError`; a pointer swap that fails otherwise after the commit leaves
  ``_latest`` behind (a hint) but does not fail the save;
* deletion never breaks another committed checkpoint nor a save in progress that builds
  on the one deleted (:class:`CheckpointInUseError`, unless forced); it removes the
  manifest first, so a half-deleted checkpoint is never listed, and then moves
  ``_latest`` off it, by compare-and-swap, to the newest checkpoint that remains.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path

import msgspec

from cairn.data import ArtifactKey, CheckpointData, DirectoryCheck
from cairn.errors import (
    BrokenChainError,
    CheckpointAbortedError,
    CheckpointerError,
    CheckpointExistsError,
    CheckpointInUseError,
    CheckpointNotFoundError,
    FencedError,
    InvalidInputError,
    NotDurableError,
    ObjectExistsError,
    StoreError,
)
from cairn.format.ids import CheckpointId
from cairn.format.layout import is_attempt_artifact, is_cairn_name, new_attempt
from cairn.format.manifest import (
    CheckpointManifest,
    DirectoryEntry,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SaveStats,
    SourceOffsetEntry,
    StoreRequests,
    check_manifest,
    encode_manifest,
    encode_stored,
)
from cairn.observe import _dispatch
from cairn.protocol import _catalog, _chains, _directories, _lease, _pointer, _upload, retention
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context, check_id
from cairn.stores import capabilities_of

__all__ = [
    "PendingSave",
    "SaveMeter",
    "assemble_manifest",
    "begin",
    "commit",
    "delete_checkpoint",
    "dependents",
    "preconditions",
    "save",
    "save_manifest",
    "start",
    "update_latest",
    "upload_all",
    "upload_partitions",
    "upload_write_once",
]

log = logging.getLogger("cairn")


async def preconditions(
    ctx: Context, cid: CheckpointId, *, commits: bool = True
) -> _pointer.WriterRecord | None:
    """Step 1: the one check before a save of ``cid`` writes anything.

    A save that ``commits`` must not be fenced (:class:`FencedError`; a damaged
    ``_writer`` is :class:`CorruptManifestError`): returns the writer record read, which
    the parent must be admitted by. Any save: ``cid`` must not be committed
    (:class:`CheckpointExistsError`). A part of a save that only uploads returns None.
    """
    record = None
    if commits:
        record = await _pointer.check_not_fenced(
            ctx.store, ctx.paths.writer_record(), ctx.generation
        )
    if await _catalog.committed(ctx, cid):
        raise CheckpointExistsError(str(cid), ctx.paths.manifest(cid))
    return record


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

    @property
    def intent(self) -> str:
        """The intent this save's lease renews (its own: see :meth:`CheckpointPaths.intent`)."""
        return self._lease.path

    async def upload(
        self,
        uploads: Sequence[_upload.PartitionUpload],
        metadata_key: str | None = None,
        attempt: str | None = None,
    ) -> list[_upload.Entry]:
        """Step 3 for checked ``uploads``, as ``attempt`` (by default a new one); their
        entries. A failure ends the save: its objects and its intent are removed."""
        attempt = attempt if attempt is not None else new_attempt()
        try:
            return await _upload.upload_partitions(
                self.ctx, self.checkpoint_id, uploads, attempt, metadata_key
            )
        except BaseException:
            await self.abandon(uploads, attempt)
            raise

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
        discard: Discard | None = None,
    ) -> CheckpointManifest:
        """Steps 4 and 5 for ``manifest`` (of this checkpoint); the committed manifest.

        ``finish`` and ``discard`` are those of :func:`_write_manifest`. The lease is
        renewed until the create has happened, and ends with the commit either way.
        """
        if manifest.checkpoint_id != self.checkpoint_id:
            raise InvalidInputError(
                f"manifest of {manifest.checkpoint_id} given to the save of {self.checkpoint_id}"
            )
        try:
            return await _commit_and_publish(self.ctx, manifest, self._lease, finish, discard)
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
) -> PendingSave:
    """Begin a save of ``cid`` building on ``parent_id``: the lease, then
    :func:`preconditions`. The caller ends it (:meth:`PendingSave.commit` or
    :meth:`PendingSave.end`); one it drops stops renewing when it is garbage-collected.

    The intent is written before the fence is read: a takeover raises the generation,
    then claims every save whose intent it finds (:func:`abort_saves_in_flight`), so a
    save either reads the new generation and stops, or its intent is found and its id
    claimed before it can commit. Preconditions that fail end the lease and remove the
    intent (best effort)."""
    check_id(cid)
    # A save that commits has an intent of its own; the processes that only upload parts
    # of one save share one (``intent.json``), which its commit removes.
    intent = ctx.paths.intent(cid, new_attempt() if commits else None)
    lease = await _lease.Lease.start(ctx.store, intent, parent_id, ctx.lease)
    try:
        record = await preconditions(ctx, cid, commits=commits)
    except BaseException:
        await lease.stop()
        with contextlib.suppress(CheckpointerError):
            await ctx.store.delete([intent])
        raise
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
) -> list[_upload.Entry]:
    """A part of a save that only uploads (its commit comes from elsewhere): steps 1 to
    3 for checked ``uploads``; the lease lapses a lease after they end."""
    async with begin(ctx, cid, commits=False) as pending:
        return await pending.upload(uploads, metadata_key)


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
) -> CheckpointManifest:
    """Every step of the module docstring for ``data``; the committed manifest.

    ``before_commit`` is awaited after the uploads, just before the commit point (a
    background save waits there for the one before it). The manifest records
    :class:`~cairn.format.manifest.SaveStats` of this save.
    """
    if not isinstance(data, CheckpointData):
        raise InvalidInputError(f"save takes a CheckpointData, got {data!r}")
    with _dispatch.counting_retries() as retries:
        async with _dispatch.observed(None, "save", checkpoint_id=data.id, epoch=data.epoch) as op:
            op.manifest = await _save(ctx, data, before_commit, retries)
            return op.manifest


async def _save(
    ctx: Context,
    data: CheckpointData,
    before_commit: Callable[[], Awaitable[None]] | None,
    retries: _dispatch.RetryCounter,
) -> CheckpointManifest:
    meter = SaveMeter(retries=retries)
    cid = data.id
    with meter.counting():
        async with begin(ctx, cid, data.parent_id) as pending:
            assert pending.record is not None
            attempt = new_attempt()
            plan = _upload.plan_packs(_uploads_of(data))
            directories: tuple[DirectoryEntry, ...] = ()
            try:
                meter.uploading = time.perf_counter()
                entries = await upload_all(ctx, data, pending.record, plan, attempt)
                directories = await _directories.save_directories(ctx, data, attempt)
                meter.uploaded = time.perf_counter()
                if before_commit is not None:
                    await before_commit()
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

            return await pending.commit(manifest, meter.finish(ctx), discard)


@dataclasses.dataclass
class SaveMeter:
    """What a save measures of itself for its :class:`~cairn.format.manifest.SaveStats`.

    ``began``, ``uploading`` and ``uploaded`` are ``time.perf_counter`` readings: the
    save's start, and its upload phase's start and end (unset: the save's start, and
    the check before its commit). ``requests`` and ``retries`` count the store requests
    and retries made in its :meth:`counting` blocks (and the tasks started there, a
    lease's renewals), and those :meth:`add` counts for another process (a worker of
    the save). One meter may count in many blocks.
    """

    began: float = dataclasses.field(default_factory=time.perf_counter)
    uploading: float | None = None
    uploaded: float | None = None
    requests: _dispatch.RequestCounter = dataclasses.field(default_factory=_dispatch.RequestCounter)
    retries: _dispatch.RetryCounter = dataclasses.field(default_factory=_dispatch.RetryCounter)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count the store requests and retries of the block (and its tasks) here."""
        with _dispatch.counting_requests(self.requests), _dispatch.counting_retries(self.retries):
            yield

    def spent(self) -> tuple[StoreRequests, int]:
        """The requests and retries counted so far: what a worker hands its committer."""
        return StoreRequests(**dataclasses.asdict(self.requests)), self.retries.count

    def add(self, requests: StoreRequests, retries: int) -> None:
        """Count a worker's ``requests`` and ``retries`` (its :meth:`spent`) here."""
        self.requests.add(_dispatch.RequestCounter(**msgspec.structs.asdict(requests)))
        self.retries.count += retries

    def finish(self, ctx: Context) -> Callable[[CheckpointManifest], CheckpointManifest]:
        """A ``finish`` for :meth:`PendingSave.commit`: the checked manifest with the
        statistics of this save (:func:`_save_stats`), measured up to that moment."""

        def with_stats(checked: CheckpointManifest) -> CheckpointManifest:
            stats = _save_stats(ctx, checked, self, time.perf_counter())
            return msgspec.structs.replace(checked, stats=stats)

        return with_stats


def _save_stats(
    ctx: Context, manifest: CheckpointManifest, meter: SaveMeter, checked: float
) -> SaveStats:
    """What :class:`SaveStats` says of a save of ``manifest``, about to be written, from
    its entries, its ``meter`` and ``checked``, the clock reading before the write.

    ``requests`` are the meter's plus those :func:`_create_manifest` makes once this
    record is encoded, up to the commit: its fence check (a GET), then the manifest's
    own writes (each part, then the manifest; one PUT each). ``stored_bytes`` are the
    save's own objects, the parts and the manifest as they will be stored. The
    manifest's size depends on the numbers it holds, so it is encoded until they agree
    (twice; three times when a number gains a digit).
    """
    # A directory partition's files count as artifacts, each its own; so does each
    # artifact of a pack (its stored range), and each object a DCP save carries in part
    # (the bytes of the ranges it uses).
    sizes = [(e.owner, _counted_bytes(e)) for _, e in manifest.partition_entries()]
    sizes += [(f.owner, f.size_bytes) for _, f in manifest.file_entries()]
    own = [size for owner, size in sizes if owner is None]
    carried = [size for owner, size in sizes if owner is not None]
    uploading = meter.uploading if meter.uploading is not None else meter.began
    uploaded = meter.uploaded if meter.uploaded is not None else checked

    def ms(seconds: float) -> int:
        return max(0, round(seconds * 1000))

    counted, retries = meter.spent()
    objects = sum(size for owner, _, size in manifest.stored_objects() if owner is None)
    stats = SaveStats(
        duration_ms=ms(checked - meter.began),
        upload_ms=ms(uploaded - uploading),
        commit_ms=ms(checked - uploaded),
        uploaded_bytes=sum(own),
        uploaded_artifacts=len(own),
        carried_bytes=sum(carried),
        carried_artifacts=len(carried),
        retries=retries,
        stored_bytes=objects,
        requests=counted,
    )
    for _ in range(5):  # the sizes only grow, by a digit at a time: a few rounds settle
        encoded = encode_stored(msgspec.structs.replace(manifest, stats=stats), ctx.keys)
        parts = [body for _, body in encoded.parts]
        settled = msgspec.structs.replace(
            stats,
            stored_bytes=objects + sum(map(len, parts)) + len(encoded.root),
            requests=msgspec.structs.replace(
                counted, get=counted.get + 1, put=counted.put + len(parts) + 1
            ),
        )
        if settled == stats:
            break
        stats = settled
    return stats


def _counted_bytes(entry: PartitionSnapshotEntry) -> int:
    """The bytes :class:`SaveStats` counts for ``entry``: those it takes in the store, or
    for a carried object of which this checkpoint uses ranges, those ranges'."""
    if entry.owner is not None and entry.used_bytes is not None:
        return entry.used_bytes
    return entry.stored_length


def _uploads_of(data: CheckpointData) -> list[_upload.PartitionUpload]:
    """Every snapshot and delta ``data`` holds, as uploads."""
    return [
        *((op, p, False, buf) for (op, p), buf in data.snapshots.items()),
        *((op, p, True, buf) for (op, p), buf in data.deltas.items()),
    ]


async def upload_all(
    ctx: Context,
    data: CheckpointData,
    record: _pointer.WriterRecord,
    plan: _upload.PackPlan | None = None,
    attempt: str | None = None,
) -> list[_upload.Entry]:
    """Upload what ``data`` holds as ``plan`` says (by default
    :func:`~cairn.protocol._upload.plan_packs` of all of it: small artifacts merged into packs) as
    ``attempt`` (by default a new one); the entries, with those carried from the parent.
    The source offsets live in the manifest itself."""
    cid = data.id
    plan = plan if plan is not None else _upload.plan_packs(_uploads_of(data))
    attempt = attempt if attempt is not None else new_attempt()
    inherited: dict[ArtifactKey, list[_upload.Entry]] = {}
    if data.parent_id is not None:
        inherited = await _chains.carried_chains(ctx, data, record)
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


async def commit(ctx: Context, manifest: CheckpointManifest) -> CheckpointManifest:
    """Steps 4 and 5 for artifacts the caller uploaded; the committed manifest. The commit
    holds a lease of its own (its intent written before the fence is read, see
    :func:`start`)."""
    intent = ctx.paths.intent(manifest.checkpoint_id, new_attempt())
    lease = await _lease.Lease.start(ctx.store, intent, manifest.parent_id, ctx.lease)
    try:
        return await _commit_and_publish(ctx, manifest, lease)
    finally:
        await lease.stop()


async def _commit_and_publish(
    ctx: Context,
    manifest: CheckpointManifest,
    lease: _lease.Lease | None,
    finish: Callable[[CheckpointManifest], CheckpointManifest] | None = None,
    discard: Discard | None = None,
) -> CheckpointManifest:
    """Steps 4 and 5, as one observed ``commit``; ``lease`` (if any) stops once the
    manifest is written.

    A save whose uploads are its own (it passes ``discard``) and finds one of them gone
    fails with :class:`CheckpointAbortedError`: only GC removes what a save uploaded,
    having claimed the id once the lease lapsed.
    """
    cid = manifest.checkpoint_id
    async with _dispatch.observed(None, "commit", checkpoint_id=cid) as op:
        try:
            manifest = await _write_manifest(ctx, manifest, finish, discard)
        except BrokenChainError as exc:
            if discard is not None and _own_upload(ctx, manifest, exc.link):
                raise CheckpointAbortedError(
                    str(cid),
                    ctx.paths.manifest(cid),
                    f"its own upload {exc.link!r} was swept (its id was claimed once its "
                    "lease lapsed)",
                ) from exc
            raise
        if lease is not None:
            await lease.stop()  # before its intent goes: a renewal would write it again
        op.manifest = await _publish(ctx, manifest, lease.path if lease is not None else None)
        return op.manifest


async def save_manifest(ctx: Context, manifest: CheckpointManifest) -> None:
    """The commit point alone: check the artifacts, create ``manifest`` only if absent,
    check them again (see the module docstring). Raises :class:`BrokenChainError` naming
    the first artifact that is not in the store, and commits nothing then."""
    _check_manifest_input(manifest)
    intent = ctx.paths.intent(manifest.checkpoint_id, new_attempt())
    lease = await _lease.Lease.start(ctx.store, intent, manifest.parent_id, ctx.lease)
    try:
        await _check_before_create(ctx, manifest)
        written = await _create_manifest(ctx, manifest)
        await _check_after_create(ctx, written)
    finally:
        await lease.stop()
    with contextlib.suppress(CheckpointerError):
        await ctx.store.delete([intent])


def _check_manifest_input(manifest: CheckpointManifest) -> None:
    if not isinstance(manifest, CheckpointManifest):
        raise InvalidInputError(f"expected a CheckpointManifest, got {manifest!r}")
    try:
        check_manifest(manifest)
    except InvalidInputError as exc:
        raise InvalidInputError(f"manifest {manifest.checkpoint_id}: {exc}") from None


async def _create_manifest(ctx: Context, manifest: CheckpointManifest) -> CheckpointManifest:
    """Write ``manifest`` only if no manifest exists for its id: the create itself, after
    the parts of a large one (see :func:`cairn.format.manifest.encode_stored`). Returns the
    manifest as stored, ``parts`` set.

    Parts are named by their digest, so writing one that another writer of the id wrote
    (or this one, on a retry) writes the same bytes; they are never discarded with an
    attempt's uploads for that reason, and GC sweeps those no manifest names.
    """
    _check_manifest_input(manifest)
    await _pointer.check_not_fenced(ctx.store, ctx.paths.writer_record(), ctx.generation)
    cid = manifest.checkpoint_id
    path = ctx.paths.manifest(cid)
    encoded = encode_stored(manifest, ctx.keys)
    await bounded_gather(
        ctx.max_concurrent_uploads,
        [
            functools.partial(ctx.store.put, ctx.paths.resolve(cid, relative), data)
            for relative, data in encoded.parts
        ],
    )
    body = encoded.root
    try:
        await ctx.store.put(path, body, mode="create")
    except NotDurableError:
        # Our manifest landed, but a crash could lose it: it must not stand as committed
        # (if this delete fails too, a reader that trusts it still verifies every byte).
        with contextlib.suppress(CheckpointerError):
            await ctx.store.delete([path])
        raise
    except ObjectExistsError:
        existing = await ctx.store.get(path)
        if _lease.is_tombstone(existing.data):
            raise CheckpointAbortedError(str(manifest.checkpoint_id), path) from None
        if bytes(existing.data) != body:
            raise CheckpointExistsError(str(manifest.checkpoint_id), path) from None
        log.info("manifest %s was already written by this commit (retried write)", path)
    return encoded.manifest


Discard = Callable[[CheckpointManifest], Awaitable[None]]
"""Removes what a commit that surely did not happen leaves behind (best effort)."""


async def _write_manifest(
    ctx: Context,
    manifest: CheckpointManifest,
    finish: Callable[[CheckpointManifest], CheckpointManifest] | None = None,
    discard: Discard | None = None,
) -> CheckpointManifest:
    """The commit point: check every artifact is there, create the manifest, check again.

    ``finish`` completes the manifest once the check passed (a save adds its stats);
    returns the manifest written. ``discard`` runs whenever the commit surely did not
    happen; without one, the manifest's own attempt-named artifacts are removed, unless
    another writer's commit or GC's claim is what stopped this one (a twin coordinator
    may have committed the very same uploads).
    """
    cid = manifest.checkpoint_id
    own_discard = discard is not None

    async def discard_all(written: CheckpointManifest) -> None:
        await (discard(written) if discard is not None else _discard_uncommitted(ctx, written))

    try:
        await _check_before_create(ctx, manifest)
        if finish is not None:
            manifest = finish(manifest)
        manifest = await _create_manifest(ctx, manifest)
    except (CheckpointExistsError, CheckpointAbortedError):
        if own_discard:  # objects only this attempt wrote: nobody else's commit names them
            await discard_all(manifest)
        raise
    except NotDurableError:
        await discard_all(manifest)  # the create removed the manifest itself
        raise
    except StoreError as exc:
        # The retries ran out, but an attempt may have landed with its reply lost: our own
        # bytes at the manifest path mean the commit happened, so go on as committed. (If
        # this read fails too, its error propagates: the outcome is unknown, and nothing
        # is discarded.)
        encoded = encode_stored(manifest, ctx.keys)
        if not await _manifest_is(ctx, cid, encoded.root):
            await discard_all(manifest)
            raise
        log.warning("manifest of %s landed although its write failed (%s)", cid, exc)
        manifest = encoded.manifest
    except BaseException:
        # Only discard when the manifest surely did not land.
        if not await _catalog.committed(ctx, cid):
            await discard_all(manifest)
        raise
    await _check_after_create(ctx, manifest, lambda: discard_all(manifest))
    return manifest


async def _publish(
    ctx: Context, manifest: CheckpointManifest, intent: str | None
) -> CheckpointManifest:
    """After the commit: advance ``_latest`` (or roll back if fenced), then remove the
    intent, which says until then that the save has not finished (a deletion of the
    checkpoint meanwhile retires its id, see :func:`cairn.protocol._lease.retire`; a takeover
    retires it)."""
    cid = manifest.checkpoint_id
    try:
        await _advance_or_roll_back(ctx, manifest)
    finally:
        # Its own intent, and the one its uploading processes share (see start).
        ended = [ctx.paths.intent(cid), *([intent] if intent is not None else [])]
        try:
            await ctx.store.delete(ended)
        except CheckpointerError as exc:  # they go with the checkpoint, retired
            log.info("could not remove the intents of committed %s: %s", cid, exc)
    return manifest


async def _advance_or_roll_back(ctx: Context, manifest: CheckpointManifest) -> None:
    """Advance ``_latest`` to ``manifest``; roll the commit back if a takeover fenced it."""
    cid = manifest.checkpoint_id
    try:
        try:
            await _pointer.advance_latest(
                ctx.store, ctx.paths.latest_pointer(), cid, manifest.epoch, ctx.generation
            )
        except StoreError as exc:
            # The checkpoint is committed; _latest is only a hint (readers fall back to
            # listing), so a swap that ran out of retries does not fail the save. But the
            # swap is where a takeover is noticed: check the fence instead.
            await _pointer.check_not_fenced(ctx.store, ctx.paths.writer_record(), ctx.generation)
            log.warning("checkpoint %s is committed, _latest not advanced: %s", cid, exc)
    except FencedError:
        log.warning("checkpoint %s was fenced after its commit: rolling it back", cid)
        await _roll_back(ctx, manifest)
        raise


async def _roll_back(ctx: Context, manifest: CheckpointManifest) -> None:
    """Retire a manifest this writer just committed, fenced (its id stays claimed, see
    :func:`cairn.protocol._lease.retire`), then remove the objects it uploaded."""
    path = ctx.paths.manifest(manifest.checkpoint_id)
    try:
        current = await ctx.store.head(path)
    except CheckpointNotFoundError:
        current = None
    if current is not None and not _lease.is_tombstone(current):
        await _lease.retire(ctx.store, current)
    await _discard_uncommitted(ctx, manifest)


async def _manifest_is(ctx: Context, cid: CheckpointId, body: bytes) -> bool:
    """True when the manifest stored for ``cid`` is exactly ``body``."""
    try:
        blob = await ctx.store.get(ctx.paths.manifest(cid))
    except CheckpointNotFoundError:
        return False
    return bytes(blob.data) == body


async def _check_before_create(ctx: Context, manifest: CheckpointManifest) -> None:
    """Check every artifact is there before the create; say why when one is not.

    A missing artifact is :class:`CheckpointExistsError` when another writer committed
    the id meanwhile, :class:`CheckpointAbortedError` when GC claimed it or swept this
    checkpoint's own uploads, else :class:`BrokenChainError` naming the first missing one.
    """
    cid = manifest.checkpoint_id
    try:
        await _check_artifacts_present(ctx, manifest)
    except BrokenChainError as exc:
        path = ctx.paths.manifest(cid)
        try:
            info = await ctx.store.head(path)
        except CheckpointNotFoundError:
            info = None
        if info is not None and _lease.is_tombstone(info):
            raise CheckpointAbortedError(str(cid), path) from None
        if info is not None and not await _manifest_is(
            ctx, cid, encode_manifest(manifest, ctx.keys)
        ):
            raise CheckpointExistsError(str(cid), path) from exc
        raise


async def _check_after_create(
    ctx: Context,
    manifest: CheckpointManifest,
    discard: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """The check after the create (see the module docstring): roll back if one is gone,
    or if the check itself fails (a :class:`StoreError`: the commit is not confirmed).
    ``discard`` runs once the manifest is rolled back; a rollback that fails leaves the
    manifest, and every artifact it names, standing, and raises the check's error."""
    cid = manifest.checkpoint_id
    path = ctx.paths.manifest(cid)
    try:
        await _check_artifacts_present(ctx, manifest, written=True)
    except BrokenChainError as exc:
        log.warning("checkpoint %s lost %s around its commit: rolling it back", cid, exc.link)
        await ctx.store.delete([path])
        if discard is not None:
            await discard()
        raise
    except StoreError as exc:
        log.warning("could not check the artifacts of %s after its commit: rolling it back", cid)
        try:
            await ctx.store.delete([path])
        except StoreError:
            log.warning("could not roll back %s either: its commit stands unchecked", cid)
            raise exc from None
        if discard is not None:
            await discard()
        raise


def _own_upload(ctx: Context, manifest: CheckpointManifest, path: str) -> bool:
    """True when store ``path`` is an artifact ``manifest`` names as its own upload."""
    cid = manifest.checkpoint_id
    return any(ctx.paths.resolve(cid, relative) == path for relative in manifest.own_objects())


async def _check_artifacts_present(
    ctx: Context, manifest: CheckpointManifest, written: bool = False
) -> None:
    """Raise :class:`BrokenChainError` unless every entry's object (and, once the
    manifest is ``written``, every part of it) is in the store.

    One listing per directory that holds entries (this checkpoint's, and those of the
    checkpoints it carries entries from), sizes checked: a whole object's exactly, a
    pack's at least to the end of the furthest range the manifest names in it.
    """
    cid = manifest.checkpoint_id
    wanted: dict[str, dict[str, tuple[int, bool]]] = {}
    for entry_owner, relative, size in manifest.stored_objects():
        owner = entry_owner or cid
        wanted.setdefault(ctx.paths.checkpoint_dir(owner), {})[
            ctx.paths.resolve(owner, relative)
        ] = (size, ctx.paths.is_pack(relative))
    for part in manifest.parts if written else ():
        own = wanted.setdefault(ctx.paths.checkpoint_dir(cid), {})
        own[ctx.paths.resolve(cid, part.path)] = (part.size_bytes, False)

    def check(directory: str) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            present = {info.path: info.size for info in await ctx.store.list(directory)}
            for path, (size, pack) in wanted[directory].items():
                got = present.get(path)
                if got is None or got < size or (got != size and not pack):
                    found = "missing" if got is None else f"{got} bytes"
                    expected = f"at least {size}" if pack else str(size)
                    raise BrokenChainError(
                        path,
                        f"{found} at commit time (expected {expected} bytes): "
                        f"checkpoint {cid} is not committed",
                    )

        return job

    await bounded_gather(ctx.max_concurrent_downloads, map(check, wanted))


async def _discard_uncommitted(ctx: Context, manifest: CheckpointManifest) -> None:
    """Best effort: remove what ``manifest``'s writers uploaded for a commit that failed.

    Only the attempt-named artifacts the manifest names as its own: nobody else writes
    those names, whereas the directory may hold another writer's commit of the same id.
    What is left is GC's job.
    """
    cid = manifest.checkpoint_id
    own = [
        ctx.paths.resolve(cid, relative)
        for owner, relative, _ in manifest.stored_objects()
        if owner is None and is_attempt_artifact(relative)
    ]
    try:
        await ctx.store.delete(own)
    except (CheckpointerError, asyncio.CancelledError) as exc:
        log.info("could not clean up after failed save of %s: %s", cid, exc)


def _needs(manifest: CheckpointManifest, cid: CheckpointId) -> bool:
    """True when ``manifest``'s restore chains need checkpoint ``cid`` (its bytes, or its
    manifest for a delta listed without its base, the reference's way)."""
    if any(file.owner == cid for _, file in manifest.file_entries()):
        return True
    heads: dict[tuple[str, int], bool] = {}
    for operator, entry in manifest.partition_entries():
        if entry.owner == cid:
            return True
        heads.setdefault((operator, entry.partition_id), entry.is_delta)
    return manifest.parent_id == cid and any(heads.values())


async def dependents(ctx: Context, checkpoint_id: CheckpointId) -> list[CheckpointId]:
    """What deleting ``checkpoint_id`` would break, oldest first: the committed
    checkpoints whose chains need it, and the saves in progress (a live lease) that build
    on it.

    Reads only, so this machine's clock judges the leases: an answer for people and
    tools. :func:`delete_checkpoint` decides by the store's time.
    """
    check_id(checkpoint_id)
    state = await retention.read_state(ctx.store, ctx.paths)
    return _dependents_in(ctx, state, checkpoint_id, dt.datetime.now(dt.UTC))


def _dependents_in(
    ctx: Context,
    state: retention.StoreState,
    checkpoint_id: CheckpointId,
    now: dt.datetime | None,
) -> list[CheckpointId]:
    """:func:`dependents` of ``checkpoint_id`` in ``state``, leases judged at ``now`` (None:
    the committed ones alone)."""
    found = {
        cid
        for cid, manifest in state.manifests.items()
        if cid != checkpoint_id and _needs(manifest, checkpoint_id)
    }
    if now is not None:
        busy, _ = retention.uncommitted_dirs(state, ctx.paths, now=now, min_age=dt.timedelta(0))
        found.update(cid for cid, parents in busy.items() if checkpoint_id in parents)
    return sorted(found)


async def update_latest(ctx: Context, checkpoint_id: CheckpointId, force: bool) -> bool:
    """Point ``_latest`` at committed ``checkpoint_id`` (forwards only unless ``force``);
    whether it moved. :class:`CheckpointNotFoundError` for an uncommitted id."""
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    return await _pointer.advance_latest(
        ctx.store,
        ctx.paths.latest_pointer(),
        checkpoint_id,
        manifest.epoch,
        ctx.generation,
        force=force,
    )


async def delete_checkpoint(ctx: Context, checkpoint_id: CheckpointId, force: bool) -> None:
    """Delete committed ``checkpoint_id``: its manifest first, then ``_latest`` moved off
    it, then the objects its manifest names in its own directory. Refuses with
    :class:`CheckpointInUseError` when something needs it, unless ``force``.

    It goes as GC goes for one checkpoint, every lease judged by the store's time
    (:func:`cairn.protocol.retention.store_now`, one write). What needs it is decided from one
    reading of the store (:func:`_dependents_in`); once its manifest is gone the store is
    read again (:func:`cairn.protocol.retention.look_again`), so that a checkpoint committed on it
    meanwhile, or a save in progress that carries it, keeps what it names, and a save on
    it whose lease lapsed is claimed first (with ``force``, every save on it is claimed
    and nothing is spared: what was committed on it no longer loads, and nothing can
    commit on it any more). What else its directory holds (another attempt at the same
    id, whose writer may be stalled at its commit point, an intent) stays whole: GC
    judges it later as an uncommitted directory, claiming it once its lease lapsed. A
    checkpoint whose directory holds an intent (the save that committed it has not
    finished, and may retry its create), or that a fence names, is retired instead
    (:func:`cairn.protocol._lease.retire`: its manifest becomes a tombstone). A
    damaged manifest names nothing that can be trusted: every object in its directory
    with a name cairn writes goes. A
    checkpoint that is not committed is not an error, and nothing is deleted for it: its
    directory, if any, is GC's to judge.
    """
    check_id(checkpoint_id)
    state = await retention.read_state(ctx.store, ctx.paths)
    manifest = state.manifests.get(checkpoint_id)
    if manifest is None and checkpoint_id not in state.damaged:
        return
    if not force:
        # Committed dependents need no clock: refused before anything is written.
        found = _dependents_in(ctx, state, checkpoint_id, None)
        if not found:
            now = await retention.store_now(ctx.store, ctx.paths)
            found = _dependents_in(ctx, state, checkpoint_id, now)
        if found:
            raise CheckpointInUseError(str(checkpoint_id), [str(cid) for cid in found])
    else:
        # Every save built on it can only commit naming what goes: claimed before the
        # manifest goes, while it still protects what they carry from GC.
        now = await retention.store_now(ctx.store, ctx.paths)
        await retention.claim_saves_on(
            ctx.store,
            ctx.paths,
            state,
            state.manifests,
            {checkpoint_id},
            now=now,
            min_age=dt.timedelta(0),
            live=True,
        )
    manifest_path = ctx.paths.manifest(checkpoint_id)
    directory = ctx.paths.checkpoint_dir(checkpoint_id)
    if manifest is not None:
        own = sorted(ctx.paths.resolve(checkpoint_id, p) for p in manifest.own_objects())
    else:
        own = [
            info.path
            for info in state.objects
            if info.path.startswith(directory)
            and info.path != manifest_path
            and is_cairn_name(info.path.removeprefix(directory))
        ]
    listed = {info.path: info for info in state.objects if info.path.startswith(directory)}
    unfinished = any(ctx.paths.is_intent_path(path) for path in listed)
    if manifest is not None and (unfinished or checkpoint_id in state.fenced):
        # The save that committed it may retry its create, or a fence names it: its id
        # stays claimed (see cairn.protocol._lease.retire).
        if not await _lease.retire(ctx.store, listed[manifest_path]):
            return  # replaced meanwhile: the checkpoint asked for is gone already
    else:
        await ctx.store.delete([manifest_path])
    await _move_latest_off(ctx, checkpoint_id)
    spared_whole, spared = await retention.look_again(
        ctx.store,
        ctx.paths,
        state.manifests,
        {checkpoint_id},
        min_age=dt.timedelta(0),
        claim_live=force,
    )
    if not force:
        own = [] if checkpoint_id in spared_whole else [p for p in own if p not in spared]
    await ctx.store.delete(own)
    if capabilities_of(ctx.store).local_path is not None and not await ctx.store.list(directory):
        # A local directory can hold what no listing shows: the staging file of a write
        # killed mid-way. Once nothing listed is left, the directory goes whole.
        await ctx.store.delete_prefix(directory)


async def _move_latest_off(ctx: Context, deleted: CheckpointId) -> None:
    """If ``_latest`` names ``deleted``, point it at the newest checkpoint that remains
    (by compare-and-swap, only while it still names ``deleted``), or at nothing."""
    pointer, _, _ = await _pointer.read_pointer(ctx.store, ctx.paths.latest_pointer())
    if pointer is None or pointer.checkpoint_id != deleted:
        return
    target: CheckpointManifest | None = None
    async for cid in _catalog.latest_candidates(ctx):
        if cid == deleted:
            continue
        try:
            target = await _catalog.load_manifest(ctx, cid)
        except _catalog.DAMAGE:
            continue
        break
    await _pointer.retreat_latest(ctx.store, ctx.paths.latest_pointer(), deleted, target)
