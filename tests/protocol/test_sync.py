"""SyncCheckpointer: the same methods, blocking, driving the async implementation."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointManifest,
    CheckpointNotFoundError,
    RetentionPolicy,
    SyncCheckpointer,
    SyncInAsyncContextError,
)


def test_sync_round_trip(tmp_path: Path) -> None:
    ckpt = SyncCheckpointer(tmp_path.as_uri())
    assert ckpt.read_latest() is None
    manifest = ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"state"}))
    assert ckpt.read_latest() == manifest.checkpoint_id
    assert ckpt.list_checkpoints() == [manifest.checkpoint_id]
    loaded = ckpt.load_latest()
    assert loaded is not None and bytes(loaded.artifacts[("op", 0)]) == b"state"
    cid = CheckpointId.now()
    digest = ckpt.save_snapshot(cid, "op", 1, b"s")
    digest_delta = ckpt.save_delta(cid, "op", 2, b"d")
    [(_, entry)] = ckpt.save_partitions_concurrent(cid, [("op", 3, False, b"p")])
    assert bytes(ckpt.load_artifact(ckpt.paths.snapshot(cid, "op", 1), expected_sha256=digest))
    assert len(digest_delta) == 64 and entry.size_bytes == 1
    ckpt.save_manifest(CheckpointManifest.new(cid, 2))
    assert ckpt.load_manifest(cid).epoch == 2
    assert ckpt.update_latest(cid) is True
    assert ckpt.load(cid).manifest.epoch == 2
    ckpt.delete_checkpoint(manifest.checkpoint_id)
    with pytest.raises(CheckpointNotFoundError):
        ckpt.load(manifest.checkpoint_id)
    chained = ckpt.save(CheckpointData(epoch=5, snapshots={("op", 3): b"p"}))
    assert [bytes(x.data) for x in ckpt.load_chain(chained.checkpoint_id, "op", 3)] == [b"p"]
    later = CheckpointManifest.new(CheckpointId.now(), 6)
    assert ckpt.commit(later) == later
    assert ckpt.read_latest() == later.checkpoint_id
    result = ckpt.gc(RetentionPolicy(keep_last=1), dry_run=True)
    assert result.dry_run and later.checkpoint_id in result.retained
    assert ckpt.take_over() == 1


async def test_sync_inside_a_running_loop_raises_clearly() -> None:
    ckpt = SyncCheckpointer("memory://")
    with pytest.raises(SyncInAsyncContextError, match="running event loop"):
        ckpt.list_checkpoints()
    assert isinstance(SyncInAsyncContextError("x"), RuntimeError)


def test_every_async_method_has_a_sync_twin_with_the_same_signature() -> None:
    """Every public coroutine of the async checkpointer has a blocking twin, with its
    parameters (taken from the twin, or written out where the twin does more)."""
    import inspect

    from cairn import ObjectStoreCheckpointer, SyncCheckpointer

    public = {
        name: member
        for name, member in inspect.getmembers(ObjectStoreCheckpointer)
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    }
    assert {"save", "load_latest", "gc", "load_artifact_to"} <= set(public)
    for name, method in public.items():
        twin = getattr(SyncCheckpointer, name, None)
        assert twin is not None, f"SyncCheckpointer lacks {name}"
        assert not inspect.iscoroutinefunction(twin), name
        ours, theirs = inspect.signature(twin), inspect.signature(method)
        assert ours.parameters == theirs.parameters, name
        if name != "save_async":  # a blocking future there, a task here
            assert ours.return_annotation == theirs.return_annotation, name
    init = inspect.signature(SyncCheckpointer.__init__)
    assert init == inspect.signature(ObjectStoreCheckpointer.__init__)
