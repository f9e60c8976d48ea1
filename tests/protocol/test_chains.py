"""Incremental chains: carried-over partitions, deltas on a parent's state, load_chain."""

from __future__ import annotations

import pytest
from support.artifacts import artifact_path
from support.samples import reference_style_delta

from cairn import (
    BrokenChainError,
    CheckpointData,
    CheckpointInUseError,
    CheckpointManifest,
    CheckpointNotFoundError,
    IntegrityMismatchError,
    InvalidCheckpointDataError,
    ObjectStoreCheckpointer,
)


async def build_chain(ckpt: ObjectStoreCheckpointer) -> list[CheckpointManifest]:
    """base (2 partitions) -> delta on p0 -> nothing new -> delta on p0 + new snapshot p1."""
    base = await ckpt.save(
        CheckpointData(epoch=1, snapshots={("agg", 0): b"A0", ("agg", 1): b"B0"})
    )
    d1 = await ckpt.save(
        CheckpointData(epoch=2, deltas={("agg", 0): b"+a1"}, parent_id=base.checkpoint_id)
    )
    same = await ckpt.save(CheckpointData(epoch=3, parent_id=d1.checkpoint_id))
    d2 = await ckpt.save(
        CheckpointData(
            epoch=4,
            deltas={("agg", 0): b"+a2"},
            snapshots={("agg", 1): b"B4"},
            parent_id=same.checkpoint_id,
        )
    )
    return [base, d1, same, d2]


async def test_chains_are_carried_and_extended(ckpt: ObjectStoreCheckpointer) -> None:
    base, d1, same, d2 = await build_chain(ckpt)
    chain = await ckpt.load_chain(d2.checkpoint_id, "agg", 0)
    assert [bytes(link.data) for link in chain] == [b"A0", b"+a1", b"+a2"]
    assert [link.owner for link in chain] == [
        base.checkpoint_id,
        d1.checkpoint_id,
        d2.checkpoint_id,
    ]
    assert [link.entry.is_delta for link in chain] == [False, True, True]
    assert [bytes(x.data) for x in await ckpt.load_chain(d2.checkpoint_id, "agg", 1)] == [b"B4"]
    carried = await ckpt.load(same.checkpoint_id)
    assert {k: [bytes(x.data) for x in v] for k, v in carried.chains.items()} == {
        ("agg", 0): [b"A0", b"+a1"],
        ("agg", 1): [b"B0"],
    }
    assert bytes(carried.artifacts[("agg", 1)]) == b"B0"


async def test_carried_partitions_are_not_uploaded_again(ckpt: ObjectStoreCheckpointer) -> None:
    base, _, same, _ = await build_chain(ckpt)
    own = [i.path for i in await ckpt.store.list(ckpt.paths.checkpoint_dir(same.checkpoint_id))]
    # The intent ended with the save.
    assert sorted(p.rsplit("/", 1)[1] for p in own) == ["manifest.json"]
    entries = same.operators["agg"].partitions
    assert {e.owner for e in entries if not e.is_delta} == {base.checkpoint_id}
    assert all(e.owner is not None for e in entries), "every entry points to its owner"


async def test_a_checkpoint_copied_elsewhere_still_resolves(ckpt: ObjectStoreCheckpointer) -> None:
    *_, last = await build_chain(ckpt)
    moved = ObjectStoreCheckpointer(ckpt.store, paths=type(ckpt.paths)("elsewhere/"))
    for info in await ckpt.store.list(ckpt.paths.base_prefix):
        target = "elsewhere/" + info.path[len(ckpt.paths.base_prefix) :]
        await ckpt.store.put(target, (await ckpt.store.get(info.path)).data)
    chain = await moved.load_chain(last.checkpoint_id, "agg", 0)
    assert [bytes(link.data) for link in chain] == [b"A0", b"+a1", b"+a2"]


async def test_broken_chains_name_the_link(ckpt: ObjectStoreCheckpointer) -> None:
    base, d1, _, d2 = await build_chain(ckpt)
    delta_path = artifact_path(ckpt.paths, d1, "agg", 0, is_delta=True)
    await ckpt.store.put(delta_path, b"+XX")
    with pytest.raises(IntegrityMismatchError) as mismatch:
        await ckpt.load_chain(d2.checkpoint_id, "agg", 0)
    assert mismatch.value.path == delta_path
    # Mend the delta, so that the missing base is the only broken link (with two, which
    # one is reported first depends on which download fails first).
    await ckpt.store.put(delta_path, b"+a1")
    await ckpt.delete_checkpoint(base.checkpoint_id, force=True)  # breaks the chain
    base_path = artifact_path(ckpt.paths, base, "agg", 0)
    with pytest.raises(BrokenChainError) as broken:
        await ckpt.load_chain(d2.checkpoint_id, "agg", 0)
    assert base_path in str(broken.value)
    assert broken.value.link == base_path
    loaded_latest = await ckpt.load_latest()
    assert loaded_latest is None, "no checkpoint of this chain is whole any more"
    with pytest.raises(CheckpointNotFoundError):
        await ckpt.load_chain(d2.checkpoint_id, "agg", 7)


async def test_reference_style_manifest_walks_parents(ckpt: ObjectStoreCheckpointer) -> None:
    """A manifest written the reference's way lists only its deltas; the base is the parent's."""
    base_id, cid = await reference_style_delta(ckpt)
    chain = await ckpt.load_chain(cid, "op", 0)
    assert [bytes(link.data) for link in chain] == [b"base", b"+d"]
    with pytest.raises(CheckpointInUseError) as refused:  # its manifest is a link of cid's
        await ckpt.delete_checkpoint(base_id)
    assert refused.value.dependents == [str(cid)]
    await ckpt.delete_checkpoint(base_id, force=True)
    with pytest.raises(BrokenChainError, match="parent .* is missing") as info:
        await ckpt.load(cid)
    assert str(base_id) in info.value.link


async def test_a_delta_needs_a_base_in_its_parent(ckpt: ObjectStoreCheckpointer) -> None:
    base = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    before = sorted(i.path for i in await ckpt.store.list(""))
    with pytest.raises(InvalidCheckpointDataError, match="no base"):
        await ckpt.save(
            CheckpointData(epoch=2, deltas={("op", 9): b"+"}, parent_id=base.checkpoint_id)
        )
    assert sorted(i.path for i in await ckpt.store.list("")) == before
