"""Sample checkpoints whose bytes derive from their epoch, so any load can be checked."""

from __future__ import annotations

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointManifest,
    ObjectStoreCheckpointer,
    OperatorSnapshotEntry,
    SourceOffsetEntry,
)


def sample(epoch: int, parent: CheckpointId | None = None) -> CheckpointData:
    """A checkpoint whose bytes are derived from its epoch, so any load can be checked."""
    snapshots = {
        (f"op{o}", p): f"state {epoch} {o} {p}".encode() * 50 for o in range(2) for p in range(3)
    }
    deltas = {("op-delta", 0): f"delta {epoch}".encode()} if parent else {}
    return CheckpointData(
        epoch=epoch,
        snapshots=snapshots,
        deltas=deltas,
        parent_id=parent,
        source_offsets={"events": SourceOffsetEntry("gen", {"0": str(epoch * 100)}, epoch)},
    )


def expected_artifacts(epoch: int) -> dict[tuple[str, int], bytes]:
    """The snapshots of :func:`sample` ``(epoch)``, as a load returns them."""
    return {
        (f"op{o}", p): f"state {epoch} {o} {p}".encode() * 50 for o in range(2) for p in range(3)
    }


async def reference_style_delta(ckpt: ObjectStoreCheckpointer) -> tuple[CheckpointId, CheckpointId]:
    """A base checkpoint, then one committed the reference's way: its manifest lists only
    a delta of ``("op", 0)`` (``b"+d"``), whose base ``b"base"`` is the parent's. Returns
    (base id, delta id); ``_latest`` is left as it is."""
    base = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"base"}))
    cid = CheckpointId.now()
    [(_, entry)] = await ckpt.save_partitions_concurrent(cid, [("op", 0, True, b"+d")])
    manifest = CheckpointManifest(
        version=2,
        checkpoint_id=cid,
        epoch=2,
        timestamp_ms=1,
        parent_id=base.checkpoint_id,
        operators={"op": OperatorSnapshotEntry.from_partitions([entry])},
    )
    await ckpt.save_manifest(manifest)
    return base.checkpoint_id, cid
