"""Retention policies and garbage collection: keep what matters, reclaim the rest safely.

The plan (:func:`plan_gc`) is pure: from the committed manifests, every object under the
base, the ``_latest`` pointer and a :class:`RetentionPolicy`, it decides what goes.
:func:`run_gc` reads the store, plans, and executes. Invariants:

* never deleted: the checkpoint ``_latest`` names, a pinned or retained checkpoint, any
  object a retained checkpoint's chain references (wherever it lives), the parent chain
  of any uncommitted save (named by its ``intent.json``, which an incremental save
  writes before it reads its parent), and anything younger than ``min_age`` that is not
  part of a committed checkpoint (it may be a save in progress);
* deletion goes in two phases: every manifest to delete first, then the artifacts, so a
  crash mid-GC never leaves a listed checkpoint with missing artifacts — only orphans,
  which the next run sweeps (GC is idempotent and resumable);
* before the artifact phase, GC looks again for checkpoints committed and saves started
  since it planned, and spares everything they reference.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from cairn._concurrency import bounded_gather
from cairn.errors import CheckpointerError, CheckpointNotFoundError, InvalidInputError
from cairn.ids import CheckpointId
from cairn.layout import INTENT_NAME, MANIFEST_NAME, CheckpointPaths
from cairn.manifest import CheckpointManifest
from cairn.stores import ObjectInfo, Store

__all__ = ["GcPlan", "GcResult", "RetentionPolicy", "plan_gc"]

log = logging.getLogger("cairn.gc")
MANIFEST_READ_CONCURRENCY = 16


def _positive(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"RetentionPolicy.{name} must be an int >= 1, got {value!r}")


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
        if self.keeps_everything:
            return set(manifests) | set(self.pinned)
        kept = set(self.pinned)
        newest = sorted(manifests.values(), key=lambda m: (m.epoch, m.checkpoint_id))
        if self.keep_last is not None:
            kept.update(m.checkpoint_id for m in newest[-self.keep_last :])
        if self.keep_within is not None:
            horizon = now_ms - int(self.keep_within.total_seconds() * 1000)
            kept.update(m.checkpoint_id for m in newest if m.timestamp_ms >= horizon)
        if self.keep_every_n_epochs is not None:
            n = self.keep_every_n_epochs
            kept.update(m.checkpoint_id for m in newest if m.epoch % n == 0)
        return kept


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What a GC run will do: pure data, computed by :func:`plan_gc`."""

    retained: list[CheckpointId]
    deleted: list[CheckpointId]
    manifests_to_delete: list[str]
    objects_to_delete: list[ObjectInfo]
    orphans: list[ObjectInfo]


@dataclass(slots=True)
class GcResult:
    """What a GC run did (or, with ``dry_run``, would do)."""

    deleted: list[CheckpointId] = field(default_factory=list)
    retained: list[CheckpointId] = field(default_factory=list)
    bytes_reclaimed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    dry_run: bool = False
    orphans_deleted: list[str] = field(default_factory=list)


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
        if any(heads.values()) and manifest.parent_id is not None:
            pending.append(manifest.parent_id)
    return whole, referenced


def plan_gc(
    paths: CheckpointPaths,
    manifests: Mapping[CheckpointId, CheckpointManifest],
    objects: Iterable[ObjectInfo],
    latest: CheckpointId | None,
    policy: RetentionPolicy,
    *,
    now: dt.datetime,
    min_age: dt.timedelta,
    in_progress_parents: Iterable[CheckpointId] = (),
) -> GcPlan:
    """Decide what a GC deletes. Pure: no I/O.

    ``manifests`` are the committed checkpoints; ``objects`` every object under the base
    (with sizes and modification times); ``in_progress_parents`` the parents named by
    young uncommitted checkpoints' intents.
    """
    now_ms = int(now.timestamp() * 1000)
    keep = policy.retained(manifests, now_ms) & set(manifests) | set(policy.pinned)
    if latest is not None and latest in manifests:
        keep.add(latest)
    keep.update(p for p in in_progress_parents if p in manifests)
    whole, referenced = _reachable(paths, keep, manifests)
    doomed = sorted(set(manifests) - whole)
    cutoff = now - min_age
    to_delete: list[ObjectInfo] = []
    orphans: list[ObjectInfo] = []
    for info in objects:
        cid = paths.checkpoint_of(info.path)
        if cid is None or cid in whole or info.path in referenced:
            continue
        if cid in manifests:
            if not info.path.endswith("/" + MANIFEST_NAME):
                to_delete.append(info)
        elif info.last_modified <= cutoff:
            orphans.append(info)
    return GcPlan(
        retained=sorted(whole & set(manifests)),
        deleted=doomed,
        manifests_to_delete=[paths.manifest(cid) for cid in doomed],
        objects_to_delete=to_delete,
        orphans=orphans,
    )


_Intent = msgspec.json.Decoder(dict[str, str])


