"""The GC plan: what a store reading lets GC delete, decided without I/O.

Invariant: :func:`plan_gc` never plans to delete a retained or pinned checkpoint, the one
``_latest`` names or any newer one (every one when there is no usable pointer), a busy
uncommitted directory (a live lease, or an object younger than ``min_age``, judged at
the ``now`` given) or what it builds on, nor any object a kept checkpoint's chains
name, wherever it lives; and only objects whose names cairn writes. The whole rule set
is written in :mod:`cairn.protocol.retention`'s docstring.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cairn.errors import (
    NewerFormatError,
)
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths, is_cairn_name
from cairn.format.manifest import CheckpointManifest
from cairn.protocol._gcpolicy import GcPlan, RetentionPolicy
from cairn.protocol._lease import (
    TOMBSTONE_RETENTION,
    Intent,
    is_live,
    stamp_margin,
)
from cairn.protocol._pointer import LatestPointer
from cairn.stores import ObjectInfo

__all__ = [
    "ManifestPaths",
    "StoreState",
    "all_parents",
    "owners_of",
    "parents_of",
    "plan_gc",
    "plan_with",
    "reachable",
    "uncommitted_dirs",
    "uncommitted_dirs_of",
]

log = logging.getLogger("cairn.gc")


_DAWN = dt.datetime.min.replace(tzinfo=dt.UTC)


def _before(now: dt.datetime, span: dt.timedelta) -> dt.datetime:
    """``now - span``, or the earliest time there is when ``span`` reaches past it (a
    ``min_age`` of 999999999 days: nothing is that old)."""
    try:
        return now - span
    except OverflowError:
        return _DAWN


@dataclass(frozen=True, slots=True)
class StoreState:
    """What GC read from the store: pure data for :func:`plan_gc`.

    Attributes:
        manifests: The committed checkpoints' manifests, each read whole, by id.
        objects: Every object listed under the base prefix.
        intents: Of uncommitted directories only: each save attempt's intent (see
            :meth:`CheckpointPaths.intent`) as listed, with what it says (None where it
            does not decode).
        tombstones: Of uncommitted directories only: each tombstone as listed.
        damaged: Committed directories whose manifest does not decode, each with why
            (GC leaves them alone: what they reference cannot be known).
        latest: The ``_latest`` pointer as read, or None.
        fenced: The checkpoints the writer record's fences name (where a fenced
            generation ended, see docs/format.md, "``_writer`` and fences").
        ended: Uncommitted directories whose intent was listed but was gone when read:
            their save ended meanwhile, committed (its manifest is there now) or not.
        newer: Committed checkpoints whose manifest (or a part of it) a newer cairn
            wrote: what they name cannot be known, so nothing may be deleted.
    """

    manifests: dict[CheckpointId, CheckpointManifest]
    objects: list[ObjectInfo]
    intents: dict[CheckpointId, list[tuple[ObjectInfo, Intent | None]]]
    tombstones: dict[CheckpointId, ObjectInfo]
    damaged: dict[CheckpointId, str]
    latest: LatestPointer | None
    fenced: frozenset[CheckpointId] = frozenset()
    ended: frozenset[CheckpointId] = frozenset()
    newer: Mapping[CheckpointId, NewerFormatError] = field(default_factory=dict)


def uncommitted_dirs(
    state: StoreState, paths: CheckpointPaths, *, now: dt.datetime, min_age: dt.timedelta
) -> tuple[dict[CheckpointId, frozenset[CheckpointId]], set[CheckpointId]]:
    """Split uncommitted directories into those to leave alone and those to reclaim.

    Tombstoned directories are in neither: they are dead.

    Args:
        state: What GC read from the store.
        paths: The checkpoint layout.
        now: The store's time, which leases and ages are judged by.
        min_age: A directory with an object younger than this is busy.

    Returns:
        ``(busy, abandoned)``: ``busy`` maps each directory GC must not touch (a live
        lease, or an object younger than ``min_age``) to the parents its intents name
        (their chains are protected too; two writers of one id may build on two);
        ``abandoned`` holds the unclaimed ones with neither, which GC claims before it
        sweeps them.
    """
    return uncommitted_dirs_of(state, owners_of(paths, state.objects), now=now, min_age=min_age)


def owners_of(paths: CheckpointPaths, objects: list[ObjectInfo]) -> list[CheckpointId | None]:
    """The checkpoint whose directory holds each object cairn wrote, in order; None for an
    object in no checkpoint's directory, and for one whose name cairn never writes
    (:func:`cairn.format.layout.is_cairn_name`), which GC neither counts nor deletes.

    Computed once per listing (:func:`run_gc` hands it from the reading to the plan):
    planning walks the objects several times, and a lookup per walk per object is most of
    a plan's time over tens of thousands of objects.
    """
    owner_of = paths.checkpoint_of
    owners: list[CheckpointId | None] = []
    for info in objects:
        cid = owner_of(info.path)
        if cid is not None and not is_cairn_name(_relative(paths, info.path)):
            cid = None
        owners.append(cid)
    return owners


def _relative(paths: CheckpointPaths, path: str) -> str:
    """``path``, in a checkpoint's directory, relative to that directory."""
    return path[len(paths.base_prefix) :].partition("/")[2]


