"""Restore chains: which stored artifacts rebuild each partition, base snapshot first.

Invariants:

* cairn writes every partition's whole chain into each manifest (entries owned by
  earlier checkpoints carry their ``owner``), so resolving a cairn manifest reads no other
  manifest; a manifest written the reference's way lists only its own deltas, and their
  base is found by walking ``parent_id`` (a loop or a missing parent is a
  :class:`BrokenChainError` naming the link);
* a new incremental checkpoint carries over, by reference, the parent's chain of every
  partition it does not mention; a delta extends the parent's chain, a snapshot replaces
  it; a delta whose partition the parent has no state for is refused before any upload;
  a partition the new checkpoint saves as a directory drops the parent's chain of it
  (directory partitions carry their files themselves: :mod:`cairn.protocol._directories`);
* keyed state (:class:`~cairn.data.keyed.KeyedSnapshot`) keeps one key space across a
  chain: a new keyed partition must have the parent's key-group count, and a parent's
  keyed partition the new checkpoint does not mention is carried only if it shares no
  group with the new ones, dropped if they hold all its groups (a rescale), refused if
  they hold some (:class:`KeySpaceMismatchError`, before any upload); a new keyed
  partition's groups whose bytes equal the parent's are carried by reference, not
  uploaded (:func:`cairn.protocol._keyed.unchanged_groups`);
* a parent committed by a fenced writer after the takeover is never built upon.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from cairn.data import ArtifactKey, CheckpointData
from cairn.data.keyed import KeyedSnapshot
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    InvalidCheckpointDataError,
    KeySpaceMismatchError,
)
from cairn.format.ids import CheckpointId
from cairn.format.keygroups import from_runs
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.protocol import _catalog, _keyed, _pointer
from cairn.protocol._context import Context

__all__ = ["Chains", "carried_chains", "check_admitted", "resolve_chains"]

Chains = dict[ArtifactKey, list[tuple[CheckpointId, PartitionSnapshotEntry]]]
"""Each partition's chain as ``(owner, entry)`` links, base first."""


async def resolve_chains(
    ctx: Context, manifest: CheckpointManifest, visiting: frozenset[CheckpointId] = frozenset()
) -> Chains:
    """Each partition's restore chain in ``manifest``, as ``(owner, entry)`` links."""
    cid = manifest.checkpoint_id
    chains: Chains = {}
    for operator, entry in manifest.partition_entries():
        link = (entry.owner or cid, entry)
        chains.setdefault((operator, entry.partition_id), []).append(link)
    headless = [key for key, links in chains.items() if links[0][1].is_delta]
    if not headless:
        return chains
    parent_chains = await _parent_chains(ctx, manifest, visiting)
    for key in headless:
        if key not in parent_chains:
            raise BrokenChainError(
                f"{cid} {key!r}", f"no base: parent {manifest.parent_id} has no state for it"
            )
        chains[key] = parent_chains[key] + chains[key]
    return chains


async def _parent_chains(
    ctx: Context, manifest: CheckpointManifest, visiting: frozenset[CheckpointId]
) -> Chains:
    cid, parent = manifest.checkpoint_id, manifest.parent_id
    if parent is None:
        raise BrokenChainError(str(cid), "it holds deltas but has no parent")
    if parent in visiting:
        raise BrokenChainError(str(parent), "the parent chain loops")
    try:
        parent_manifest = await _catalog.load_manifest(ctx, parent)
    except CheckpointNotFoundError:
        raise BrokenChainError(
            f"parent {parent} of {cid}", "the parent checkpoint is missing"
        ) from None
    return await resolve_chains(ctx, parent_manifest, visiting | {cid})


def check_admitted(parent: CheckpointManifest, record: _pointer.WriterRecord) -> None:
    """Raise :class:`InvalidCheckpointDataError` unless ``record`` admits ``parent`` as
    one to build upon (not a fenced writer's late commit, see :mod:`cairn.protocol._pointer`)."""
    generation = parent.writer_generation or 0
    if not record.admits(generation, (parent.epoch, parent.checkpoint_id.uuid.int)):
        raise InvalidCheckpointDataError(
            f"parent {parent.checkpoint_id} was committed by writer generation {generation} "
            f"after generation {record.generation} took over (a fenced writer's "
            "checkpoint): it is not one to build upon"
        )


