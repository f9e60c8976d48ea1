"""Deleting a committed checkpoint, and what deleting one would break.

Deletion is part of the commit protocol, written down in :mod:`cairn.protocol._commit`
(its last invariant): it never breaks another committed checkpoint nor a save in
progress that builds on the one deleted (:class:`~cairn.errors.CheckpointInUseError`,
unless forced); it removes the manifest first, so a half-deleted checkpoint is never
listed, and then moves ``_latest`` off it, by compare-and-swap, to the newest checkpoint
that remains. It decides as GC does (:mod:`cairn.protocol.retention`), by the store's
time, and looks again once the manifest is gone. Like GC, it deletes nothing while the
store holds a checkpoint whose manifest a newer cairn wrote
(:class:`~cairn.errors.NewerFormatError`): what that manifest names cannot be known.
"""

from __future__ import annotations

import datetime as dt

from cairn.errors import CheckpointInUseError, NewerFormatError
from cairn.format.ids import CheckpointId
from cairn.format.layout import is_cairn_name
from cairn.format.manifest import CheckpointManifest
from cairn.protocol import _catalog, _lease, _pointer, retention
from cairn.protocol._context import Context, check_id
from cairn.stores import capabilities_of

__all__ = ["delete_checkpoint", "dependents"]


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
    tools. :func:`delete_checkpoint` decides by the store's time. While the store holds
    a checkpoint a newer cairn wrote, what needs ``checkpoint_id`` cannot be known: raises
    that :class:`NewerFormatError`, as :func:`delete_checkpoint` refuses.
    """
    check_id(checkpoint_id)
    state = await retention.read_state(ctx.store, ctx.paths)
    if state.newer:
        raise state.newer.get(checkpoint_id, next(iter(state.newer.values())))
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

    While the store holds a checkpoint whose manifest (or a part of it) a newer cairn
    wrote, this refuses with that :class:`NewerFormatError` and writes nothing, also with
    ``force``: ``force`` breaks the dependents this cairn can see, but what such a
    manifest names cannot be known (any object of the store, the one deleted included),
    nor, when it is the one deleted, which of the objects in its directory are its own
    or how its format must be deleted. A cairn that knows its features deletes it.
    """
    check_id(checkpoint_id)
    state = await retention.read_state(ctx.store, ctx.paths)
    if state.newer:
        raise state.newer.get(checkpoint_id, next(iter(state.newer.values())))
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
        except NewerFormatError:
            target = None  # the pointer goes: readers rank, and meet it first
        break
    await _pointer.retreat_latest(ctx.store, ctx.paths.latest_pointer(), deleted, target)