def _foreign(
    paths: CheckpointPaths, objects: list[ObjectInfo], owners: list[CheckpointId | None]
) -> list[str]:
    """The objects in checkpoints' directories that cairn did not write (see
    :func:`owners_of`), sorted."""
    return sorted(
        info.path
        for info, cid in zip(objects, owners, strict=True)
        if cid is None and paths.checkpoint_of(info.path) is not None
    )


def uncommitted_dirs_of(
    state: StoreState,
    owners: list[CheckpointId | None],
    *,
    now: dt.datetime,
    min_age: dt.timedelta,
) -> tuple[dict[CheckpointId, frozenset[CheckpointId]], set[CheckpointId]]:
    """:func:`uncommitted_dirs`, given :func:`owners_of` of ``state.objects``."""
    settled = (
        state.manifests.keys() | state.damaged.keys() | state.tombstones.keys() | state.newer.keys()
    )
    newest: dict[CheckpointId, dt.datetime] = {}
    for info, cid in zip(state.objects, owners, strict=True):
        if cid is None or cid in settled:
            continue
        last = newest.get(cid)
        if last is None or info.last_modified > last:
            newest[cid] = info.last_modified
    busy: dict[CheckpointId, frozenset[CheckpointId]] = {}
    abandoned: set[CheckpointId] = set()
    for cid, last in newest.items():
        intents = state.intents.get(cid, [])
        live = any(is_live(info, intent, now) for info, intent in intents)
        if live or last > _before(now, min_age):
            busy[cid] = parents_of(state, cid)
        else:
            abandoned.add(cid)
    # A directory a save in progress builds on is never claimed, committed or not: the
    # save may have read its manifest before a deletion removed it, and carries its
    # objects (a parent that cannot be read any more fails the save, and a deletion's
    # second look spares it, see look_again).
    abandoned -= all_parents(busy)
    return busy, abandoned


class ManifestPaths:
    """The manifest path of each checkpoint id, each built once."""

    def __init__(self, paths: CheckpointPaths) -> None:
        self._paths = paths
        self._known: dict[CheckpointId, str] = {}

    def __call__(self, cid: CheckpointId) -> str:
        known = self._known.get(cid)
        if known is None:
            known = self._known[cid] = self._paths.manifest(cid)
        return known


def _latest_order(
    latest: LatestPointer | None, manifests: Mapping[CheckpointId, CheckpointManifest]
) -> tuple[int, int] | None:
    """The ``(epoch, id)`` order of what ``_latest`` names; None when nothing usable."""
    if latest is None or latest.checkpoint_id is None:
        return None
    cid = latest.checkpoint_id
    epoch = manifests[cid].epoch if cid in manifests else latest.epoch
    return (epoch, cid.uuid.int)