async def _read_state(
    store: Store, paths: CheckpointPaths, skip: set[CheckpointId] | None = None
) -> tuple[dict[CheckpointId, CheckpointManifest], list[ObjectInfo], set[CheckpointId]]:
    """Committed manifests, every object under the base, and in-progress saves' parents.

    Intents in the directories of ``skip`` (checkpoints being deleted) are not saves.
    """
    from cairn.manifest import decode_manifest  # local: keeps the plan importable alone

    objects = await store.list(paths.base_prefix)
    manifests: dict[CheckpointId, CheckpointManifest] = {}
    parents: set[CheckpointId] = set()
    committed_dirs = {
        info.path[: -len(MANIFEST_NAME)]
        for info in objects
        if info.path.endswith("/" + MANIFEST_NAME)
    }

    def read_manifest(info: ObjectInfo, cid: CheckpointId) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            try:
                blob = await store.get(info.path)
            except CheckpointNotFoundError:
                return  # deleted since the listing
            manifests[cid] = decode_manifest(info.path, blob.data)

        return job

    reads: list[Callable[[], Awaitable[None]]] = []
    for info in objects:
        cid = paths.checkpoint_of(info.path)
        if cid is None:
            continue
        if info.path == paths.manifest(cid):
            reads.append(read_manifest(info, cid))
        elif (
            info.path == paths.intent(cid)
            and paths.checkpoint_dir(cid) not in committed_dirs
            and cid not in (skip or ())
        ):
            # Whatever its age: a stale intent is swept in this run and protects no more.
            try:
                intent = _Intent.decode(bytes((await store.get(info.path)).data))
                parents.add(CheckpointId.parse(intent["parent_id"]))
            except (CheckpointNotFoundError, msgspec.DecodeError, KeyError, ValueError):
                continue
    await bounded_gather(MANIFEST_READ_CONCURRENCY, reads)
    return manifests, objects, parents


async def run_gc(
    store: Store,
    paths: CheckpointPaths,
    latest: CheckpointId | None,
    policy: RetentionPolicy,
    *,
    dry_run: bool,
    min_age: dt.timedelta,
) -> GcResult:
    """Plan and (unless ``dry_run``) execute a GC over ``store``; see the module docstring."""
    if not isinstance(min_age, dt.timedelta) or min_age < dt.timedelta(0):
        raise InvalidInputError(f"min_age must be a timedelta >= 0, got {min_age!r}")
    if not isinstance(policy, RetentionPolicy):
        raise InvalidInputError(f"gc takes a RetentionPolicy, got {policy!r}")
    now = dt.datetime.now(dt.UTC)
    manifests, objects, parents = await _read_state(store, paths)
    unknown_pins = [cid for cid in policy.pinned if cid not in manifests]
    if unknown_pins:
        raise InvalidInputError(f"pinned checkpoint {unknown_pins[0]} does not exist")
    plan = plan_gc(
        paths,
        manifests,
        objects,
        latest,
        policy,
        now=now,
        min_age=min_age,
        in_progress_parents=parents,
    )
    result = GcResult(retained=plan.retained, deleted=plan.deleted, dry_run=dry_run)
    doomed_bytes = [*plan.objects_to_delete, *plan.orphans]
    sizes = {info.path: info.size for info in objects}
    if dry_run:
        result.bytes_reclaimed = sum(sizes.get(p, 0) for p in plan.manifests_to_delete) + sum(
            info.size for info in doomed_bytes
        )
        result.orphans_deleted = [info.path for info in plan.orphans]
        return result
    # Phase 1: the manifests, so nothing half-deleted is ever listed; each with its intent,
    # which would otherwise read as a save in progress and protect its parent.
    intents = {paths.intent(cid) for cid in plan.deleted} & set(sizes)
    for path in plan.manifests_to_delete:
        if await _delete(store, path, result):
            result.bytes_reclaimed += sizes.get(path, 0)
            intent = path[: -len(MANIFEST_NAME)] + INTENT_NAME
            if intent in intents and await _delete(store, intent, result):
                result.bytes_reclaimed += sizes[intent]
    doomed_bytes = [info for info in doomed_bytes if info.path not in intents]
    # Phase 2: look again for saves that started or committed since the plan.
    manifests_now, _, parents_now = await _read_state(store, paths, skip=set(plan.deleted))
    known = {**manifests, **manifests_now}  # a deleted parent's manifest is still known here
    fresh = set(manifests_now) - set(manifests)
    spared_whole, spared = _reachable(paths, fresh | (parents_now & set(known)), known)
    spared |= {info.path for info in doomed_bytes if paths.checkpoint_of(info.path) in spared_whole}
    for info in doomed_bytes:
        if info.path in spared:
            continue
        if await _delete(store, info.path, result):
            result.bytes_reclaimed += info.size
            if info in plan.orphans:
                result.orphans_deleted.append(info.path)
    return result


async def _delete(store: Store, path: str, result: GcResult) -> bool:
    try:
        await store.delete([path])
    except CheckpointerError as exc:
        log.warning("gc could not delete %s: %s", path, exc)
        result.failures.append((path, str(exc)))
        return False
    return True
