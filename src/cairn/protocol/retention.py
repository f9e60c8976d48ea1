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
  (:mod:`cairn.protocol._lease`);
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
  is retired instead of deleted (:func:`cairn.protocol._lease.retire`): its manifest becomes a
  tombstone, because the save that wrote it may still retry the create;
* reachability is by object path, packs included: a pack (many small artifacts of one
  save, each a byte range of it) is kept whole while any kept checkpoint names a range
  in it, even when the checkpoint that wrote it is deleted and the others no longer
  need most of it. So is a DCP rank object (one object of ranges, a tensor each) that a
  later incremental save carries some tensors of. The plan reports what that costs:
  the bytes of the packs and carried objects kept for kept checkpoints against the
  bytes of them those still use (:attr:`GcPlan.pack_bytes`,
  :attr:`GcPlan.pack_range_bytes`).
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from cairn.errors import (
    CheckpointerError,
    CheckpointNotFoundError,
    IntegrityError,
    InvalidInputError,
    NewerFormatError,
    StoreError,
)
from cairn.format._buffer import Buffer
from cairn.format._validate import positive_int
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths, is_cairn_name
from cairn.format.manifest import CheckpointManifest, decode_root
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._lease import (
    TOMBSTONE_RETENTION,
    Intent,
    claim,
    decode_intent,
    is_live,
    is_tombstone,
    retire,
    stamp_margin,
)
from cairn.protocol._parts import read_whole
from cairn.protocol._pointer import LatestPointer, read_pointer, read_writer
from cairn.stores import ObjectInfo, Store

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
    "span_text",
    "store_now",
    "uncommitted_dirs",
]

log = logging.getLogger("cairn.gc")
MANIFEST_READ_CONCURRENCY = 16


_DAWN = dt.datetime.min.replace(tzinfo=dt.UTC)


def _before(now: dt.datetime, span: dt.timedelta) -> dt.datetime:
    """``now - span``, or the earliest time there is when ``span`` reaches past it (a
    ``min_age`` of 999999999 days: nothing is that old)."""
    try:
        return now - span
    except OverflowError:
        return _DAWN


