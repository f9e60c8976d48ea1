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

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointInUseError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
)

OLD_STORE = Path(__file__).parent / "data" / "store-0.1.0"
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
    store = ["--store", old_store.as_uri()]
    verified = cairn("verify", "--all", *store)
    assert verified.code == 0, verified.explain()
    target = tmp_path / "copied"
    copied = cairn("copy", "--all", "--to", target.as_uri(), *store)
    assert copied.code == 0, copied.explain()
    again = cairn("verify", "--all", "--store", target.as_uri())
    assert again.code == 0, again.explain()
    restore_dir = tmp_path / "restored"
    restore = cairn("restore", str(INCREMENTAL), "--to", str(restore_dir), *store)
    assert restore.code == 0, restore.explain()
    delta = restore_dir / str(INCREMENTAL) / "operators/agg/partition-0.delta"
    assert delta.read_bytes() == b"+agg-0 delta"
