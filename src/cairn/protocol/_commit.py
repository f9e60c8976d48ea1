"""The commit protocol: how a checkpoint comes to exist, atomically, or not at all.

This is the one place the protocol is written down; every way to commit goes through
it: a save in one call (:func:`cairn.protocol._save.save`), a save in two phases whose
uploads and commit are separate calls or processes (:func:`cairn.protocol._save.start`
and :class:`cairn.protocol._save.PendingSave`, used by ``save_partitions_concurrent``,
:mod:`cairn.integrations.distributed` and :mod:`cairn.torch` through
:mod:`cairn.integrations._interface`), and a commit of artifacts the caller uploaded
(:func:`commit`, :func:`save_manifest`).

The protocol's parts, each in a module of its own that points here: the lease
(:mod:`cairn.protocol._lease`), the ways to save (:mod:`cairn.protocol._save`: steps 1
to 3, then this module's commit), the uploads (:mod:`cairn.protocol._upload`), what a
save measures of itself (:mod:`cairn.protocol._meter`), the pointer and the fences
(:mod:`cairn.protocol._pointer`) and deletion (:mod:`cairn.protocol._delete`: the last
invariant below). This module keeps what decides whether a checkpoint exists: the
preconditions (step 2), the commit point (step 4) and the publication (step 5), and the
takeover that fences earlier writers.

The steps, in order, and what runs at once (a save of small state waits for four
round trips one after another: 1 and 3 at once; 2; 4's create; 5):

1. **Lease** (:mod:`cairn.protocol._lease`): the save writes its intent,
   ``{id}/intent.{attempt}.json`` (the processes that only upload parts of one save
   share ``{id}/intent.json``), naming the parent its manifest will name (None when it
   carries nothing), and renews it every third of the lease until its commit, whatever
   happens between its steps: GC sweeps nothing of a live lease and keeps the parent's
   chain. One rule for every path: the lease is held from the intent to the commit by
   whoever will commit (a worker that only uploads holds it while it uploads). A lease
   nobody renews lapses; GC may then claim the id (step 4's race). A save in one call
   writes its intent beside its uploads and its read of the parent's manifest (step
   3), and, when it holds no version of ``_latest`` to swap, beside a read of it; the
   fence read and the check of what it builds on (step 2, then 4) come after the intent
   is written, which is all the ordering needs (see "Why the order is safe" below).
2. **Preconditions**: a writer that will commit is not fenced, i.e. no newer writer
   generation holds ``_writer`` (:mod:`cairn.protocol._pointer`); the record read is what
   the parent must be admitted by. And the id is not committed (committed ids are
   immutable). A save in one call reads the fence once, after its intent is written,
   beside the check before the create (step 4); an id it generated itself (a new
   UUIDv7) cannot be committed, and one given is checked beside the uploads. A save in
   two phases (:func:`preconditions`) checks both beside its intent's write, so that a
   writer already fenced is refused before its commit (it reads the fence again before
   its create, as every save does); a process that only uploads part of a save checks
   the id alone (the fence is the committer's to check), beside its intent and its
   uploads. A DCP save waits for these checks before its ranks upload when its id was
   given or it builds on a parent, and otherwise lets them run beside the uploads,
   whose processes each write an intent of their own beside them. A save refused
   removes what it uploaded and its intent.
3. **Uploads** (:mod:`cairn.protocol._upload`): every snapshot and delta goes under ``{base}{id}/``
   with a name carrying this attempt's token (:func:`cairn.format.layout.new_attempt`),
   concurrently and bounded, hashed as it travels (a one-phase save merges small ones
   into packs, each artifact a range of its own); the parent's chains are carried over
   by reference (:mod:`cairn.protocol._chains`); a directory partition's files are uploaded or
   carried one by one (:mod:`cairn.protocol._directories`). Source offsets live in the manifest.
   Nothing is visible to any reader yet. A failure removes this attempt's objects and its intent.
4. **Commit point**: check that every artifact the manifest names is in the store (and,
   for a save that read its parent's manifest beside its intent, that the parent's
   manifest still stands), beside the fence read; then write ``{base}{id}/manifest.json``
   only if absent: **this single write is the commit**. A manifest of more than
   :data:`~cairn.format.manifest.PART_ENTRIES` entries first writes its parts, named by their
   digests, which the manifest then records with their sizes and digests (see
   :mod:`cairn.format.manifest`): still one write commits. GC claims an uncommitted id with a
   tombstone, a create-only write on that very path, so a commit and a claim race for
   one object and the store lets exactly one win. A save in two phases may make this
   check, and the fence read, ahead, beside its last upload (:func:`check_ahead`; a DCP
   save's metadata): it covers what was uploaded before, the create follows at once,
   and the check after the create covers the last upload with everything else. Uploads
   of the same process still running then (a DCP coordinator's own objects, whose
   entries it handed in before their puts ended) count as part of that last upload: the
   create waits for them to end, and the check after it covers them.
5. **Publish**, at once: stop renewing the lease, then advance ``_latest`` by
   compare-and-swap, only forwards, and only if not fenced (fenced there, the commit is
   rolled back: its manifest becomes a tombstone, so its id can never commit again),
   check the artifacts once more, and delete the intents. The swap is conditioned on the
   version of ``_latest`` this checkpointer last wrote or read
   (:class:`cairn.protocol._pointer.PointerHint`): when no one else moved it, no read
   precedes it; when someone did, the swap fails and is retried on a fresh read. Until
   the create has returned, an intent says the save has not finished: a deletion of the
   checkpoint meanwhile retires its id rather than free it for the create this save may
   still retry.

Why the order is safe. Each concurrency above overlaps steps that do not depend on
each other; what does is still ordered:

* *Fencing.* A takeover raises the generation, then claims every save whose intent it
  finds (:func:`cairn.protocol.retention.abort_saves_in_flight`), then claims
  ``_latest``. A save reads the fence only once its intent is written, and creates its
  manifest only after that read. If the read saw the old generation, the raise came
  after it, so the takeover's search for intents came after the intent was written:
  the takeover claims the id, and the create fails. So a fenced writer's commit never
  lands after a takeover completes; one that lands during it fails its swap of
  ``_latest`` (which carries the new generation) and is rolled back.
* *What a save builds on.* The parent's manifest is read beside the intent, so a
  deletion of the parent may run before the intent can protect it. The check before the
  create lists the parent's manifest after the intent is written: if it is still
  there, a deletion of the parent comes later, and its second look
  (:func:`cairn.protocol.retention.look_again`) finds the intent and spares what the
  save builds on; if it is gone, the save fails before its create. What the save
  carries from checkpoints older than its parent is the parent's chain: GC and
  ``delete_checkpoint`` keep every object a standing checkpoint names, so while the
  parent stands, so does all of it, and the checks around the create list only the
  save's own directory and its parent's (one listing each, however many checkpoints
  the chains reach back to). A save in two phases, which reads no parent beside its
  intent, lists every directory it carries from. A GC claims the id
  of a save whose lease lapsed before it sweeps anything it uploaded, so the create
  fails rather than commit over swept objects.
* *The check after the create* runs beside the swap of ``_latest``. It finds something
  missing only when a GC claimed the id, swept it, and removed its tombstone, which GC
  does only once the tombstone is a day old by the store's time: a save stalled that
  long between its check before the create and the create itself (see Limits in the
  reliability documentation). Then the commit is rolled back and ``_latest``, if the
  swap moved it, is moved back to what it named before (best effort: readers verify
  what it names and fall back).
* *The intents* go beside the swap: the create has returned, so no retry of it can
  follow, and a deletion that finds no intent deletes a checkpoint that needs none.

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
  the create (but those of a last upload the check ran beside) and again after it. The
  check before makes the usual failure invisible.
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
import functools
import logging
from collections.abc import Awaitable, Callable

from cairn.errors import (
    BrokenChainError,
    CheckpointAbortedError,
    CheckpointerError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    FencedError,
    InvalidInputError,
    KeySpaceMismatchError,
    NotDurableError,
    ObjectExistsError,
    StoreError,
)
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths, is_attempt_artifact, new_attempt
from cairn.format.manifest import CheckpointManifest, check_manifest, encode_manifest, encode_stored
from cairn.observe import _dispatch
from cairn.protocol import _catalog, _chains, _lease, _pointer, retention
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context
from cairn.stores import Store

__all__ = [
    "Discard",
    "check_ahead",
    "commit",
    "commit_and_publish",
    "discard_uncommitted",
    "preconditions",
    "save_manifest",
    "take_over",
    "update_latest",
]

log = logging.getLogger("cairn")


async def preconditions(
    ctx: Context, cid: CheckpointId, *, commits: bool = True, committed: bool = True
) -> _pointer.WriterRecord | None:
    """Step 2 of a save in two phases, read beside its intent's write, at once.

    A save that ``commits`` must not be fenced (:class:`FencedError`; a damaged
    ``_writer`` is :class:`CorruptManifestError`): returns the writer record read, which
    the parent must be admitted by. With ``committed`` (not for an id the save generated
    itself), ``cid`` must not be committed (:class:`CheckpointExistsError`). A part of a
    save that only uploads returns None.
    """

    async def fence() -> _pointer.WriterRecord | None:
        if not commits:
            return None
        return await _pointer.check_not_fenced(ctx.store, ctx.paths.writer_record(), ctx.generation)

    async def not_committed() -> None:
        if committed and await _catalog.committed(ctx, cid):
            raise CheckpointExistsError(str(cid), ctx.paths.manifest(cid))

    record, absent = await asyncio.gather(fence(), not_committed(), return_exceptions=True)
    for outcome in (record, absent):  # fenced first, as before
        if isinstance(outcome, BaseException):
            raise outcome
    assert not isinstance(record, BaseException)
    return record


async def commit(ctx: Context, manifest: CheckpointManifest) -> CheckpointManifest:
    """Steps 4 and 5 for artifacts the caller uploaded; the committed manifest. The commit
    holds a lease of its own (its intent written before the fence is read, see
    :func:`cairn.protocol._save.start`)."""
    intent = ctx.paths.intent(manifest.checkpoint_id, new_attempt())
    lease = await _lease.Lease.start(ctx.store, intent, manifest.parent_id, ctx.lease)
    try:
        return await commit_and_publish(ctx, manifest, lease)
    finally:
        await lease.stop()


async def commit_and_publish(
    ctx: Context,
    manifest: CheckpointManifest,
    lease: _lease.Lease | None,
    finish: Callable[[CheckpointManifest], CheckpointManifest] | None = None,
    discard: Discard | None = None,
    parent: CheckpointManifest | None = None,
    before_create: Callable[[], Awaitable[None]] | None = None,
    checked: _pointer.WriterRecord | None = None,
) -> CheckpointManifest:
    """Steps 4 and 5, as one observed ``commit``; ``lease`` (if any) stops once the
    manifest is written.

    A save whose uploads are its own (it passes ``discard``) and finds one of them gone
    fails with :class:`CheckpointAbortedError`: only GC removes what a save uploaded,
    having claimed the id once the lease lapsed. ``parent``, the manifest of the
    checkpoint it builds on when the caller read it, must be admitted by the writer
    record the commit reads (:func:`cairn.protocol._chains.check_admitted`).
    ``before_create`` is awaited once the checks before the create passed (a pipelined
    save waits there for the one before it); what it raises ends the save, uncommitted.
    ``checked``: the writer record :func:`check_ahead` read, when it checked every
    artifact of ``manifest`` but those uploaded beside it (a save without ``parent``):
    the create then comes at once.
    """
    cid = manifest.checkpoint_id
    async with _dispatch.observed(None, "commit", checkpoint_id=cid) as op:
        try:
            manifest = await _write_manifest(
                ctx, manifest, finish, discard, parent, before_create, checked
            )
            if lease is not None:
                await lease.stop()  # before its intent goes: a renewal would write it again
            op.manifest = await _publish(
                ctx,
                manifest,
                lease.path if lease is not None else None,
                discard,
                own_only=parent is not None,
            )
        except BrokenChainError as exc:
            if discard is not None and _own_upload(ctx, manifest, exc.link):
                raise CheckpointAbortedError(
                    str(cid),
                    ctx.paths.manifest(cid),
                    f"its own upload {exc.link!r} was swept (its id was claimed once its "
                    "lease lapsed)",
                ) from exc
            raise
        return op.manifest


async def save_manifest(ctx: Context, manifest: CheckpointManifest) -> None:
    """The commit point alone: check the artifacts, create ``manifest`` only if absent,
    check them again (see the module docstring). Raises :class:`BrokenChainError` naming
    the first artifact that is not in the store, and commits nothing then."""
    _check_manifest_input(manifest)
    intent = ctx.paths.intent(manifest.checkpoint_id, new_attempt())
    lease = await _lease.Lease.start(ctx.store, intent, manifest.parent_id, ctx.lease)
    try:
        await lease.written()
        await _check_before_commit(ctx, manifest)
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
    except KeySpaceMismatchError:
        raise  # its own type: partitions of a keyed operator disagree
    except InvalidInputError as exc:
        raise InvalidInputError(f"manifest {manifest.checkpoint_id}: {exc}") from None


async def _create_manifest(ctx: Context, manifest: CheckpointManifest) -> CheckpointManifest:
    """Write ``manifest`` only if no manifest exists for its id: the create itself, after
    the parts of a large one (see :func:`cairn.format.manifest.encode_stored`). Returns the
    manifest as stored, ``parts`` set. The caller has read the fence
    (:func:`_check_before_commit`).

    Parts are named by their digest, so writing one that another writer of the id wrote
    (or this one, on a retry) writes the same bytes; they are never discarded with an
    attempt's uploads for that reason, and GC sweeps those no manifest names.
    """
    _check_manifest_input(manifest)
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
    parent: CheckpointManifest | None = None,
    before_create: Callable[[], Awaitable[None]] | None = None,
    checked: _pointer.WriterRecord | None = None,
) -> CheckpointManifest:
    """The commit point: read the fence and check every artifact is there (at once;
    unless ``checked``, see :func:`commit_and_publish`), then create the manifest.

    ``finish`` completes the manifest once the checks passed (a save adds its stats);
    returns the manifest written. ``discard`` runs whenever the commit surely did not
    happen; without one, the manifest's own attempt-named artifacts are removed, unless
    another writer's commit or GC's claim is what stopped this one (a twin coordinator
    may have committed the very same uploads). ``parent``: see
    :func:`commit_and_publish`. The check after the create is :func:`_publish`'s.
    """
    cid = manifest.checkpoint_id
    own_discard = discard is not None

    async def discard_all(written: CheckpointManifest) -> None:
        await (discard(written) if discard is not None else discard_uncommitted(ctx, written))

    try:
        if checked is not None and parent is None:
            record = checked
        else:
            record = await _check_before_commit(
                ctx, manifest, parent.checkpoint_id if parent is not None else None
            )
        if parent is not None:
            _chains.check_admitted(parent, record)
        if before_create is not None:
            await before_create()
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
    return manifest


async def check_ahead(ctx: Context, uploaded: CheckpointManifest) -> _pointer.WriterRecord | None:
    """Step 4's check before the create, run ahead of the commit: read the fence and
    check that every artifact ``uploaded`` names is in the store, at once; the writer
    record read, or None when either failed (the commit then makes its own check, which
    says why). A save in two phases runs it beside its last upload (see step 4)."""
    try:
        return await _check_before_commit(ctx, uploaded)
    except CheckpointerError:
        return None


async def _check_before_commit(
    ctx: Context, manifest: CheckpointManifest, parent: CheckpointId | None = None
) -> _pointer.WriterRecord:
    """Read the fence and check the artifacts (:func:`_check_before_create`), both at
    once; the writer record read. The caller's intent is written: see the module
    docstring for why the fence is read after it, and why ``parent``'s manifest, the
    checkpoint the caller read to build on, is checked too). Fenced (or a damaged
    ``_writer``) wins over a missing artifact when both are found."""
    fence, present = await asyncio.gather(
        _pointer.check_not_fenced(ctx.store, ctx.paths.writer_record(), ctx.generation),
        _check_before_create(ctx, manifest, parent),
        return_exceptions=True,
    )
    if isinstance(fence, BaseException):
        raise fence
    if isinstance(present, BaseException):
        raise present
    return fence


async def _publish(
    ctx: Context,
    manifest: CheckpointManifest,
    intent: str | None,
    discard: Discard | None = None,
    own_only: bool = False,
) -> CheckpointManifest:
    """After the create, at once: check the artifacts again, swap ``_latest`` (or roll
    back a fenced commit), and remove the intents.

    The intents said until the create returned that the save had not finished: a
    deletion of the checkpoint meanwhile retires its id (see
    :func:`cairn.protocol._lease.retire`), and a takeover retires it. A check after the
    create that fails (see the module docstring) rolls the commit back, and ``_latest``
    off it if the swap moved it; ``discard`` then runs (without one, the manifest's own
    attempt-named artifacts are removed).
    """
    cid = manifest.checkpoint_id
    before = _pointer_before(ctx)
    # Its own intent, and the one its uploading processes share (see start): the create
    # has returned, so no retry of it can follow, and nothing needs them any more.
    ended = [ctx.paths.intent(cid), *([intent] if intent is not None else [])]
    checked, advanced, _ = await asyncio.gather(
        _check_after_create(ctx, manifest, _discarding(ctx, manifest, discard), own_only),
        _advance_or_roll_back(ctx, manifest),
        _remove_intents(ctx, cid, ended),
        return_exceptions=True,
    )
    if isinstance(checked, BaseException):
        if advanced is True:
            await _withdraw(ctx, cid, before)
        raise checked
    if isinstance(advanced, BaseException):
        raise advanced
    return manifest


def _discarding(
    ctx: Context, manifest: CheckpointManifest, discard: Discard | None
) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        await (discard(manifest) if discard is not None else discard_uncommitted(ctx, manifest))

    return run


def _pointer_before(ctx: Context) -> _pointer.LatestPointer | None:
    """``_latest`` as this checkpointer last knew it, to move it back to if the commit
    it is about to name is rolled back (None when unknown or absent)."""
    hint = ctx.hints.latest
    return hint.pointer if hint.known else None


async def _withdraw(ctx: Context, cid: CheckpointId, before: _pointer.LatestPointer | None) -> None:
    """Move ``_latest`` off ``cid``, whose commit was rolled back after the swap named
    it, to what it named ``before``; best effort (readers check what it names)."""
    try:
        await _pointer.withdraw_latest(ctx.store, ctx.paths.latest_pointer(), cid, before)
    except CheckpointerError as exc:
        log.warning("could not move _latest off %s, rolled back: %s", cid, exc)
    finally:
        ctx.hints.latest.forget()


async def _remove_intents(ctx: Context, cid: CheckpointId, ended: list[str]) -> None:
    try:
        await ctx.store.delete(ended)
    except CheckpointerError as exc:  # they go with the checkpoint, retired
        log.info("could not remove the intents of committed %s: %s", cid, exc)


async def _advance_or_roll_back(ctx: Context, manifest: CheckpointManifest) -> bool:
    """Advance ``_latest`` to ``manifest`` (whether it moved); roll the commit back if a
    takeover fenced it."""
    cid = manifest.checkpoint_id
    try:
        try:
            return await _pointer.advance_latest(
                ctx.store,
                ctx.paths.latest_pointer(),
                cid,
                manifest.epoch,
                ctx.generation,
                hint=ctx.hints.latest,
            )
        except StoreError as exc:
            # The checkpoint is committed; _latest is only a hint (readers fall back to
            # listing), so a swap that ran out of retries does not fail the save. But the
            # swap is where a takeover is noticed: check the fence instead.
            ctx.hints.latest.forget()
            await _pointer.check_not_fenced(ctx.store, ctx.paths.writer_record(), ctx.generation)
            log.warning("checkpoint %s is committed, _latest not advanced: %s", cid, exc)
            return False
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
    await discard_uncommitted(ctx, manifest)


async def _manifest_is(ctx: Context, cid: CheckpointId, body: bytes) -> bool:
    """True when the manifest stored for ``cid`` is exactly ``body``."""
    try:
        blob = await ctx.store.get(ctx.paths.manifest(cid))
    except CheckpointNotFoundError:
        return False
    return bytes(blob.data) == body


async def _check_before_create(
    ctx: Context, manifest: CheckpointManifest, parent: CheckpointId | None = None
) -> None:
    """Check every artifact is there before the create; say why when one is not.

    A missing artifact is :class:`CheckpointExistsError` when another writer committed
    the id meanwhile, :class:`CheckpointAbortedError` when GC claimed it or swept this
    checkpoint's own uploads, else :class:`BrokenChainError` naming the first missing one.
    """
    cid = manifest.checkpoint_id
    # With its parent listed after its intent, a save checks what it uploaded and what
    # its parent owns; what it carries from older checkpoints is the parent's chain,
    # which stands while the parent does (see "What a save builds on").
    owners = frozenset({cid, parent}) if parent is not None else None
    try:
        await _check_artifacts_present(ctx, manifest, parent=parent, owners=owners)
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
    own_only: bool = False,
) -> None:
    """The check after the create (see the module docstring): roll back if one is gone,
    or if the check itself fails (a :class:`StoreError`: the commit is not confirmed).
    ``discard`` runs once the manifest is rolled back; a rollback that fails leaves the
    manifest, and every artifact it names, standing, and raises the check's error."""
    cid = manifest.checkpoint_id
    path = ctx.paths.manifest(cid)
    try:
        owners = frozenset({cid}) if own_only else None
        await _check_artifacts_present(ctx, manifest, written=True, owners=owners)
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
    ctx: Context,
    manifest: CheckpointManifest,
    written: bool = False,
    parent: CheckpointId | None = None,
    owners: frozenset[CheckpointId] | None = None,
) -> None:
    """Raise :class:`BrokenChainError` unless every entry's object (and, once the
    manifest is ``written``, every part of it; and ``parent``'s manifest, when given)
    is in the store.

    One listing per directory that holds entries (this checkpoint's, and those of the
    checkpoints it carries entries from; with ``owners``, only the entries those own),
    sizes checked: a whole object's exactly, a pack's at least to the end of the
    furthest range the manifest names in it.
    """
    cid = manifest.checkpoint_id
    wanted: dict[str, dict[str, tuple[int, bool]]] = {}
    for entry_owner, relative, size in manifest.stored_objects():
        owner = entry_owner or cid
        if owners is not None and owner not in owners:
            continue
        wanted.setdefault(ctx.paths.checkpoint_dir(owner), {})[
            ctx.paths.resolve(owner, relative)
        ] = (size, ctx.paths.is_pack(relative))
    for part in manifest.parts if written else ():
        own = wanted.setdefault(ctx.paths.checkpoint_dir(cid), {})
        own[ctx.paths.resolve(cid, part.path)] = (part.size_bytes, False)
    if parent is not None:
        # The parent's manifest, committed (not a tombstone: at least a byte), listed
        # after this save's intent was written: a deletion of the parent that comes
        # later finds the intent, and spares what it builds on (see the module docstring).
        parent_dir = wanted.setdefault(ctx.paths.checkpoint_dir(parent), {})
        parent_dir[ctx.paths.manifest(parent)] = (1, True)

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


async def discard_uncommitted(ctx: Context, manifest: CheckpointManifest) -> None:
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


async def take_over(store: Store, paths: CheckpointPaths) -> int:
    """Become the writer of the store ``paths`` lay out: raise the writer generation above
    every one visible, end every save in flight (each one's id claimed, see
    :func:`cairn.protocol.retention.abort_saves_in_flight`), then claim ``_latest`` for
    the new generation (:func:`cairn.protocol._pointer.take_over`); the new generation."""

    async def abort_older_saves(generation: int) -> None:
        await retention.abort_saves_in_flight(store, paths)

    return await _pointer.take_over(
        store, paths.writer_record(), paths.latest_pointer(), abort_older_saves
    )
