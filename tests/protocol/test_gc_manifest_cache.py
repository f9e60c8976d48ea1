"""A checkpointer's GC reads a committed manifest once, while the listing shows it unchanged.

A retention GC after every commit reads the manifests of every checkpoint it keeps on
every run; a committed manifest never changes in place, so the runs after the first
take it from the checkpointer's :class:`~cairn.protocol._manifestcache.ManifestCache`.
One that did change (retired to a tombstone, deleted and committed again) is read anew.
"""

from __future__ import annotations

import msgspec
from obstore.store import MemoryStore
from support.faults import FaultyStore

from cairn import CheckpointData, ObjectStoreCheckpointer, RetentionPolicy
from cairn.format.manifest import encode_manifest
from cairn.stores import ObstoreStore


def manifest_reads(store: FaultyStore) -> int:
    """The reads of a manifest the store has seen."""
    return sum(
        1 for op, path in store.log if op in ("get", "get_range") and path.endswith("manifest.json")
    )


async def test_a_second_gc_reads_no_manifest_the_listing_shows_unchanged() -> None:
    store = FaultyStore(ObstoreStore(MemoryStore()))
    ckpt = ObjectStoreCheckpointer(store)
    for epoch in range(1, 6):
        await ckpt.save(CheckpointData(epoch=epoch, snapshots={("op", 0): b"%d" % epoch}))
    policy = RetentionPolicy(keep_last=3)
    first = await ckpt.gc(policy)
    assert len(first.deleted) == 2
    before = manifest_reads(store)
    again = await ckpt.gc(policy)
    assert manifest_reads(store) == before, "every kept manifest was read again"
    assert again.deleted == [] and sorted(again.retained) == sorted(first.retained)
    # A new checkpointer has read nothing yet: it reads each kept manifest once.
    fresh = ObjectStoreCheckpointer(store)
    await fresh.gc(policy)
    assert manifest_reads(store) == before + 3


async def test_a_manifest_that_changed_under_its_path_is_read_again() -> None:
    store = FaultyStore(ObstoreStore(MemoryStore()))
    ckpt = ObjectStoreCheckpointer(store)
    saved = [
        await ckpt.save(CheckpointData(epoch=epoch, snapshots={("op", 0): b"%d" % epoch}))
        for epoch in (1, 2)
    ]
    policy = RetentionPolicy(keep_last=2)
    await ckpt.gc(policy)
    # The same id's manifest written again with another epoch (no cairn writer does):
    # the listing shows another object there, so its cached decoding is not used.
    changed = msgspec.structs.replace(saved[0], epoch=7)
    await store.inner.put(ckpt.paths.manifest(saved[0].checkpoint_id), encode_manifest(changed))
    before = manifest_reads(store)
    await ckpt.gc(policy)
    assert manifest_reads(store) == before + 1  # that one; the other is unchanged
