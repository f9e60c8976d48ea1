"""Checkpoints written by cairn 0.1.0 keep loading, listing, verifying, copying and
collecting.

``tests/data/store-0.1.0`` is a local store that release wrote: artifacts under the
attempt-less names (``partition-0.snap``), copies of the source offsets in
``offsets/{source}.json``, the local compare-and-swap's ``._latest.lock`` sidecar. It
holds a full checkpoint, an incremental one on it (a delta, a carried partition), a
zstd-compressed one, and one committed the reference's way (``save_snapshot``, then
``commit``).
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
from support.cli import cairn
from support.paths import DATA

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointInUseError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
)

OLD_STORE = DATA / "store-0.1.0"
BASE = CheckpointId.parse("01a2310e-6005-75f3-81cd-268cf0cd0955")
INCREMENTAL = CheckpointId.parse("01a2310e-6016-774e-aaeb-9cfb68f11544")
COMPRESSED = CheckpointId.parse("01a2310e-6025-7615-88e6-d58bc6574833")
REFERENCE = CheckpointId.parse("01a2310e-6031-70ef-a510-2a8926d99956")

EXPECTED = {
    BASE: {("agg", 0): b"agg-0 base", ("agg", 1): b"agg-1 base"},
    INCREMENTAL: {("agg", 0): b"agg-0 base+agg-0 delta", ("agg", 1): b"agg-1 base"},
    COMPRESSED: {("agg", 0): b"compressed " * 300, ("agg", 1): b"agg-1 v3"},
    REFERENCE: {("ref", 0): b"reference-style snapshot", ("ref", 1): b"ref-1"},
}


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    """A copy of the store 0.1.0 wrote (tests may change it)."""
    root = tmp_path / "old"
    shutil.copytree(OLD_STORE, root)
    return root


def restored(chains: dict[tuple[str, int], list[bytes]]) -> dict[tuple[str, int], bytes]:
    return {key: b"".join(links) for key, links in chains.items()}


async def test_every_old_checkpoint_lists_and_loads_bit_exact(old_store: Path) -> None:
    ckpt = ObjectStoreCheckpointer(old_store.as_uri())
    assert await ckpt.list_checkpoints() == [BASE, INCREMENTAL, COMPRESSED, REFERENCE]
    assert await ckpt.read_latest() == REFERENCE
    for cid, expected in EXPECTED.items():
        loaded = await ckpt.load(cid)
        chains = {key: [bytes(link.data) for link in links] for key, links in loaded.chains.items()}
        assert restored(chains) == expected, cid
    incremental = await ckpt.load(INCREMENTAL)
    assert incremental.source_offsets["events"].offsets == {"events-0": "200"}
    latest = await ckpt.load_latest()
    assert latest is not None and latest.checkpoint_id == REFERENCE


async def test_new_saves_build_on_old_ones_and_gc_keeps_what_they_carry(old_store: Path) -> None:
    ckpt = ObjectStoreCheckpointer(old_store.as_uri())
    new = await ckpt.save(
        CheckpointData(epoch=5, deltas={("agg", 1): b"+new"}, parent_id=INCREMENTAL)
    )
    loaded = await ckpt.load(new.checkpoint_id)
    chains = {key: [bytes(link.data) for link in links] for key, links in loaded.chains.items()}
    assert restored(chains) == {
        ("agg", 0): b"agg-0 base+agg-0 delta",
        ("agg", 1): b"agg-1 base+new",
    }
    with pytest.raises(CheckpointInUseError):
        await ckpt.delete_checkpoint(BASE)
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.retained == [new.checkpoint_id] and not result.failures
    assert sorted(result.deleted) == sorted(EXPECTED)
    again = await ckpt.load(new.checkpoint_id)
    assert {k: bytes(v) for k, v in again.artifacts.items()} == {
        ("agg", 0): b"+agg-0 delta",
        ("agg", 1): b"+new",
    }
    # What the new checkpoint carries from the old ones stays, under the old names.
    assert (old_store / f"checkpoints/{BASE}/operators/agg/partition-0.snap").exists()


def test_the_command_line_verifies_copies_and_restores_old_checkpoints(
    old_store: Path, tmp_path: Path
) -> None:
    _, restore_dir = verify_copy_restore(old_store, INCREMENTAL, tmp_path)
    delta = restore_dir / str(INCREMENTAL) / "operators/agg/partition-0.delta"
    assert delta.read_bytes() == b"+agg-0 delta"


# -- checkpoints written before packs ------------------------------------------------------
#
# ``tests/data/store-unpacked`` is a local store written by cairn before small partitions
# were merged into packs: one object per partition, attempt-named
# (``partition-0.{attempt}.snap``), entries without ``offset``. It holds a full checkpoint
# (an empty partition among its three), an incremental one on it (a delta, a carried
# partition) and a zstd-compressed full one.

UNPACKED_STORE = DATA / "store-unpacked"
U_BASE = CheckpointId.parse("01a2323c-8b55-7368-ab7b-3b6223c371c5")
U_INCREMENTAL = CheckpointId.parse("01a2323c-8b66-7c09-a6ab-e212801edff6")
U_COMPRESSED = CheckpointId.parse("01a2323c-8b79-78ac-999a-526f9f916478")
U_EXPECTED = {
    U_BASE: {("agg", 0): b"agg-0 base", ("agg", 1): b"agg-1 base", ("join", 0): b""},
    U_INCREMENTAL: {
        ("agg", 0): b"agg-0 base+agg-0 delta",
        ("agg", 1): b"agg-1 base",
        ("join", 0): b"",
    },
    U_COMPRESSED: {("agg", 0): b"compressed " * 300, ("agg", 1): b"agg-1 v3"},
}


@pytest.fixture
def unpacked_store(tmp_path: Path) -> Path:
    """A copy of the store cairn wrote before packs (tests may change it)."""
    root = tmp_path / "unpacked"
    shutil.copytree(UNPACKED_STORE, root)
    return root


async def test_unpacked_checkpoints_load_carry_and_are_collected(unpacked_store: Path) -> None:
    ckpt = ObjectStoreCheckpointer(unpacked_store.as_uri())
    assert await ckpt.list_checkpoints() == [U_BASE, U_INCREMENTAL, U_COMPRESSED]
    for cid, expected in U_EXPECTED.items():
        loaded = await ckpt.load(cid)
        chains = {key: [bytes(link.data) for link in links] for key, links in loaded.chains.items()}
        assert restored(chains) == expected, cid
        chain = await ckpt.load_chain(cid, "agg", 0)
        assert b"".join(bytes(link.data) for link in chain) == expected[("agg", 0)]
    # A save of today builds on them: it carries the old objects as they are.
    new = await ckpt.save(
        CheckpointData(
            epoch=4,
            deltas={("agg", 1): b"+new"},
            snapshots={("fresh", 0): b"fresh"},
            parent_id=U_INCREMENTAL,
        )
    )
    carried = {
        (op, e.partition_id, e.is_delta): e
        for op, e in new.partition_entries()
        if e.owner is not None
    }
    assert carried[("agg", 0, False)].path == "operators/agg/partition-0.ccec11089e25.snap"
    assert all(e.offset is None for e in carried.values())  # whole objects, as written
    assert await ckpt.dependents(U_BASE) == [U_INCREMENTAL, new.checkpoint_id]
    with pytest.raises(CheckpointInUseError):
        await ckpt.delete_checkpoint(U_BASE)
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.retained == [new.checkpoint_id] and not result.failures
    assert sorted(result.deleted) == sorted(U_EXPECTED)
    again = await ckpt.load(new.checkpoint_id)
    chains = {key: [bytes(link.data) for link in links] for key, links in again.chains.items()}
    assert restored(chains) == {
        ("agg", 0): b"agg-0 base+agg-0 delta",
        ("agg", 1): b"agg-1 base+new",
        ("join", 0): b"",
        ("fresh", 0): b"fresh",
    }
    # What it carries stays under the old names; the compressed checkpoint is gone whole.
    base_dir = unpacked_store / f"checkpoints/{U_BASE}/operators"
    assert (base_dir / "agg/partition-1.ccec11089e25.snap").read_bytes() == b"agg-1 base"
    assert not (unpacked_store / f"checkpoints/{U_COMPRESSED}").exists()


def test_the_command_line_lists_verifies_copies_and_restores_unpacked_checkpoints(
    unpacked_store: Path, tmp_path: Path
) -> None:
    store = ["--store", unpacked_store.as_uri()]
    listed = cairn("list", "--json", *store)
    assert listed.code == 0, listed.explain()
    rows = {row["id"]: row for row in listed.json()["checkpoints"]}
    assert (rows[str(U_BASE)]["artifacts"], rows[str(U_INCREMENTAL)]["artifacts"]) == (3, 4)
    target, restore_dir = verify_copy_restore(unpacked_store, U_INCREMENTAL, tmp_path)
    copied_base = target / f"checkpoints/{U_BASE}/operators/agg/partition-0.ccec11089e25.snap"
    assert copied_base.read_bytes() == b"agg-0 base"
    delta = restore_dir / str(U_INCREMENTAL) / "operators/agg/partition-0.ff877a491506.delta"
    assert delta.read_bytes() == b"+agg-0 delta"


def verify_copy_restore(
    store_root: Path, restored: CheckpointId, tmp_path: Path
) -> tuple[Path, Path]:
    """``cairn verify --all`` of the store at ``store_root``, ``copy --all`` to a new
    store, ``verify --all`` there, and ``restore`` of ``restored``, each succeeding; the
    copy's root and the restore directory."""
    store = ["--store", store_root.as_uri()]
    verified = cairn("verify", "--all", *store)
    assert verified.code == 0, verified.explain()
    target = tmp_path / "copied"
    copied = cairn("copy", "--all", "--to", target.as_uri(), *store)
    assert copied.code == 0, copied.explain()
    again = cairn("verify", "--all", "--store", target.as_uri())
    assert again.code == 0, again.explain()
    restore_dir = tmp_path / "restored"
    restore = cairn("restore", str(restored), "--to", str(restore_dir), *store)
    assert restore.code == 0, restore.explain()
    return target, restore_dir
