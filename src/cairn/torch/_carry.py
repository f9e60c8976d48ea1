"""What an incremental DCP save carries from the checkpoint it builds on. No uploads.

``CairnWriter(..., incremental=True)`` builds on a parent DCP checkpoint (by default
the one :class:`~cairn.torch.CairnReader` would load as the latest). An item whose key
(its ``MetadataIndex``: fully qualified name and chunk offsets), dtype, shape, length
and SHA-256 equal the parent's record of that key is not uploaded again: its record
stays the parent's, and the manifest lists the parent's artifact holding it as an
entry owned by the checkpoint that uploaded it (``owner``), so GC, ``dependents``,
verification and copies treat it as any carried partition.

Invariants:

* an item is carried only when the SHA-256 of the bytes being saved equals the
  parent's recorded SHA-256 (computed here, from the bytes themselves), with the same
  dtype, shape and length; anything else is uploaded;
* the parent's records were read from verified metadata (:func:`open_dcp`), so a
  carried record is one that loaded;
* the new checkpoint's own partitions are numbered after every partition of the
  parent (:attr:`Parent.first_partition`), so its entries never collide with a carried
  one in the same operator;
* the coordinator opens the parent (its manifest and DCP metadata, verified) and hands
  every rank its id in the plan; each rank reads the parent's records of its own items
  (:func:`carry_for`: with a chunk table, only the blocks holding them; a rank saving
  what it saved before reads one), so no process does work per item of the whole
  checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Sequence

import msgspec
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import WriteItem

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import CheckpointNotFoundError
from cairn.format.ids import CheckpointId
from cairn.format.integrity import sha256_hex
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.torch._opendcp import load_records, open_dcp
from cairn.torch._rankobject import Written
from cairn.torch._target import Target

__all__ = [
    "HASH_THREADS",
    "Carried",
    "Parent",
    "carried_if_equal",
    "carried_items",
    "carry_for",
    "open_parent",
]

HASH_THREADS = min(8, os.cpu_count() or 1)
"""Threads that hash a rank's items against the parent's at once (hashlib releases the
GIL while it hashes a large buffer)."""


Carried = Written
"""The parent's record of one item, and the operator and entry (owner set) of the
artifact holding it: what an item carried by reference is written as."""


@dataclasses.dataclass(frozen=True)
class Parent:
    """The checkpoint an incremental save builds on, as the coordinator opened it."""

    checkpoint_id: CheckpointId
    manifest: CheckpointManifest
    first_partition: int


async def open_parent(ckpt: ObjectStoreCheckpointer, target: Target | None) -> Parent | None:
    """The DCP checkpoint ``target`` names (None: the latest, as ``CairnReader`` picks
    it), opened and verified; None when ``target`` is None and there is none.

    An explicit ``target`` that is not there raises :class:`CheckpointNotFoundError`.
    """
    try:
        opened = await open_dcp(ckpt, target)
    except CheckpointNotFoundError:
        if target is not None:
            raise
        return None
    manifest = opened.manifest
    last = max((entry.partition_id for _, entry in manifest.partition_entries()), default=-1)
    return Parent(opened.checkpoint_id, manifest, last + 1)


async def carry_for(
    ckpt: ObjectStoreCheckpointer, parent_id: CheckpointId, items: Sequence[WriteItem]
) -> dict[MetadataIndex, Carried]:
    """The parent's records of ``items`` (those it holds), each with the entry of the
    artifact holding it, owner set: what a rank saving ``items`` may carry. The parent is
    opened and verified again (its id is fixed; its manifest, written create-only, is
    the one the coordinator checked), and only the blocks holding these records read."""
    opened = await open_dcp(ckpt, parent_id)
    indices = [item.index for item in items]
    await load_records(ckpt, opened, indices)
    located: dict[str, tuple[str, PartitionSnapshotEntry]] = {}
    for operator, entry in opened.manifest.partition_entries():
        # The bytes this checkpoint uses of it are counted anew (rank_items).
        owned = msgspec.structs.replace(entry, owner=entry.owner or parent_id, used_bytes=None)
        located[entry.path] = (operator, owned)
    found: dict[MetadataIndex, Carried] = {}
    for index in indices:
        record = opened.records.get(index)
        if record is not None:
            operator, entry = located[record.artifact]
            found[index] = Carried(record.stored(), operator, entry)
    return found


def carried_if_equal(
    carried: Carried | None, view: memoryview, dtype: str, shape: tuple[int, ...]
) -> Carried | None:
    """``carried`` when the bytes ``view`` (of ``dtype``/``shape``) are the very item it
    records (same dtype, shape, length and SHA-256); None otherwise."""
    if carried is None:
        return None
    _, _, length, sha256, old_dtype, old_shape = carried.record[:6]
    if (old_dtype, tuple(old_shape), length) != (dtype, shape, view.nbytes):
        return None
    return carried if sha256_hex(view) == sha256 else None


Candidate = tuple[Carried | None, memoryview, str, tuple[int, ...]]
"""The parent's record of an item (if any), and the item's bytes, dtype and shape."""


def carried_items(candidates: Sequence[Candidate]) -> list[Carried | None]:
    """:func:`carried_if_equal` of each candidate, in order; the SHA-256s are computed in
    up to :data:`HASH_THREADS` threads."""
    hashed = sum(1 for carried, *_ in candidates if carried is not None)
    if hashed <= 1 or HASH_THREADS == 1:
        return [carried_if_equal(*candidate) for candidate in candidates]
    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        return list(pool.map(lambda candidate: carried_if_equal(*candidate), candidates))
