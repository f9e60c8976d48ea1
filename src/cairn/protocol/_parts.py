"""Reading the parts of a large manifest: a root's entries, from the store.

A manifest of more than :data:`cairn.format.manifest.PART_ENTRIES` entries is stored as a root
and parts (see :mod:`cairn.format.manifest`). Invariants:

* a part is read with one request of its recorded size plus one byte, so a part of any
  other length is refused unhashed, and nothing over the recorded size is held;
* a part that is missing, of another size or digest, or whose entries are not the ones
  its record describes, makes the manifest damaged: :class:`CorruptManifestError`
  naming the part (readers skip the checkpoint and fall back, as for a damaged root);
  a store failure is raised as it is;
* :func:`read_whole` gives exactly the manifest that was written, checked whole;
  :func:`read_partition` reads the root's one part that holds a partition.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cairn.errors import CheckpointNotFoundError, CorruptManifestError
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import (
    CheckpointManifest,
    ManifestPart,
    PartitionSnapshotEntry,
    assemble,
    decode_part,
    part_of,
)
from cairn.protocol._concurrency import bounded_gather
from cairn.stores import Store

__all__ = ["PARTS_IN_FLIGHT", "read_partition", "read_whole"]

PARTS_IN_FLIGHT = 8
"""Parts of one manifest read at once."""

_Read = tuple[ManifestPart, tuple[PartitionSnapshotEntry, ...]]


async def read_whole(
    store: Store, paths: CheckpointPaths, path: str, root: CheckpointManifest
) -> CheckpointManifest:
    """The manifest whose root, read at ``path``, is ``root``: every entry in place."""
    if not root.parts:
        return root

    def job(record: ManifestPart) -> Callable[[], Awaitable[_Read]]:
        return lambda: _read_part(store, paths, root, record)

    read = await bounded_gather(PARTS_IN_FLIGHT, [job(record) for record in root.parts])
    return assemble(path, root, read)


async def read_partition(
    store: Store,
    paths: CheckpointPaths,
    path: str,
    root: CheckpointManifest,
    operator: str,
    partition: int,
) -> CheckpointManifest:
    """``root`` with the entries of the one part that holds ``partition`` of ``operator``
    (none when no part does); a root without parts is returned as it is."""
    if not root.parts:
        return root
    record = part_of(root, operator, partition)
    read = [] if record is None else [await _read_part(store, paths, root, record)]
    return assemble(path, root, read)


async def _read_part(
    store: Store, paths: CheckpointPaths, root: CheckpointManifest, record: ManifestPart
) -> _Read:
    path = paths.resolve(root.checkpoint_id, record.path)
    try:
        data = await store.get_range(path, 0, record.size_bytes + 1)
    except CheckpointNotFoundError:
        raise CorruptManifestError(path, "this part of its manifest is missing") from None
    return record, decode_part(root, record, path, data)
