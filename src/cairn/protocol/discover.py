"""Finding checkpoints in a store: where they are, and what their manifests say. Reads only.

A *checkpoint directory* is a one-level child ``{prefix}{id}/`` of a base prefix whose
name is a checkpoint id (:meth:`~cairn.CheckpointPaths.parse_checkpoint_dir`),
committed or not: a save in progress, or one that stopped before its commit, has one
too. Whether it is committed is its manifest's business
(:meth:`~cairn.ObjectStoreCheckpointer.list_checkpoints` lists only those).

* :func:`checkpoint_dirs`: every checkpoint directory under one base prefix
  (:meth:`~cairn.ObjectStoreCheckpointer.list_checkpoint_dirs` on a checkpointer);
* :func:`default_paths`: the layout of a checkpointer given no ``paths``: the store's
  root, unless only the old default ``checkpoints/`` holds checkpoints;
* :func:`checkpoint_prefixes`: the base prefixes of a store that hold checkpoint
  directories, found by a bounded walk from the store's root, for tools that help a
  user who named the wrong prefix;
* :func:`newest_checkpoint_prefix`: of the prefixes one level under a parent (runs of
  one job, say), the one holding the newest checkpoint id (ids are time-ordered);
* :func:`load_manifests`: many manifests, read concurrently, where one that is damaged,
  deleted since it was listed, or written by a newer cairn (not damage: a
  :class:`~cairn.errors.NewerFormatError`) is reported in its place instead of failing
  the lot
  (:meth:`~cairn.ObjectStoreCheckpointer.load_manifests` on a checkpointer);
* :func:`resolve_checkpoint_id`: the committed checkpoint a full id or a *short id* (a
  unique prefix of its text, at least :data:`MIN_SHORT_ID` characters, as git takes
  them) names; every checkpointer method that takes an id, and the command line, use it;
* :func:`checkpoint_counts`: what one manifest says of its size, each quantity defined
  once (artifacts against partitions, this save's own against carried), for every tool
  that shows it;
* :func:`short_ids`: the shortest such prefix of each of some ids that tells it apart
  from the others, for tables a user reads and pastes from.

Invariants: nothing here writes; :func:`default_paths` costs at most two one-level
listings; the walk of :func:`checkpoint_prefixes` costs at
most ``max_listings`` one-level listings, whatever the size of the store; resolving a
short id costs one listing and one HEAD per directory whose name starts with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from cairn.errors import (
    AmbiguousCheckpointIdError,
    CheckpointNotFoundError,
    IntegrityError,
    InvalidInputError,
    NewerFormatError,
)
from cairn.format.ids import CheckpointId
from cairn.format.layout import LEGACY_BASE_PREFIX, CheckpointPaths
from cairn.format.manifest import CheckpointManifest
from cairn.stores import ListDirResult, Store

__all__ = [
    "MAX_CONCURRENT_READS",
    "MAX_PREFIX_DEPTH",
    "MAX_PREFIX_LISTINGS",
    "MIN_SHORT_ID",
    "CheckpointCounts",
    "ManifestOrDamage",
    "checkpoint_counts",
    "checkpoint_dirs",
    "checkpoint_prefixes",
    "default_paths",
    "default_paths_listed",
    "holds_checkpoints",
    "is_short_id",
    "load_manifests",
    "matching_ids",
    "newest_checkpoint_prefix",
    "resolve_checkpoint_id",
    "short_ids",
]

MAX_PREFIX_LISTINGS = 40
"""At most this many one-level listings in :func:`checkpoint_prefixes` and
:func:`newest_checkpoint_prefix`: a few, whatever the size of the bucket."""
MAX_PREFIX_DEPTH = 3
"""How many levels below the root :func:`checkpoint_prefixes` looks."""
MAX_CONCURRENT_READS = 16
"""Manifests :func:`load_manifests` reads at once."""
MIN_SHORT_ID = 8
"""The fewest characters of a short id: the first group of the hyphenated form (48 bits
of millisecond time, so two ids share it only when made within about a minute)."""

_ID_FORM = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX = frozenset("0123456789abcdef")

ManifestOrDamage = CheckpointManifest | IntegrityError | CheckpointNotFoundError | NewerFormatError
"""A manifest, or what made it unloadable: damage (an :class:`IntegrityError`, a
signature a reader's keys refuse among them), a checkpoint deleted since it was
listed, or one a newer cairn wrote (a :class:`NewerFormatError`, which is not damage:
tools show it as needing a newer cairn)."""


async def checkpoint_dirs(store: Store, paths: CheckpointPaths) -> list[CheckpointId]:
    """Every checkpoint directory under a base prefix, committed or not. One listing.

    Args:
        store: The store.
        paths: The layout whose base prefix is listed.

    Returns:
        Their ids, oldest first.
    """
    listing = await store.list_dir(paths.base_prefix)
    return sorted(
        cid for child in listing.prefixes if (cid := paths.parse_checkpoint_dir(child)) is not None
    )


async def holds_checkpoints(store: Store, paths: CheckpointPaths) -> bool:
    """Whether a base prefix holds checkpoints. One listing.

    Args:
        store: The store.
        paths: The layout whose base prefix is listed.

    Returns:
        True when it holds a checkpoint directory (committed or not) or a store-wide
        record (``_latest``, ``_writer``); other names are ignored.
    """
    return _holds_checkpoints(paths, await store.list_dir(paths.base_prefix))


def _holds_checkpoints(paths: CheckpointPaths, listing: ListDirResult) -> bool:
    return any(paths.parse_checkpoint_dir(child) is not None for child in listing.prefixes) or any(
        paths.is_record(info.path) for info in listing.objects
    )


async def default_paths(store: Store) -> CheckpointPaths:
    """The layout a checkpointer given no ``paths`` uses in ``store``.

    The store's root (``CheckpointPaths("")``), unless the root holds no checkpoints and
    the old default :data:`~cairn.format.layout.LEGACY_BASE_PREFIX` (``checkpoints/``) does
    (:func:`holds_checkpoints`): then that, so that a job written by cairn 0.1 keeps its
    checkpoints instead of starting again from nothing. An empty store gets the root.
    Two listings, made at once.

    Args:
        store: The store.

    Returns:
        The root's layout, or the old default's.
    """
    chosen, _ = await default_paths_listed(store)
    return chosen


async def default_paths_listed(store: Store) -> tuple[CheckpointPaths, ListDirResult | None]:
    """:func:`default_paths`, and the listing of the root it read when it chose the root
    (None when it chose the old default): a caller about to list the root may use it.

    Args:
        store: The store.

    Returns:
        The layout, and the root's listing when that is the layout.
    """
    root, legacy = CheckpointPaths(""), CheckpointPaths(LEGACY_BASE_PREFIX)
    # Both at once: one round trip, for one more listing whenever the root is chosen.
    # Both end before either's failure is raised, the root's first: the same error
    # whichever answers first (a missing bucket fails both).
    listing, legacy_listing = await asyncio.gather(
        store.list_dir(root.base_prefix),
        store.list_dir(legacy.base_prefix),
        return_exceptions=True,
    )
    if isinstance(listing, BaseException):
        raise listing
    if isinstance(legacy_listing, BaseException):
        raise legacy_listing
    if not _holds_checkpoints(root, listing) and _holds_checkpoints(legacy, legacy_listing):
        return legacy, None
    return root, listing


async def checkpoint_prefixes(
    store: Store,
    *,
    max_listings: int = MAX_PREFIX_LISTINGS,
    max_depth: int = MAX_PREFIX_DEPTH,
) -> list[str]:
    """The prefixes of ``store`` that hold checkpoint directories, nearest the root first.

    A breadth-first walk of one-level listings from the root (the empty prefix), at most
    ``max_listings`` of them and ``max_depth`` levels deep, that does not descend into a
    prefix holding checkpoints: it finds the usual layouts (``checkpoints/``,
    ``demo/<run>/``, ``jobs/<name>/``) cheaply and gives up quietly on a bucket with
    many unrelated folders.

    Args:
        store: The store.
        max_listings: The most one-level listings the walk makes.
        max_depth: The most levels below the root it looks.

    Returns:
        The prefixes found (``""`` for the root itself).
    """
    found: list[str] = []
    queue: list[tuple[str, int]] = [("", 0)]
    listings = 0
    while queue and listings < max_listings:
        prefix, depth = queue.pop(0)
        listing = await store.list_dir(prefix)
        listings += 1
        paths = CheckpointPaths(prefix)
        if any(paths.parse_checkpoint_dir(child) is not None for child in listing.prefixes):
            found.append(prefix)
        elif depth + 1 < max_depth:
            queue.extend((child, depth + 1) for child in sorted(listing.prefixes))
    return found


async def newest_checkpoint_prefix(
    store: Store, parent: str, *, max_listings: int = MAX_PREFIX_LISTINGS
) -> str | None:
    """Of the prefixes one level under ``parent``, the one holding the newest checkpoint
    directory, or None when none holds any.

    Args:
        store: The store.
        parent: The prefix whose children are looked at (ending in ``/``, or empty).
        max_listings: How many children are looked at: the last by name (runs named
            by their start time sort oldest first).

    Returns:
        The child prefix, or None.
    """
    listing = await store.list_dir(parent)
    newest: tuple[CheckpointId, str] | None = None
    for child in sorted(listing.prefixes)[-max_listings:]:
        ids = await checkpoint_dirs(store, CheckpointPaths(child))
        if ids and (newest is None or ids[-1] > newest[0]):
            newest = (ids[-1], child)
    return newest[1] if newest else None


async def load_manifests(
    load: Callable[[CheckpointId], Awaitable[CheckpointManifest]],
    ids: list[CheckpointId],
    *,
    limit: int = MAX_CONCURRENT_READS,
) -> list[ManifestOrDamage]:
    """Many manifests, read concurrently; one that does not load is reported in its place.

    Args:
        load: Reads one manifest (a checkpointer's ``load_manifest``).
        ids: The checkpoints whose manifests are read.
        limit: The most read at once.

    Returns:
        For each id, in the order given, its manifest, or the damage, not-found or
        newer-format error its load raised (see :data:`ManifestOrDamage`). Any other
        error (a store failure) is raised.
    """
    gate = asyncio.Semaphore(limit)

    async def one(cid: CheckpointId) -> ManifestOrDamage:
        async with gate:
            try:
                return await load(cid)
            except (IntegrityError, CheckpointNotFoundError, NewerFormatError) as exc:
                return exc

    return list(await asyncio.gather(*(one(cid) for cid in ids)))


def is_short_id(text: str) -> bool:
    """Whether some text is a short id.

    Args:
        text: The text.

    Returns:
        True for :data:`MIN_SHORT_ID` to 35 characters of the hyphenated form of an id
        (hex digits, hyphens where the form has them; any case).
    """
    if not isinstance(text, str) or not MIN_SHORT_ID <= len(text) < len(_ID_FORM):
        return False
    return all(
        (c == "-") if form == "-" else (c in _HEX)
        for c, form in zip(text.lower(), _ID_FORM, strict=False)
    )


def matching_ids(prefix: str, ids: Iterable[CheckpointId]) -> list[CheckpointId]:
    """The ids whose text starts with a prefix, in any case.

    Args:
        prefix: The start of an id's text.
        ids: The ids to look among.

    Returns:
        Those that match, oldest first.
    """
    wanted = prefix.lower()
    return sorted(cid for cid in ids if str(cid).startswith(wanted))


async def resolve_checkpoint_id(
    value: CheckpointId | str,
    list_ids: Callable[[], Awaitable[list[CheckpointId]]],
    committed: Callable[[CheckpointId], Awaitable[bool]],
    *,
    where: str = "",
) -> CheckpointId:
    """The checkpoint a full id or a short id names.

    An id, or its full text, is returned as it is, without I/O: whether it is committed
    is the caller's business. A short id is looked up among the directories
    ``list_ids`` names (one listing), those that ``committed`` admits: exactly one must
    match.

    Args:
        value: A :class:`CheckpointId`, its 36-character text, or a short id (see
            :func:`is_short_id`).
        list_ids: Lists the checkpoint directories.
        committed: Whether a directory's checkpoint is committed.
        where: The place searched, for the not-found message; empty names none.

    Returns:
        The checkpoint id.

    Raises:
        CheckpointNotFoundError: No committed checkpoint matches the short id.
        AmbiguousCheckpointIdError: Several do; the message names them.
        InvalidInputError: ``value`` is neither an id nor a short id.
    """
    if isinstance(value, CheckpointId):
        return value
    if not isinstance(value, str):
        raise InvalidInputError(f"expected a CheckpointId or its text, got {value!r}")
    if not is_short_id(value):
        if len(value) == len(_ID_FORM):
            return CheckpointId.parse(value)
        raise InvalidInputError(
            f"not a checkpoint id: {value!r} (expected its 36 characters, or at least the "
            f"first {MIN_SHORT_ID} of them)"
        )
    candidates = matching_ids(value, await list_ids())
    found = [cid for cid in candidates if await committed(cid)]
    if not found:
        place = f" in {where}" if where else ""
        detail = f"no committed checkpoint{place} has an id that starts with it"
        raise CheckpointNotFoundError(value, "checkpoint", detail)
    if len(found) > 1:
        raise AmbiguousCheckpointIdError(value, [str(cid) for cid in found])
    return found[0]


def short_ids(
    ids: Iterable[CheckpointId], *, min_length: int = MIN_SHORT_ID
) -> dict[CheckpointId, str]:
    """The shortest prefix of each id's text that tells it apart from the others (as git
    abbreviates commits): what a table shows, and what :func:`resolve_checkpoint_id`
    takes back while no newer checkpoint shares it.

    Args:
        ids: The ids.
        min_length: The fewest characters of a prefix.

    Returns:
        Each id's prefix: at least ``min_length`` characters, never ending in a hyphen,
        and one no other of ``ids`` starts with.
    """
    given = list(ids)
    texts = sorted({str(cid) for cid in given})
    shortest: dict[str, int] = {}
    for i, text in enumerate(texts):
        need = min_length
        for other in texts[max(i - 1, 0) : i] + texts[i + 1 : i + 2]:
            common = next(
                (k for k, (a, b) in enumerate(zip(text, other, strict=True)) if a != b), len(text)
            )
            need = max(need, common + 1)
        while need < len(text) and text[need - 1] == "-":
            need += 1
        shortest[text] = min(need, len(text))
    return {cid: str(cid)[: shortest[str(cid)]] for cid in given}


@dataclass(frozen=True, slots=True)
class CheckpointCounts:
    """How big one checkpoint is, from its manifest alone: every tool shows these.

    An *artifact* is one entry of a restore chain (a snapshot or a delta); a *partition*
    is one ``(operator, partition)`` whose chain it is, so a partition has one artifact or
    more. *Uploaded* artifacts are those this checkpoint holds itself (its save sent
    them); *carried* ones those its chains take from earlier checkpoints by reference,
    the whole chain counted, not only what its parent held. Bytes are sizes as handed
    to ``save`` (before compression).

    Attributes:
        partitions: The partitions.
        artifacts: The artifacts of all their chains.
        uploaded_artifacts: The artifacts uploaded.
        carried_artifacts: The artifacts carried.
        size_bytes: The manifest's total.
        uploaded_bytes: The bytes of the artifacts uploaded.
        carried_bytes: The bytes of the artifacts carried.
        unchanged_partitions: The partitions this save sent nothing for (all of their
            state is carried).
        writer_generation: That of the writer that committed it: 0 for one that never
            took over.
    """

    partitions: int
    artifacts: int
    uploaded_artifacts: int
    carried_artifacts: int
    size_bytes: int
    uploaded_bytes: int
    carried_bytes: int
    unchanged_partitions: int
    writer_generation: int

    @property
    def updated_partitions(self) -> int:
        """Partitions this save sent new state for (a snapshot or a delta)."""
        return self.partitions - self.unchanged_partitions


def checkpoint_counts(manifest: CheckpointManifest) -> CheckpointCounts:
    """How big a checkpoint is, from its manifest. Pure.

    A file of a directory partition counts as one artifact, as the save's own statistics
    count it (``manifest.stats``).

    Args:
        manifest: The checkpoint's manifest.

    Returns:
        Its counts.
    """
    entries = [
        (op, e.partition_id, e.owner, e.size_bytes) for op, e in manifest.partition_entries()
    ]
    entries += [
        (d.operator, d.partition_id, f.owner, f.size_bytes) for d, f in manifest.file_entries()
    ]
    own = [size for _, _, owner, size in entries if owner is None]
    carried = [size for _, _, owner, size in entries if owner is not None]
    partitions = {(op, partition) for op, partition, _, _ in entries}
    updated = {(op, partition) for op, partition, owner, _ in entries if owner is None}
    return CheckpointCounts(
        partitions=len(partitions),
        artifacts=len(entries),
        uploaded_artifacts=len(own),
        carried_artifacts=len(carried),
        size_bytes=manifest.total_size_bytes,
        uploaded_bytes=sum(own),
        carried_bytes=sum(carried),
        unchanged_partitions=len(partitions - updated),
        writer_generation=manifest.writer_generation or 0,
    )