def plan_gc(
    paths: CheckpointPaths,
    state: StoreState,
    policy: RetentionPolicy,
    *,
    now: dt.datetime,
    min_age: dt.timedelta,
    claimed: Iterable[CheckpointId] = (),
) -> GcPlan:
    """Decide what a GC deletes. Pure: no I/O.

    Kept whole: what ``policy`` retains, the checkpoint ``_latest`` names and every
    checkpoint newer than it (``_latest`` only moves forwards, so whatever it names at any
    later moment is one of these), every committed checkpoint when there is no usable
    pointer, the parents of busy uncommitted directories, and whatever all of those
    reference. Swept: the uncommitted directories in ``claimed`` (their ids can never
    commit) and tombstones left alone for :data:`TOMBSTONE_RETENTION`. Only objects whose
    names cairn writes are ever deleted (:attr:`GcPlan.foreign` lists the others).

    Args:
        paths: The checkpoint layout.
        state: What GC read from the store.
        policy: Which committed checkpoints to keep.
        now: The store's time, which leases, ages and tombstones are judged by.
        min_age: An uncommitted directory with an object younger than this is busy.
        claimed: The uncommitted directories GC has claimed.

    Returns:
        The plan.
    """
    owners = owners_of(paths, state.objects)
    busy, _ = uncommitted_dirs_of(state, owners, now=now, min_age=min_age)
    return plan_with(paths, state, policy, owners, busy, now=now, min_age=min_age, claimed=claimed)


def plan_with(
    paths: CheckpointPaths,
    state: StoreState,
    policy: RetentionPolicy,
    owners: list[CheckpointId | None],
    busy: Mapping[CheckpointId, frozenset[CheckpointId]],
    *,
    now: dt.datetime,
    min_age: dt.timedelta,
    claimed: Iterable[CheckpointId],
) -> GcPlan:
    """:func:`plan_gc`, given :func:`owners_of` of ``state.objects`` and the busy
    directories of :func:`uncommitted_dirs_of`."""
    manifests = state.manifests
    now_ms = int(now.timestamp() * 1000)
    why = {
        cid: reasons
        for cid, reasons in policy.reasons(manifests, now_ms).items()
        if cid in manifests or cid in policy.pinned
    }

    def also(ids: Iterable[CheckpointId], reason: str) -> None:
        for cid in ids:
            why.setdefault(cid, []).append(reason)

    order = _latest_order(state.latest, manifests)
    if order is None:
        also(manifests, "no latest pointer")
    else:
        latest = state.latest.checkpoint_id if state.latest is not None else None
        also((cid for cid in manifests if cid == latest), "latest")
        also(
            (
                cid
                for cid, m in manifests.items()
                if cid != latest and (m.epoch, cid.uuid.int) >= order
            ),
            "newer than latest",
        )
    also({p for p in all_parents(busy) if p in manifests}, "base of a save in progress")
    keep = set(why)
    whole, referenced = reachable(paths, keep, manifests)
    also(sorted(whole - keep), "base of a kept incremental")
    doomed = sorted(set(manifests) - whole)
    dead = set(claimed) | set(state.tombstones)
    in_dir: dict[CheckpointId, int] = {}
    for cid in owners:
        if cid is not None:
            in_dir[cid] = in_dir.get(cid, 0) + 1
    manifest_of = ManifestPaths(paths)
    to_delete: list[ObjectInfo] = []
    orphans: list[ObjectInfo] = []
    own = {cid: _own_paths(paths, manifests[cid]) for cid in doomed}
    # A doomed checkpoint a fence names is retired (see cairn.protocol._lease.retire): a fenced
    # writer of its id, stalled before its create, would count as where its generation
    # ended; so is one whose directory still holds an intent (below).
    retired = set(doomed) & state.fenced
    carried = all_parents(busy)
    for info, cid in zip(state.objects, owners, strict=True):
        if cid is None or info.path in referenced or cid in carried:
            continue
        if cid in manifests:
            # A kept checkpoint's directory is left as it is, and a doomed one loses what
            # its manifest names, nothing else. Anything else there (another attempt at
            # the same id, an intent) may belong to a writer stalled at its commit point:
            # its uploads stay whole, so the commit it may still make is sound; once the
            # manifest is gone, a later run sees an uncommitted directory, claims it when
            # its lease lapsed, and sweeps it.
            if cid not in whole and info.path in own[cid]:
                to_delete.append(info)
            elif cid not in whole and paths.is_intent_path(info.path):
                retired.add(cid)
        elif cid in dead:
            is_the_tombstone = info.path == manifest_of(cid)
            # Judged by the store's time: a tombstone outlives any local clock's error.
            margin = stamp_margin(info.last_modified, now)
            expired = in_dir[cid] == 1 and info.last_modified + margin <= _before(
                now, TOMBSTONE_RETENTION
            )
            if not is_the_tombstone or expired:
                orphans.append(info)
    gone = {info.path for info in to_delete} | {info.path for info in orphans}
    pack_bytes, range_bytes = _pack_amplification(paths, state, whole, gone)
    return GcPlan(
        retained=sorted(whole & set(manifests)),
        deleted=doomed,
        manifests_to_delete=[paths.manifest(cid) for cid in doomed],
        objects_to_delete=to_delete,
        orphans=orphans,
        retired=sorted(retired),
        reasons={cid: why[cid] for cid in sorted(whole & set(manifests))},
        pack_bytes=pack_bytes,
        pack_range_bytes=range_bytes,
        foreign=_foreign(paths, state.objects, owners),
    )