def _positive(name: str, value: object) -> None:
    if value is not None:
        positive_int(f"RetentionPolicy.{name}", value)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Which committed checkpoints to keep; the rules combine by union.

    ``keep_last`` newest by epoch (then id); those committed ``keep_within`` of now;
    those whose epoch is a multiple of ``keep_every_n_epochs``; and ``pinned`` ids. A
    policy with no rule keeps everything. Invalid values raise
    :class:`InvalidInputError` when the policy is built.
    """

    keep_last: int | None = None
    keep_within: dt.timedelta | None = None
    keep_every_n_epochs: int | None = None
    pinned: tuple[CheckpointId, ...] = ()

    def __post_init__(self) -> None:
        _positive("keep_last", self.keep_last)
        _positive("keep_every_n_epochs", self.keep_every_n_epochs)
        if self.keep_within is not None and (
            not isinstance(self.keep_within, dt.timedelta) or self.keep_within <= dt.timedelta(0)
        ):
            raise InvalidInputError(
                "RetentionPolicy.keep_within must be a positive timedelta, "
                f"got {self.keep_within!r}"
            )
        pinned = tuple(self.pinned)
        for cid in pinned:
            if not isinstance(cid, CheckpointId):
                raise InvalidInputError(f"RetentionPolicy.pinned holds a non-id: {cid!r}")
        object.__setattr__(self, "pinned", pinned)

    @property
    def keeps_everything(self) -> bool:
        """True when no rule is set (then nothing is deleted)."""
        return (
            self.keep_last is None
            and self.keep_within is None
            and (self.keep_every_n_epochs is None)
        )

    def retained(
        self, manifests: Mapping[CheckpointId, CheckpointManifest], now_ms: int
    ) -> set[CheckpointId]:
        """The ids these rules keep (pins included; the latest pointer is the caller's)."""
        return set(self.reasons(manifests, now_ms))

    def reasons(
        self, manifests: Mapping[CheckpointId, CheckpointManifest], now_ms: int
    ) -> dict[CheckpointId, list[str]]:
        """The ids these rules keep, each with the rules that keep it, in the order
        ``keep-last N``, ``keep-within AGE``, ``keep-every-n-epochs N``, ``pinned``
        (``no retention rule`` when the policy has none)."""
        why: dict[CheckpointId, list[str]] = {}

        def keep(ids: Iterable[CheckpointId], reason: str) -> None:
            for cid in ids:
                why.setdefault(cid, []).append(reason)

        newest = sorted(manifests.values(), key=lambda m: (m.epoch, m.checkpoint_id))
        if self.keeps_everything:
            keep(manifests, "no retention rule")
        if self.keep_last is not None:
            keep(
                (m.checkpoint_id for m in newest[-self.keep_last :]), f"keep-last {self.keep_last}"
            )
        if self.keep_within is not None:
            horizon = now_ms - int(self.keep_within.total_seconds() * 1000)
            keep(
                (m.checkpoint_id for m in newest if m.timestamp_ms >= horizon),
                f"keep-within {span_text(self.keep_within)}",
            )
        if self.keep_every_n_epochs is not None:
            n = self.keep_every_n_epochs
            keep((m.checkpoint_id for m in newest if m.epoch % n == 0), f"keep-every-n-epochs {n}")
        keep(self.pinned, "pinned")
        return why


def span_text(span: dt.timedelta) -> str:
    """``span`` as ``7d``, ``1h30m``, ``45s`` (whole seconds; ``0s`` for less)."""
    seconds = int(span.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What a GC run will do: pure data, computed by :func:`plan_gc`."""

    retained: list[CheckpointId]
    deleted: list[CheckpointId]
    manifests_to_delete: list[str]
    objects_to_delete: list[ObjectInfo]
    orphans: list[ObjectInfo]
    retired: list[CheckpointId] = field(default_factory=list)
    """Of ``deleted``, those whose directory holds an intent (the save that committed it
    has not finished) or that a fence names: each manifest is replaced by a tombstone
    instead of deleted (:func:`cairn.protocol._lease.retire`)."""
    # An explanation of the decisions, not one: plans that decide alike are equal.
    reasons: dict[CheckpointId, list[str]] = field(default_factory=dict, compare=False)
    """Why each retained checkpoint is kept (see :data:`KEPT_REASONS`), in order."""
    pack_bytes: int = field(default=0, compare=False)
    """The bytes of the shared objects kept for retained checkpoints: each pack a
    retained checkpoint names a range of, and each object of ranges (a DCP rank's
    tensors) one names, its own checkpoint's or carried by an incremental save."""
    pack_range_bytes: int = field(default=0, compare=False)
    """The bytes of those objects that retained checkpoints use: of a pack, the ranges
    they name (each once); of an object of ranges, all of it while its own checkpoint is
    retained, else the most that one retained checkpoint carried of it (the entries'
    ``used_bytes``; a lower bound when two carry different tensors of it; an entry
    without it, from an older cairn, counts as all). ``pack_bytes`` over this is the
    space shared objects keep alive per byte still needed."""
    foreign: list[str] = field(default_factory=list)
    """The objects in checkpoints' directories whose names cairn never writes
    (:func:`cairn.format.layout.is_cairn_name`): another application's, left alone."""


KEPT_REASONS = (
    "keep-last N",
    "keep-within AGE",
    "keep-every-n-epochs N",
    "pinned",
    "no retention rule",
    "latest",
    "newer than latest",
    "no latest pointer",
    "base of a save in progress",
    "base of a kept incremental",
)
"""The reasons :attr:`GcPlan.reasons` gives (``N`` and ``AGE`` filled in): the policy's
rules, then the safety rules of :func:`plan_gc`; "base of a kept incremental" is a
checkpoint kept whole only because a kept one's chains need its manifest."""


@dataclass(slots=True)
class GcResult:
    """What a GC run did (or, with ``dry_run``, would do)."""

    deleted: list[CheckpointId] = field(default_factory=list)
    retained: list[CheckpointId] = field(default_factory=list)
    bytes_reclaimed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    dry_run: bool = False
    orphans_deleted: list[str] = field(default_factory=list)
    objects_deleted: int = 0
    """Objects deleted (manifests, artifacts, intents, orphans); 0 on a dry run."""
    reasons: dict[CheckpointId, list[str]] = field(default_factory=dict, compare=False)
    """Why each of ``retained`` is kept (:attr:`GcPlan.reasons`)."""
    pack_bytes: int = 0
    """The bytes of the packs and carried objects kept for the retained checkpoints
    (:attr:`GcPlan.pack_bytes`)."""
    pack_range_bytes: int = 0
    """The bytes of those that the retained checkpoints use
    (:attr:`GcPlan.pack_range_bytes`); the rest is kept only because it shares an object."""
    damaged: dict[CheckpointId, str] = field(default_factory=dict)
    """The committed checkpoints left alone because their manifest does not decode (or a
    part of it is missing or damaged), each with why: what they reference is unknown."""
    foreign_objects: list[str] = field(default_factory=list)
    """The objects left alone in checkpoints' directories because cairn never writes
    their names (:attr:`GcPlan.foreign`): another application's data."""
    newer_format: dict[CheckpointId, str] = field(default_factory=dict)
    """The committed checkpoints a newer cairn wrote (a manifest requiring format
    features this cairn does not know), each with why. When there is one, the run
    deleted and claimed nothing (``deleted`` is empty): what such a manifest names
    cannot be known, and it may be anything in the store."""


def _reachable(
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


@dataclass(frozen=True, slots=True)
class StoreState:
    """What GC read from the store: pure data for :func:`plan_gc`.

    ``intents`` (each save attempt's, see :meth:`CheckpointPaths.intent`) and
    ``tombstones`` are those of uncommitted directories only; ``damaged``
    are committed directories whose manifest does not decode (GC leaves them alone: what
    they reference cannot be known). ``latest`` is the pointer as read, or None.
    ``fenced`` are the checkpoints the writer record's fences name (where a fenced
    generation ended, see :mod:`cairn.protocol._pointer`).
    """

    manifests: dict[CheckpointId, CheckpointManifest]
    objects: list[ObjectInfo]
    intents: dict[CheckpointId, list[tuple[ObjectInfo, Intent | None]]]
    tombstones: dict[CheckpointId, ObjectInfo]
    damaged: dict[CheckpointId, str]
    latest: LatestPointer | None
    fenced: frozenset[CheckpointId] = frozenset()
    ended: frozenset[CheckpointId] = frozenset()
    """Uncommitted directories whose intent was listed but was gone when read: their
    save ended meanwhile, committed (its manifest is there now) or not."""
    newer: Mapping[CheckpointId, NewerFormatError] = field(default_factory=dict)
    """Committed checkpoints whose manifest (or a part of it) a newer cairn wrote: what
    they name cannot be known, so nothing may be deleted."""


def uncommitted_dirs(
    state: StoreState, paths: CheckpointPaths, *, now: dt.datetime, min_age: dt.timedelta
) -> tuple[dict[CheckpointId, frozenset[CheckpointId]], set[CheckpointId]]:
    """Split uncommitted directories into those to leave alone and those to reclaim.

    Returns ``(busy, abandoned)``: ``busy`` maps each directory GC must not touch (a live
    lease, or an object younger than ``min_age``) to the parents its intents name (their
    chains are protected too; two writers of one id may build on two); ``abandoned``
    holds the unclaimed ones with neither, which GC claims before it sweeps them.
    Tombstoned directories are in neither: they are dead.
    """
    return _uncommitted_dirs(state, _owners(paths, state.objects), now=now, min_age=min_age)


def _owners(paths: CheckpointPaths, objects: list[ObjectInfo]) -> list[CheckpointId | None]:
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
    :func:`_owners`), sorted."""
    return sorted(
        info.path
        for info, cid in zip(objects, owners, strict=True)
        if cid is None and paths.checkpoint_of(info.path) is not None
    )


def _uncommitted_dirs(
    state: StoreState,
    owners: list[CheckpointId | None],
    *,
    now: dt.datetime,
    min_age: dt.timedelta,
) -> tuple[dict[CheckpointId, frozenset[CheckpointId]], set[CheckpointId]]:
    """:func:`uncommitted_dirs`, given :func:`_owners` of ``state.objects``."""
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
            busy[cid] = _parents_of(state, cid)
        else:
            abandoned.add(cid)
    # A directory a save in progress builds on is never claimed, committed or not: the
    # save may have read its manifest before a deletion removed it, and carries its
    # objects (a parent that cannot be read any more fails the save, and a deletion's
    # second look spares it, see look_again).
    abandoned -= _all_parents(busy)
    return busy, abandoned


class _ManifestPaths:
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
    """
    owners = _owners(paths, state.objects)
    busy, _ = _uncommitted_dirs(state, owners, now=now, min_age=min_age)
    return _plan(paths, state, policy, owners, busy, now=now, min_age=min_age, claimed=claimed)


def _plan(
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
    """:func:`plan_gc`, given :func:`_owners` of ``state.objects`` and the busy
    directories of :func:`_uncommitted_dirs`."""
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
    also({p for p in _all_parents(busy) if p in manifests}, "base of a save in progress")
    keep = set(why)
    whole, referenced = _reachable(paths, keep, manifests)
    also(sorted(whole - keep), "base of a kept incremental")
    doomed = sorted(set(manifests) - whole)
    dead = set(claimed) | set(state.tombstones)
    in_dir: dict[CheckpointId, int] = {}
    for cid in owners:
        if cid is not None:
            in_dir[cid] = in_dir.get(cid, 0) + 1
    manifest_of = _ManifestPaths(paths)
    to_delete: list[ObjectInfo] = []
    orphans: list[ObjectInfo] = []
    own = {cid: _own_paths(paths, manifests[cid]) for cid in doomed}
    # A doomed checkpoint a fence names is retired (see cairn.protocol._lease.retire): a fenced
    # writer of its id, stalled before its create, would count as where its generation
    # ended; so is one whose directory still holds an intent (below).
    retired = set(doomed) & state.fenced
    carried = _all_parents(busy)
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


async def store_now(store: Store, paths: CheckpointPaths) -> dt.datetime:
    """The store's own time: the ``last_modified`` it stamps on a probe written now.

    GC judges leases, tombstones and ``min_age`` by this, so that no local clock, however
    far off, makes it sweep what a save still needs (see the module docstring).
    """
    path = paths.clock()
    try:
        await store.put(path, b"cairn: GC reads the store's time from this object's stamp\n")
    except StoreError as exc:
        if not _refused(exc):
            raise
        raise StoreError(
            "put",
            path,
            f"the store is read-only to gc (it refused the write: {exc.reason}); gc writes "
            f"{path!r} to read the store's own time before it deletes or claims anything "
            "(a dry run writes nothing)",
            status=exc.status,
        ) from exc
    return (await store.head(path)).last_modified


_REFUSED_STATUSES = frozenset({None, 401, 403})
_REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def _refused(exc: StoreError) -> bool:
    """True when ``exc`` is a store's refusal to write: no permission, or a read-only file
    system (the kinds the store boundary leaves plain :class:`StoreError`, with a 401 or
    403, or no status); not a transient failure, a missing bucket or a full disk."""
    if type(exc) is not StoreError or exc.status not in _REFUSED_STATUSES:
        return False
    cause = exc.__cause__
    return not isinstance(cause, OSError) or cause.errno in _REFUSED_ERRNOS


async def read_state(store: Store, paths: CheckpointPaths) -> StoreState:
    """Read what :func:`plan_gc` needs: one listing, the manifests, the intents, the pointer.

    The pointer is read before the listing; :func:`plan_gc`'s rule for it holds whatever
    moves in between.
    """
    state, _ = await _read_state(store, paths)
    return state


async def _read_state(
    store: Store, paths: CheckpointPaths
) -> tuple[StoreState, list[CheckpointId | None]]:
    """:func:`read_state`, and :func:`_owners` of its objects, computed on the way."""
    latest, _, _ = await read_pointer(store, paths.latest_pointer())
    record, _, _ = await read_writer(store, paths.writer_record())
    fenced = frozenset(
        fence.checkpoint_id
        for fence in (record.fences if record is not None else ())
        if fence.checkpoint_id is not None
    )
    objects = await store.list(paths.base_prefix)
    manifests: dict[CheckpointId, CheckpointManifest] = {}
    damaged: dict[CheckpointId, str] = {}
    newer: dict[CheckpointId, NewerFormatError] = {}
    tombstones: dict[CheckpointId, ObjectInfo] = {}
    intents: dict[CheckpointId, list[tuple[ObjectInfo, Intent | None]]] = {}
    committed: dict[CheckpointId, ObjectInfo] = {}
    intent_infos: list[tuple[CheckpointId, ObjectInfo]] = []
    manifest_of = _ManifestPaths(paths)
    owners = _owners(paths, objects)
    for info, cid in zip(objects, owners, strict=True):
        if cid is None:
            continue
        if info.path == manifest_of(cid):
            if is_tombstone(info):
                tombstones[cid] = info
            else:
                committed[cid] = info
        elif paths.is_intent_path(info.path):
            intent_infos.append((cid, info))

    def read_manifest(cid: CheckpointId, info: ObjectInfo) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            path = info.path
            try:
                root = decode_root(path, await _read_listed(store, info))
                manifests[cid] = await read_whole(store, paths, path, root)
            except CheckpointNotFoundError:
                return  # deleted since the listing
            except IntegrityError as exc:
                damaged[cid] = str(exc)
            except NewerFormatError as exc:
                newer[cid] = exc

        return job

    ended: set[CheckpointId] = set()

    def read_intent(cid: CheckpointId, info: ObjectInfo) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            try:
                blob = await store.get(info.path)
            except CheckpointNotFoundError:
                ended.add(cid)
                return
            # The listing's time is the lease's start as GC saw it; the bytes say for how long.
            intents.setdefault(cid, []).append((info, decode_intent(bytes(blob.data))))

        return job

    reads = [read_manifest(cid, info) for cid, info in committed.items()]
    reads += [read_intent(cid, info) for cid, info in intent_infos if cid not in committed]
    await bounded_gather(MANIFEST_READ_CONCURRENCY, reads)
    state = StoreState(
        manifests, objects, intents, tombstones, damaged, latest, fenced, frozenset(ended), newer
    )
    return state, owners


async def _read_listed(store: Store, info: ObjectInfo) -> Buffer:
    """The bytes of the object a listing reported as ``info``.

    One ranged read of the listed size plus one byte (a GET takes two round trips through
    obstore: the response, then its body); should the object no longer have that size
    (replaced since the listing; by an empty tombstone, and then the range fails), a
    whole read, as if the listing had said nothing.
    """
    if info.size > 0:
        try:
            data = await store.get_range(info.path, 0, info.size + 1)
        except CheckpointNotFoundError:
            raise
        except StoreError:
            pass
        else:
            if memoryview(data).nbytes == info.size:
                return data
    return (await store.get(info.path)).data


async def run_gc(
    store: Store,
    paths: CheckpointPaths,
    policy: RetentionPolicy,
    *,
    dry_run: bool,
    min_age: dt.timedelta,
) -> GcResult:
    """Plan and (unless ``dry_run``) execute a GC over ``store``; see the module docstring.

    A run that has nothing to delete or claim writes nothing (so it works on a store it
    may only read); one that must write on a store that refuses writes raises
    :class:`StoreError` naming ``{base}_clock``, before it has changed anything.
    """
    if not isinstance(min_age, dt.timedelta) or min_age < dt.timedelta(0):
        raise InvalidInputError(f"min_age must be a timedelta >= 0, got {min_age!r}")
    if not isinstance(policy, RetentionPolicy):
        raise InvalidInputError(f"gc takes a RetentionPolicy, got {policy!r}")
    state, owners = await _read_state(store, paths)
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
    busy, abandoned = _uncommitted_dirs(state, owners, now=now, min_age=min_age)
    claimed = await _claim_all(store, paths, abandoned)
    plan = _plan(paths, state, policy, owners, busy, now=now, min_age=min_age, claimed=claimed)
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
            store, paths, state.manifests, set(result.deleted), min_age=min_age
        )
    except NewerFormatError as exc:
        # Committed since the reading: it may name anything, so no artifact goes.
        owner = paths.checkpoint_of(exc.path)
        if owner is None:
            raise  # not a manifest of this base: nothing more is deleted either way
        _say_newer({owner: exc})
        result.newer_format = {owner: str(exc)}
        return result
    kept_whole, kept = _reachable(paths, standing, state.manifests)
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
    return result


async def look_again(
    store: Store,
    paths: CheckpointPaths,
    known: Mapping[CheckpointId, CheckpointManifest],
    doomed: set[CheckpointId],
    *,
    min_age: dt.timedelta,
    claim_live: bool = False,
) -> tuple[set[CheckpointId], set[str]]:
    """The second phase of every deletion (GC's, or one checkpoint's): what to spare.

    Called once the manifests of ``doomed`` are deleted and before their objects are:
    reads the store again, and returns the checkpoints to keep whole and the object paths
    they reference (or raises :class:`NewerFormatError` when it meets a manifest a newer
    cairn wrote: nothing may then be deleted). They are the checkpoints committed since
    ``known`` (the manifests the
    deletion was planned from) was read, and the parents of saves in progress (a live
    lease, or an object younger than ``min_age``), by the store's time.

    A save building on a doomed checkpoint whose lease lapsed is claimed first (its
    tombstone written, see :mod:`cairn.protocol._lease`): a lapsed lease may be a paused process,
    not a dead one, and once claimed it can never commit naming what is deleted next. One
    whose claim finds it committed instead is spared like the others. (A save whose
    intent appears only after this reading reads its parent's manifest after it: the
    manifest is gone, and that save fails before it uploads.) With ``claim_live`` (a
    forced deletion) every save building on a doomed checkpoint, or on one that carries
    a doomed checkpoint's objects, is claimed, its lease live or not: it could only
    commit naming what goes.
    """
    state = await read_state(store, paths)
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
    return _reachable(paths, fresh | _all_parents(busy), everything)


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
    """Claim the saves in progress in ``state`` that build on a checkpoint of ``doomed``
    and whose lease lapsed at ``now`` (with ``live``: every one, and also those building
    on a checkpoint of ``manifests`` that carries a doomed one's objects, which a forced
    deletion breaks too). Returns the manifests of those whose claim found them
    committed meanwhile (each read whole; one that does not decode is left out)."""
    busy, abandoned = uncommitted_dirs(state, paths, now=now, min_age=min_age)
    candidates = abandoned
    if live:
        candidates = abandoned | set(busy)
        doomed = doomed | {cid for cid, m in manifests.items() if _carries(m, doomed)}
    building = {cid for cid in candidates if _parents_of(state, cid) & doomed}
    committed = building - await _claim_all(store, paths, building)
    late = {cid: await _read_manifest(store, paths, cid) for cid in sorted(committed)}
    return {cid: manifest for cid, manifest in late.items() if manifest is not None}


async def abort_saves_in_flight(store: Store, paths: CheckpointPaths) -> None:
    """What a takeover does between raising the writer generation and claiming
    ``_latest``: claim the id of every save in flight.

    A save writes its intent before it reads the fence (:func:`cairn.protocol._commit.start`), so
    one that read an older generation has its intent in the store by now, and each
    uncommitted directory holding an intent is claimed (a tombstone: its create will
    fail). A save either read the new generation and stops, or committed before this
    listing (before the takeover claims ``_latest``), or can no longer commit. One
    listing, and a create-only write per save in flight.
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


def _parents_of(state: StoreState, cid: CheckpointId) -> frozenset[CheckpointId]:
    """The parents the intents in uncommitted directory ``cid`` name (one that could not
    be read names none)."""
    return frozenset(
        intent.parent_id
        for _, intent in state.intents.get(cid, [])
        if intent is not None and intent.parent_id is not None
    )


def _all_parents(busy: Mapping[CheckpointId, frozenset[CheckpointId]]) -> set[CheckpointId]:
    """Every parent the saves in progress of ``busy`` build on."""
    return {parent for parents in busy.values() for parent in parents}


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
    busy, abandoned = _uncommitted_dirs(state, owners, now=_END_OF_TIME, min_age=min_age)
    if abandoned:
        return True
    plan = _plan(paths, state, policy, owners, busy, now=_END_OF_TIME, min_age=min_age, claimed=())
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
    busy, abandoned = _uncommitted_dirs(state, owners, now=now, min_age=min_age)
    plan = _plan(paths, state, policy, owners, busy, now=now, min_age=min_age, claimed=abandoned)
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


async def _claim_all(
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


async def _delete(store: Store, path: str, result: GcResult) -> bool:
    try:
        await store.delete([path])
    except CheckpointerError as exc:
        log.warning("gc could not delete %s: %s", path, exc)
        result.failures.append((path, str(exc)))
        return False
    result.objects_deleted += 1
    return True
