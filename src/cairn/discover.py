"""Finding checkpoints in a store: where they are, and what their manifests say. Reads only.

A *checkpoint directory* is a one-level child ``{prefix}{id}/`` of a base prefix whose
name is a checkpoint id (:meth:`~cairn.CheckpointPaths.parse_checkpoint_dir`),
committed or not: a save in progress, or one that stopped before its commit, has one
too. Whether it is committed is its manifest's business
(:meth:`~cairn.ObjectStoreCheckpointer.list_checkpoints` lists only those).

* :func:`checkpoint_dirs`: every checkpoint directory under one base prefix
  (:meth:`~cairn.ObjectStoreCheckpointer.list_checkpoint_dirs` on a checkpointer);
* :func:`checkpoint_prefixes`: the base prefixes of a store that hold checkpoint
  directories, found by a bounded walk from the store's root, for tools that help a
  user who named the wrong prefix;
* :func:`newest_checkpoint_prefix`: of the prefixes one level under a parent (runs of
  one job, say), the one holding the newest checkpoint id (ids are time-ordered);
* :func:`load_manifests`: many manifests, read concurrently, where one that is damaged
  or deleted since it was listed is reported in its place instead of failing the lot
  (:meth:`~cairn.ObjectStoreCheckpointer.load_manifests` on a checkpointer).

Invariant: nothing here writes, and the walk of :func:`checkpoint_prefixes` costs at
most ``max_listings`` one-level listings, whatever the size of the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from cairn.errors import CheckpointNotFoundError, IntegrityError
from cairn.ids import CheckpointId
from cairn.layout import CheckpointPaths
from cairn.manifest import CheckpointManifest
from cairn.stores import Store

__all__ = [
    "MAX_CONCURRENT_READS",
    "MAX_PREFIX_DEPTH",
    "MAX_PREFIX_LISTINGS",
    "ManifestOrDamage",
    "checkpoint_dirs",
    "checkpoint_prefixes",
    "load_manifests",
    "newest_checkpoint_prefix",
]

MAX_PREFIX_LISTINGS = 40
"""At most this many one-level listings in :func:`checkpoint_prefixes` and
:func:`newest_checkpoint_prefix`: a few, whatever the size of the bucket."""
MAX_PREFIX_DEPTH = 3
"""How many levels below the root :func:`checkpoint_prefixes` looks."""
MAX_CONCURRENT_READS = 16
"""Manifests :func:`load_manifests` reads at once."""

ManifestOrDamage = CheckpointManifest | IntegrityError | CheckpointNotFoundError
"""A manifest, or what made it unloadable: damage (an :class:`IntegrityError`, a
signature a reader's keys refuse among them) or a checkpoint deleted since it was
listed."""


async def checkpoint_dirs(store: Store, paths: CheckpointPaths) -> list[CheckpointId]:
    """The id of every checkpoint directory under ``paths``' base prefix, oldest first,
    committed or not. One listing."""
    listing = await store.list_dir(paths.base_prefix)
    return sorted(
        cid for child in listing.prefixes if (cid := paths.parse_checkpoint_dir(child)) is not None
    )


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

    Looks at the ``max_listings`` last by name (runs named by their start time sort
    oldest first).
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
    """``load(cid)`` for each of ``ids``, at most ``limit`` at once, in the order given;
    where it raises damage or not-found (see :data:`ManifestOrDamage`), that error in
    its place. Any other error (a store failure) is raised."""
    gate = asyncio.Semaphore(limit)

    async def one(cid: CheckpointId) -> ManifestOrDamage:
        async with gate:
            try:
                return await load(cid)
            except (IntegrityError, CheckpointNotFoundError) as exc:
                return exc

    return list(await asyncio.gather(*(one(cid) for cid in ids)))