async def carried_chains(
    ctx: Context,
    data: CheckpointData,
    record: _pointer.WriterRecord | None = None,
    parent_committing: Callable[[], Awaitable[CheckpointManifest]] | None = None,
) -> tuple[CheckpointManifest, dict[ArtifactKey, list[tuple[str, PartitionSnapshotEntry]]]]:
    """The parent's manifest, and its links the new checkpoint keeps, as ``(operator,
    entry)`` owned elsewhere.

    Partitions ``data`` does not mention keep the parent's whole chain; a delta extends
    it; a new snapshot replaces it. With a ``record``, refuses a parent that it does not
    admit (a fenced writer's late commit, see :mod:`cairn.protocol._pointer`); without
    one, the caller checks the parent (:func:`check_admitted`) once it has read it.
    ``parent_committing``, for a parent whose save is still running in the same
    pipeline, waits for the manifest that save commits (and raises if it commits
    none): it is called instead of reading the store.
    """
    assert data.parent_id is not None
    if parent_committing is not None:
        parent = await parent_committing()
    else:
        parent = await _catalog.load_manifest(ctx, data.parent_id)
    if record is not None:
        check_admitted(parent, record)
    parent_chains = await resolve_chains(ctx, parent)
    missing_base = sorted(set(data.deltas) - set(parent_chains))
    if missing_base:
        raise InvalidCheckpointDataError(
            f"delta {missing_base[0]!r} has no base: parent {data.parent_id} "
            "holds no state for that partition"
        )
    kept = _keyed_carry(data, parent_chains)
    carried = {
        key: [(key[0], msgspec.structs.replace(entry, owner=owner)) for owner, entry in links]
        for key, links in parent_chains.items()
        if key not in data.snapshots and key not in data.directories and key in kept
    }
    carried.update(await _keyed.unchanged_groups(ctx, data, parent_chains))
    return parent, carried


def _keyed_carry(data: CheckpointData, parent_chains: Chains) -> set[ArtifactKey]:
    """The partitions of ``parent_chains`` the new checkpoint may carry as far as key
    groups go: all but a parent's keyed partition whose every group ``data`` saves anew
    (a rescale). Raises :class:`KeySpaceMismatchError` where a new keyed partition has
    another count than the parent's, or holds some, not all, of a carried one's groups."""
    saved: dict[str, dict[int, int]] = {}  # operator: group -> new partition
    counts: dict[str, int] = {}
    for (operator, partition), snapshot in data.snapshots.items():
        if isinstance(snapshot, KeyedSnapshot):
            counts[operator] = snapshot.key_groups.count
            saved.setdefault(operator, {}).update(dict.fromkeys(snapshot.groups, partition))
    kept = set(parent_chains)
    for key, links in parent_chains.items():
        operator = key[0]
        records = [entry.key_groups for _, entry in links if entry.key_groups is not None]
        if not records or operator not in counts:
            continue
        record = records[0]
        if record.count != counts[operator]:
            raise KeySpaceMismatchError(
                operator,
                f"the new partitions have {counts[operator]} key groups, parent "
                f"{data.parent_id}'s partition {key[1]} has {record.count}: the key-group "
                "count is fixed for the life of the state",
            )
        if key in data.snapshots:
            continue
        groups = sorted(g for r in records for g in from_runs(r.held))
        taken = [g for g in groups if g in saved[operator]]
        if taken and len(taken) < len(groups):
            raise KeySpaceMismatchError(
                operator,
                f"parent {data.parent_id}'s partition {key[1]} holds key groups that the new "
                f"partitions hold only in part (group {taken[0]} is saved again by partition "
                f"{saved[operator][taken[0]]}, group "
                f"{next(g for g in groups if g not in saved[operator])} is not): "
                "save every group of the parent's partition, or none",
            )
        if taken:
            kept.discard(key)
    return kept
