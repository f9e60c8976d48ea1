"""Claims and the second look: what a deletion does between its manifests and its objects.

Invariants: a save in progress that builds on a checkpoint being deleted is claimed (its
id tombstoned, see :mod:`cairn.protocol._lease`) before anything it could commit naming
is deleted, once its lease lapsed by the store's time (any lease, for a forced
deletion); and once the manifests are gone, the store is read again and whatever a
checkpoint committed since, or a save in progress, references is spared. Meeting a
manifest a newer cairn wrote stops the deletion (:class:`~cairn.errors.NewerFormatError`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping

from cairn.errors import (
    CheckpointNotFoundError,
    IntegrityError,
)
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest, decode_root
from cairn.protocol._gcplan import (
    StoreState,
    all_parents,
    parents_of,
    reachable,
    uncommitted_dirs,
)
from cairn.protocol._gcstate import read_state, store_now
from cairn.protocol._lease import (
    claim,
)
from cairn.protocol._manifestcache import ManifestCache
from cairn.protocol._parts import read_whole
from cairn.stores import Store

__all__ = [
    "abort_saves_in_flight",
    "claim_all",
    "claim_saves_on",
    "look_again",
]

log = logging.getLogger("cairn.gc")


async def look_again(
    store: Store,
    paths: CheckpointPaths,
    known: Mapping[CheckpointId, CheckpointManifest],
    doomed: set[CheckpointId],
    *,
    min_age: dt.timedelta,
    claim_live: bool = False,
    cache: ManifestCache | None = None,
) -> tuple[set[CheckpointId], set[str]]:
    """The second phase of every deletion (GC's, or one checkpoint's): what to spare.

    Called once the manifests of the doomed checkpoints are deleted and before their
    objects are: reads the store again. What is spared is the checkpoints committed
    since the manifests the deletion was planned from were read, and the parents of
    saves in progress (a live lease, or an object younger than ``min_age``), by the
    store's time.

    A save building on a doomed checkpoint whose lease lapsed is claimed first (its
    tombstone written, see docs/format.md, "Tombstones"): a lapsed lease may be a paused process,
    not a dead one, and once claimed it can never commit naming what is deleted next. One
    whose claim finds it committed instead is spared like the others. (A save whose
    intent appears only after this reading reads its parent's manifest after it: the
    manifest is gone, and that save fails before it uploads.) With ``claim_live`` (a
    forced deletion) every save building on a doomed checkpoint, or on one that carries
    a doomed checkpoint's objects, is claimed, its lease live or not: it could only
    commit naming what goes.

    Args:
        store: The store.
        paths: The checkpoint layout.
        known: The manifests the deletion was planned from, by id.
        doomed: The checkpoints being deleted.
        min_age: An uncommitted directory with an object younger than this is busy.
        claim_live: Claim saves building on what goes even while their lease is live.
        cache: Manifests read before, used while the listing shows them unchanged.

    Returns:
        The checkpoints to keep whole, and the object paths they reference.

    Raises:
        NewerFormatError: A manifest a newer cairn wrote was met: nothing may then be
            deleted.
    """
    state = await read_state(store, paths, cache)
    if state.newer:
        raise next(iter(state.newer.values()))
    now = await store_now(store, paths)
    busy, _ = uncommitted_dirs(state, paths, now=now, min_age=min_age)
    everything = {**known, **state.manifests}
    late = await claim_saves_on(
        store, paths, state, everything, doomed, now=now, min_age=min_age, live=claim_live
    )
    everything.update(late)
    # A save whose intent was listed but gone when read may have committed since the
    # listing: what it committed, it carries.
    for cid in sorted(state.ended - set(late)):
        committed = await _read_manifest(store, paths, cid)
        if committed is not None:
            late[cid] = everything[cid] = committed
    fresh = (set(state.manifests) | set(late)) - set(known)
    # Every directory a save in progress builds on is spared, committed or not (its
    # manifest may be gone: the save read it before).
    return reachable(paths, fresh | all_parents(busy), everything)


async def claim_saves_on(
    store: Store,
    paths: CheckpointPaths,
    state: StoreState,
    manifests: Mapping[CheckpointId, CheckpointManifest],
    doomed: set[CheckpointId],
    *,
    now: dt.datetime,
    min_age: dt.timedelta,
    live: bool,
) -> dict[CheckpointId, CheckpointManifest]:
    """Claim the saves in progress that build on a checkpoint being deleted and whose
    lease lapsed.

    Args:
        store: The store.
        paths: The checkpoint layout.
        state: What GC read from the store (the saves in progress).
        manifests: The committed manifests known, by id.
        doomed: The checkpoints being deleted.
        now: The store's time, which leases are judged by.
        min_age: An uncommitted directory with an object younger than this is busy.
        live: Claim every such save, its lease live or not, and also those building on
            a checkpoint of ``manifests`` that carries a doomed one's objects, which a
            forced deletion breaks too.

    Returns:
        The manifests of those whose claim found them committed meanwhile (each read
        whole; one that does not decode is left out).

    Raises:
        NewerFormatError: One of those was written by a newer cairn.
    """
    busy, abandoned = uncommitted_dirs(state, paths, now=now, min_age=min_age)
    candidates = abandoned
    if live:
        candidates = abandoned | set(busy)
        doomed = doomed | {cid for cid, m in manifests.items() if _carries(m, doomed)}
    building = {cid for cid in candidates if parents_of(state, cid) & doomed}
    committed = building - await claim_all(store, paths, building)
    late = {cid: await _read_manifest(store, paths, cid) for cid in sorted(committed)}
    return {cid: manifest for cid, manifest in late.items() if manifest is not None}


async def abort_saves_in_flight(store: Store, paths: CheckpointPaths) -> None:
    """What a takeover does between raising the writer generation and claiming
    ``_latest``: claim the id of every save in flight.

    Every way to save writes its intent before it reads the fence, so
    one that read an older generation has its intent in the store by now, and each
    uncommitted directory holding an intent is claimed (a tombstone: its create will
    fail). A save either read the new generation and stops, or committed before this
    listing (before the takeover claims ``_latest``), or can no longer commit. One
    listing, and a create-only write per save in flight.

    Args:
        store: The store.
        paths: The checkpoint layout.
    """
    objects = await store.list(paths.base_prefix)
    listed = {info.path for info in objects}
    saving = {
        cid
        for info in objects
        if paths.is_intent_path(info.path) and (cid := paths.checkpoint_of(info.path))
    }
    for cid in sorted(saving):
        if paths.manifest(cid) not in listed:
            await claim(store, paths.manifest(cid))


def _carries(manifest: CheckpointManifest, owners: set[CheckpointId]) -> bool:
    """Whether ``manifest`` names an object of one of ``owners``."""
    return any(owner in owners for owner, _, _ in manifest.stored_objects())


async def _read_manifest(
    store: Store, paths: CheckpointPaths, cid: CheckpointId
) -> CheckpointManifest | None:
    """``cid``'s whole manifest (parts read); None when it is gone or does not decode (a
    deletion then spares nothing for it: what it names cannot be known, and a damaged
    checkpoint does not load anyway). One a newer cairn wrote raises
    :class:`NewerFormatError`: a deletion must then stop, as it may need anything."""
    path = paths.manifest(cid)
    try:
        root = decode_root(path, (await store.get(path)).data)
        return await read_whole(store, paths, path, root)
    except (CheckpointNotFoundError, IntegrityError):
        return None


async def claim_all(
    store: Store, paths: CheckpointPaths, abandoned: Iterable[CheckpointId]
) -> set[CheckpointId]:
    """Claim each abandoned id (see :mod:`cairn.protocol._lease`); the ones claimed."""
    claimed: set[CheckpointId] = set()
    for cid in sorted(abandoned):
        if await claim(store, paths.manifest(cid)):
            claimed.add(cid)
        else:
            log.info("gc spares %s: it committed while gc was planning", cid)
    return claimed