def reachable(
    paths: CheckpointPaths,
    keep: Iterable[CheckpointId],
    manifests: Mapping[CheckpointId, CheckpointManifest],
) -> tuple[set[CheckpointId], set[str]]:
    """Checkpoints kept whole, and the object paths in other checkpoints they reference.

    A kept checkpoint whose manifest lists a delta without its base (the reference's
    style) keeps its parent too, transitively.
    """
    whole: set[CheckpointId] = set()
    pending = list(keep)
    referenced: set[str] = set()
    while pending:
        cid = pending.pop()
        if cid in whole:
            continue
        whole.add(cid)
        manifest = manifests.get(cid)
        if manifest is None:
            continue
        heads: dict[tuple[str, int], bool] = {}
        for operator, entry in manifest.partition_entries():
            heads.setdefault((operator, entry.partition_id), entry.is_delta)
            if entry.owner is not None:
                referenced.add(paths.resolve(entry.owner, entry.path))
        for _, file in manifest.file_entries():
            if file.owner is not None:
                referenced.add(paths.resolve(file.owner, file.path))
        if any(heads.values()) and manifest.parent_id is not None:
            pending.append(manifest.parent_id)
    return whole, referenced


def _pack_amplification(
    paths: CheckpointPaths, state: StoreState, whole: set[CheckpointId], gone: set[str]
) -> tuple[int, int]:
    """The bytes of the shared objects that checkpoints in ``whole`` name and that stay
    (listed, not in ``gone``), and the bytes of them those use (see
    :attr:`GcPlan.pack_range_bytes`): packs' ranges counted once each, objects of ranges
    whole or by their entries' ``used_bytes``."""
    ranges: dict[str, set[tuple[int, int]]] = {}
    used: dict[str, int | None] = {}  # objects of ranges: the most one checkpoint uses (None: all)
    for cid in whole:
        manifest = state.manifests.get(cid)
        if manifest is None:
            continue
        for _, entry in manifest.partition_entries():
            path = paths.resolve(entry.owner or cid, entry.path)
            if entry.offset is not None:
                ranges.setdefault(path, set()).add((entry.offset, entry.stored_length))
            elif entry.index_size_bytes is not None or entry.used_bytes is not None:
                before = used.get(path, 0)
                now = None if entry.owner is None else entry.used_bytes
                used[path] = None if before is None or now is None else max(before, now)
    if not ranges and not used:
        return 0, 0
    sizes = {
        info.path: info.size for info in state.objects if info.path in ranges or info.path in used
    }
    kept = [path for path in sizes if path not in gone]
    kept_bytes = sum(sizes[p] for p in kept)
    packed = sum(n for p in kept if p in ranges for _, n in ranges[p])
    carried = 0
    for path in kept:
        if path in used:
            part = used[path]
            carried += sizes[path] if part is None else min(part, sizes[path])
    return kept_bytes, packed + carried


def _own_paths(paths: CheckpointPaths, manifest: CheckpointManifest) -> set[str]:
    """The store paths of what ``manifest`` names in its own checkpoint's directory."""
    return {paths.resolve(manifest.checkpoint_id, p) for p in manifest.own_objects()}


def parents_of(state: StoreState, cid: CheckpointId) -> frozenset[CheckpointId]:
    """The parents the intents in uncommitted directory ``cid`` name (one that could not
    be read names none)."""
    return frozenset(
        intent.parent_id
        for _, intent in state.intents.get(cid, [])
        if intent is not None and intent.parent_id is not None
    )


def all_parents(busy: Mapping[CheckpointId, frozenset[CheckpointId]]) -> set[CheckpointId]:
    """Every parent the saves in progress of ``busy`` build on."""
    return {parent for parents in busy.values() for parent in parents}
