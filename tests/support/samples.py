"""Sample checkpoints whose bytes derive from their epoch, so any load can be checked."""

from __future__ import annotations

from cairn import CheckpointData, CheckpointId, SourceOffsetEntry


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
