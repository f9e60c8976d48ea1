"""Retention policies, and what a GC plans and reports: pure data, no I/O.

Invariant: a :class:`RetentionPolicy` is valid once built (a bad value raises
:class:`~cairn.errors.InvalidInputError` then, never later), and its rules combine by
union: a checkpoint any rule keeps is kept. :class:`GcPlan` and :class:`GcResult` only
describe; what GC may delete is decided in :mod:`cairn.protocol._gcplan` (see
:mod:`cairn.protocol.retention`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cairn.errors import (
    InvalidInputError,
)
from cairn.format._validate import positive_int
from cairn.format.ids import CheckpointId
from cairn.format.manifest import CheckpointManifest
from cairn.stores import ObjectInfo

__all__ = [
    "KEPT_REASONS",
    "GcPlan",
    "GcResult",
    "RetentionPolicy",
    "span_text",
]

log = logging.getLogger("cairn.gc")


def _positive(name: str, value: object) -> None:
    if value is not None:
        positive_int(f"RetentionPolicy.{name}", value)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Which committed checkpoints to keep; the rules combine by union.

    A policy with no rule keeps everything.

    Args:
        keep_last: Keep this many newest by epoch (then id), >= 1; None: no such rule.
        keep_within: Keep those committed within this positive span of now; None: no
            such rule.
        keep_every_n_epochs: Keep those whose epoch is a multiple of this, >= 1; None:
            no such rule.
        pinned: Keep these ids.

    Raises:
        InvalidInputError: A value is invalid (raised when the policy is built).
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
        """The checkpoints these rules keep (pins included; the latest pointer is the
        caller's).

        Args:
            manifests: The committed checkpoints' manifests, by id.
            now_ms: Now, in ms since the Unix epoch (for ``keep_within``).

        Returns:
            Their ids.
        """
        return set(self.reasons(manifests, now_ms))

    def reasons(
        self, manifests: Mapping[CheckpointId, CheckpointManifest], now_ms: int
    ) -> dict[CheckpointId, list[str]]:
        """The checkpoints these rules keep, each with the rules that keep it.

        Args:
            manifests: The committed checkpoints' manifests, by id.
            now_ms: Now, in ms since the Unix epoch (for ``keep_within``).

        Returns:
            Each id kept, with its rules in the order ``keep-last N``, ``keep-within
            AGE``, ``keep-every-n-epochs N``, ``pinned`` (``no retention rule`` when the
            policy has none).
        """
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
    """A span as text.

    Args:
        span: The span.

    Returns:
        ``7d``, ``1h30m``, ``45s`` (whole seconds; ``0s`` for less).
    """
    seconds = int(span.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What a GC run will do: pure data, computed by :func:`plan_gc`.

    Attributes:
        retained: The committed checkpoints kept.
        deleted: The committed checkpoints to delete.
        manifests_to_delete: Their manifests' store paths, in the order of ``deleted``.
        objects_to_delete: The objects their manifests name that nothing kept needs.
        orphans: The objects of uncommitted directories GC has claimed (or a tombstone
            marks), and tombstones that have expired.
        retired: Of ``deleted``, those whose directory holds an intent (the save that
            committed it has not finished) or that a fence names: each manifest is
            replaced by a tombstone instead of deleted (docs/format.md, "Tombstones").
        reasons: Why each retained checkpoint is kept (see :data:`KEPT_REASONS`), in
            order.
        pack_bytes: The bytes of the shared objects kept for retained checkpoints: each
            pack a retained checkpoint names a range of, and each object of ranges (a
            DCP rank's tensors) one names, its own checkpoint's or carried by an
            incremental save.
        pack_range_bytes: The bytes of those objects that retained checkpoints use: of
            a pack, the ranges they name (each once); of an object of ranges, all of it
            while its own checkpoint is retained, else the most that one retained
            checkpoint carried of it (the entries' ``used_bytes``; a lower bound when
            two carry different tensors of it; an entry without it, from an older cairn,
            counts as all). ``pack_bytes`` over this is the space shared objects keep
            alive per byte still needed.
        foreign: The objects in checkpoints' directories whose names cairn never writes
            (:func:`cairn.format.layout.is_cairn_name`): another application's, left
            alone.
    """

    retained: list[CheckpointId]
    deleted: list[CheckpointId]
    manifests_to_delete: list[str]
    objects_to_delete: list[ObjectInfo]
    orphans: list[ObjectInfo]
    retired: list[CheckpointId] = field(default_factory=list)
    # An explanation of the decisions, not one: plans that decide alike are equal.
    reasons: dict[CheckpointId, list[str]] = field(default_factory=dict, compare=False)
    pack_bytes: int = field(default=0, compare=False)
    pack_range_bytes: int = field(default=0, compare=False)
    foreign: list[str] = field(default_factory=list)


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
    """What a GC run did (or, with ``dry_run``, would do).

    Attributes:
        deleted: The checkpoints whose manifests were deleted (on a dry run, would be).
        retained: The checkpoints kept.
        bytes_reclaimed: The bytes of the objects deleted (on a dry run, that would be).
        failures: Each deletion that failed: the store path, and why.
        dry_run: Whether this was a dry run (nothing deleted).
        orphans_deleted: The store paths of the orphans deleted (on a dry run, that
            would be).
        staging_files_deleted: On a local directory, the staging files (``{name}#{n}``)
            of writes killed mid-way that were removed from the uncommitted directories
            GC has claimed: no listing shows them, so they are neither objects nor
            orphans (:func:`cairn.stores.remove_staging_files`). Empty on a dry run.
        objects_deleted: Objects deleted (manifests, artifacts, intents, orphans); 0 on
            a dry run.
        reasons: Why each of ``retained`` is kept (:attr:`GcPlan.reasons`).
        pack_bytes: The bytes of the packs and carried objects kept for the retained
            checkpoints (:attr:`GcPlan.pack_bytes`).
        pack_range_bytes: The bytes of those that the retained checkpoints use
            (:attr:`GcPlan.pack_range_bytes`); the rest is kept only because it shares
            an object.
        damaged: The committed checkpoints left alone because their manifest does not
            decode (or a part of it is missing or damaged), each with why: what they
            reference is unknown.
        foreign_objects: The objects left alone in checkpoints' directories because
            cairn never writes their names (:attr:`GcPlan.foreign`): another
            application's data.
        newer_format: The committed checkpoints a newer cairn wrote (a manifest
            requiring format features this cairn does not know), each with why. When
            there is one, the run deleted and claimed nothing (``deleted`` is empty):
            what such a manifest names cannot be known, and it may be anything in the
            store.
    """

    deleted: list[CheckpointId] = field(default_factory=list)
    retained: list[CheckpointId] = field(default_factory=list)
    bytes_reclaimed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    dry_run: bool = False
    orphans_deleted: list[str] = field(default_factory=list)
    staging_files_deleted: list[str] = field(default_factory=list)
    objects_deleted: int = 0
    reasons: dict[CheckpointId, list[str]] = field(default_factory=dict, compare=False)
    pack_bytes: int = 0
    pack_range_bytes: int = 0
    damaged: dict[CheckpointId, str] = field(default_factory=dict)
    foreign_objects: list[str] = field(default_factory=list)
    newer_format: dict[CheckpointId, str] = field(default_factory=dict)
