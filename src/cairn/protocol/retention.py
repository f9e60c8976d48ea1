"""Retention policies and garbage collection: keep what matters, reclaim the rest safely.

:func:`read_state` reads the store (one listing, the manifests, the intents of saves in
progress, the ``_latest`` pointer); :func:`plan_gc` is pure and decides what goes;
:func:`run_gc` reads, claims, plans and executes. Invariants:

* never deleted: a retained or pinned checkpoint; the checkpoint ``_latest`` names and
  every committed checkpoint newer than it (the pointer only moves forwards, so at any
  moment of the deletion it names one of those), and, when there is no usable pointer,
  every committed checkpoint; any object a kept checkpoint's chain references, wherever
  it lives; a checkpoint whose manifest does not decode, or misses a part (left alone and
  reported in :attr:`GcResult.damaged`; ``failures`` are only deletions that failed);
* a run that meets a manifest (root or part) a newer cairn wrote, which requires format
  features this cairn does not know, deletes and claims nothing at all: that manifest
  may name any object of the store, whatever checkpoint wrote it. The run reports it
  (:attr:`GcResult.newer_format`) and writes nothing; should the second look meet one
  (committed while the run went), no artifact is deleted;
* only objects whose names cairn writes are deleted (:func:`cairn.format.layout.is_cairn_name`):
  the store's root is the default base, and a bucket shared with other data may hold
  another application's objects under a prefix named like a checkpoint id. They are left
  alone and reported (:attr:`GcResult.foreign_objects`), and play no part in the plan (a
  directory holding only such objects is never claimed; they keep no tombstone standing);
* a save in progress is never swept: a directory whose intent holds a live lease, or
  that has an object younger than ``min_age``, is left whole and its parent's chain kept.
  Any other uncommitted directory is swept only after GC has claimed its id with a
  tombstone, which the save's own commit races for: one of the two wins, never both
  (docs/format.md, "Tombstones");
* on a local directory, what a write killed mid-way left in a directory GC has claimed
  (a staging file, which no listing shows) is removed after the orphans
  (:attr:`GcResult.staging_files_deleted`): the tombstone there means no write in it can
  still commit. Staging files anywhere else are left alone: they may be a save's writes
  in progress;
* deletion goes in two phases: every manifest to delete first, then the artifacts, so a
  crash mid-GC never leaves a listed checkpoint with missing artifacts — only orphans,
  which the next run sweeps (GC is idempotent and resumable); a checkpoint whose manifest
  could not be deleted is still listed, so it keeps everything it names, as a kept one,
  and is not reported deleted;
* before the artifact phase, GC looks again (:func:`look_again`) for checkpoints
  committed and saves started since it planned, and spares everything they reference;
  a save building on a checkpoint being deleted whose lease lapsed meanwhile is claimed
  first, so that it can never commit naming what goes;
* every age is judged by the store's own time, never by this machine's clock: GC writes
  ``{base}_clock`` and reads back the ``last_modified`` the store stamped on it
  (:func:`store_now`), and compares that with the stamps the store put on leases,
  tombstones and artifacts. A GC whose clock runs days ahead or behind therefore decides
  exactly what a GC with a true clock would (``keep_within`` compares with the
  ``timestamp_ms`` writers record in their manifests, a retention rule, not a safety one);
* a run that has nothing to delete or claim writes nothing, not even ``_clock``: the plan
  made as late as time goes deletes and claims the most any plan can, so when it does
  neither, no reading of the store's time could change that (a read-only store can be
  collected when there is nothing to collect, and says so when there is);
* in a committed directory GC deletes only what the manifest names, and only when the
  checkpoint goes. What else is there (attempt-named uploads of another writer of the
  same id, an intent) may belong to a writer stalled at its commit point, which would
  commit over them the moment the manifest is gone: it stays whole, and once the
  manifest is gone a later run judges it as an uncommitted directory (claimed once its
  lease lapsed, then swept). A doomed checkpoint whose directory still holds an intent
  is retired instead of deleted: its manifest becomes a
  tombstone, because the save that wrote it may still retry the create;
* reachability is by object path, packs included: a pack (many small artifacts of one
  save, each a byte range of it) is kept whole while any kept checkpoint names a range
  in it, even when the checkpoint that wrote it is deleted and the others no longer
  need most of it. So is a DCP rank object (an object of ranges, a tensor each) that a
  later incremental save carries some tensors of. The plan reports what that costs:
  the bytes of the packs and carried objects kept for kept checkpoints against the
  bytes of them those still use (:attr:`GcPlan.pack_bytes`,
  :attr:`GcPlan.pack_range_bytes`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping

from cairn.errors import CheckpointerError, InvalidInputError, NewerFormatError
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.protocol._gcclaims import abort_saves_in_flight, claim_all, claim_saves_on, look_again
from cairn.protocol._gcplan import (
    StoreState,
    plan_gc,
    plan_with,
    reachable,
    uncommitted_dirs,
    uncommitted_dirs_of,
)
from cairn.protocol._gcpolicy import KEPT_REASONS, GcPlan, GcResult, RetentionPolicy, span_text
from cairn.protocol._gcstate import read_state, read_state_and_owners, store_now
from cairn.protocol._lease import retire
from cairn.protocol._manifestcache import ManifestCache
from cairn.stores import ObjectInfo, Store, remove_staging_files

__all__ = [
    "KEPT_REASONS",
    "GcPlan",
    "GcResult",
    "RetentionPolicy",
    "StoreState",
    "abort_saves_in_flight",
    "claim_saves_on",
    "look_again",
    "plan_gc",
    "read_state",
    "run_gc",
    "span_text",
    "store_now",
    "uncommitted_dirs",
]

log = logging.getLogger("cairn.gc")


async def run_gc(
    store: Store,
    paths: CheckpointPaths,
    policy: RetentionPolicy,
    *,
    dry_run: bool,
    min_age: dt.timedelta,
    cache: ManifestCache | None = None,
) -> GcResult:
    """Plan and (unless a dry run) execute a GC over a store; see the module docstring.

    A run that has nothing to delete or claim writes nothing (so it works on a store it
    may only read). A run that meets a manifest a newer cairn wrote deletes and claims
    nothing, and reports it (:attr:`GcResult.newer_format`).

    Args:
        store: The store.
        paths: The checkpoint layout.
        policy: Which committed checkpoints to keep.
        dry_run: Report what a run would do, and write nothing.
        min_age: An uncommitted directory with an object younger than this is left
            alone (a save in progress), >= 0.
        cache: Manifests an earlier run read, used while the listing shows them
            unchanged, by path, size and e-tag (a checkpointer keeps one).

    Returns:
        What the run did (or would do).

    Raises:
        InvalidInputError: ``min_age`` or ``policy`` is unusable, or a pinned checkpoint
            does not exist.
        StoreError: The run must write and the store refuses writes (the message names
            ``{base}_clock``); nothing was changed.
    """
    if not isinstance(min_age, dt.timedelta) or min_age < dt.timedelta(0):
        raise InvalidInputError(f"min_age must be a timedelta >= 0, got {min_age!r}")
    if not isinstance(policy, RetentionPolicy):
        raise InvalidInputError(f"gc takes a RetentionPolicy, got {policy!r}")
    state, owners = await read_state_and_owners(store, paths, cache)
    if state.newer:
        return _untouched(state, dry_run=dry_run)
    unknown_pins = [cid for cid in policy.pinned if cid not in state.manifests]
    if unknown_pins:
        raise InvalidInputError(f"pinned checkpoint {unknown_pins[0]} does not exist")
    for cid, why in state.damaged.items():
        log.warning("gc leaves damaged checkpoint %s alone: %s", cid, why)
    if dry_run or not _may_write(paths, state, policy, owners, min_age=min_age):
        # Nothing is written, not even the probe, and nothing deleted: this machine's clock
        # is safe for the report.
        return _report(paths, state, policy, owners, min_age=min_age, dry_run=dry_run)
    # After the listing, so every stamp in it is older.
    now = await store_now(store, paths)
    busy, abandoned = uncommitted_dirs_of(state, owners, now=now, min_age=min_age)
    claimed = await claim_all(store, paths, abandoned)
    plan = plan_with(paths, state, policy, owners, busy, now=now, min_age=min_age, claimed=claimed)
    result = _result(state, plan, dry_run=False)
    sizes = {info.path: info.size for info in state.objects}
    # Phase 1: the manifests, so nothing half-deleted is ever listed.
    standing: set[CheckpointId] = set()
    listed = {info.path: info for info in state.objects}
    for cid, path in zip(plan.deleted, plan.manifests_to_delete, strict=True):
        if cid in plan.retired:
            gone = await _retire(store, listed[path], result)
        else:
            gone = await _delete(store, path, result)
        if gone:
            result.bytes_reclaimed += sizes.get(path, 0)
        else:
            standing.add(cid)  # still listed: it keeps whatever it names, as a kept one
    result.deleted = [cid for cid in plan.deleted if cid not in standing]
    # Phase 2: look again for saves that started or committed since the plan.
    try:
        spared_whole, spared = await look_again(
            store, paths, state.manifests, set(result.deleted), min_age=min_age, cache=cache
        )
    except NewerFormatError as exc:
        # Committed since the reading: it may name anything, so no artifact goes.
        owner = paths.checkpoint_of(exc.path)
        if owner is None:
            raise  # not a manifest of this base: nothing more is deleted either way
        _say_newer({owner: exc})
        result.newer_format = {owner: str(exc)}
        return result
    kept_whole, kept = reachable(paths, standing, state.manifests)
    spared_whole |= kept_whole
    spared |= kept
    orphan_paths = {info.path for info in plan.orphans}
    for info in [*plan.objects_to_delete, *plan.orphans]:
        if info.path in spared or paths.checkpoint_of(info.path) in spared_whole:
            continue
        if await _delete(store, info.path, result):
            result.bytes_reclaimed += info.size
            if info.path in orphan_paths:
                result.orphans_deleted.append(info.path)
    for cid in sorted(claimed | state.tombstones.keys()):
        await _remove_staging(store, paths.checkpoint_dir(cid), result)
    return result


_END_OF_TIME = dt.datetime.max.replace(tzinfo=dt.UTC)


def _may_write(
    paths: CheckpointPaths,
    state: StoreState,
    policy: RetentionPolicy,
    owners: list[CheckpointId | None],
    *,
    min_age: dt.timedelta,
) -> bool:
    """False when no run over ``state`` can delete or claim anything, whatever the time.

    The plan made as late as time goes is the largest there is: a later "now" only lapses
    more leases, ages more objects past ``min_age`` and tombstones past their retention,
    and keeps fewer checkpoints by ``keep_within``. When even it deletes and claims
    nothing, the store's time (:func:`store_now`, a write) is not worth reading.
    """
    busy, abandoned = uncommitted_dirs_of(state, owners, now=_END_OF_TIME, min_age=min_age)
    if abandoned:
        return True
    plan = plan_with(
        paths, state, policy, owners, busy, now=_END_OF_TIME, min_age=min_age, claimed=()
    )
    return bool(plan.manifests_to_delete or plan.objects_to_delete or plan.orphans)


def _report(
    paths: CheckpointPaths,
    state: StoreState,
    policy: RetentionPolicy,
    owners: list[CheckpointId | None],
    *,
    min_age: dt.timedelta,
    dry_run: bool,
) -> GcResult:
    """What a run would do at this machine's time, without writing or deleting anything:
    every abandoned directory counted as claimed."""
    now = dt.datetime.now(dt.UTC)
    busy, abandoned = uncommitted_dirs_of(state, owners, now=now, min_age=min_age)
    plan = plan_with(
        paths, state, policy, owners, busy, now=now, min_age=min_age, claimed=abandoned
    )
    result = _result(state, plan, dry_run=dry_run)
    sizes = {info.path: info.size for info in state.objects}
    doomed = [*plan.objects_to_delete, *plan.orphans]
    result.bytes_reclaimed = sum(sizes.get(p, 0) for p in plan.manifests_to_delete) + sum(
        info.size for info in doomed
    )
    result.orphans_deleted = [info.path for info in plan.orphans]
    return result


def _untouched(state: StoreState, *, dry_run: bool) -> GcResult:
    """The result of a run that met manifests a newer cairn wrote: nothing deleted,
    nothing claimed, every checkpoint it could read retained, and each it could not
    named in :attr:`GcResult.newer_format`."""
    _say_newer(state.newer)
    return GcResult(
        retained=sorted(state.manifests),
        dry_run=dry_run,
        damaged=dict(state.damaged),
        newer_format={cid: str(exc) for cid, exc in sorted(state.newer.items())},
    )


def _say_newer(newer: Mapping[CheckpointId, NewerFormatError]) -> None:
    for cid, exc in sorted(newer.items()):
        log.warning("checkpoint %s needs a newer cairn: nothing deleted (%s)", cid, exc)


def _result(state: StoreState, plan: GcPlan, *, dry_run: bool) -> GcResult:
    """The result of ``plan`` before anything is deleted."""
    return GcResult(
        retained=plan.retained,
        deleted=plan.deleted,
        dry_run=dry_run,
        reasons=plan.reasons,
        pack_bytes=plan.pack_bytes,
        pack_range_bytes=plan.pack_range_bytes,
        damaged=dict(state.damaged),
        foreign_objects=plan.foreign,
    )


async def _retire(store: Store, listed: ObjectInfo, result: GcResult) -> bool:
    """:func:`cairn.protocol._lease.retire` the manifest listed as ``listed``; whether it is gone
    (a failure, or a manifest replaced since, is recorded in ``result``)."""
    try:
        retired = await retire(store, listed)
    except CheckpointerError as exc:
        log.warning("gc could not retire %s: %s", listed.path, exc)
        result.failures.append((listed.path, str(exc)))
        return False
    if not retired:
        result.failures.append((listed.path, "replaced by another manifest since the listing"))
        return False
    result.objects_deleted += 1
    return True


async def _remove_staging(store: Store, directory: str, result: GcResult) -> None:
    """Remove the staging files that writes killed mid-way left in ``directory``, claimed
    (a tombstone stands there, so no write in it can still commit); recorded in
    ``result``, or as a failure."""
    try:
        result.staging_files_deleted += await remove_staging_files(store, directory)
    except CheckpointerError as exc:
        log.warning("gc could not remove the staging files in %s: %s", directory, exc)
        result.failures.append((directory, str(exc)))


async def _delete(store: Store, path: str, result: GcResult) -> bool:
    try:
        await store.delete([path])
    except CheckpointerError as exc:
        log.warning("gc could not delete %s: %s", path, exc)
        result.failures.append((path, str(exc)))
        return False
    result.objects_deleted += 1
    return True
