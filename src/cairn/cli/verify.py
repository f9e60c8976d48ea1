"""``cairn verify``: load checkpoints the way a restore would, and check every byte.

Each checkpoint is loaded with :meth:`ObjectStoreCheckpointer.load`, which checks the
manifest's own checksum and the SHA-256 of every artifact of every partition's restore
chain (including artifacts held by the parent checkpoints it builds on). Checkpoints
are verified one after the other, so memory holds one checkpoint at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from cairn import (
    CheckpointId,
    CheckpointNotFoundError,
    CodecError,
    IntegrityError,
    ObjectStoreCheckpointer,
)
from cairn.cli.errors import describe
from cairn.cli.progress import Transfer

__all__ = ["Verified", "verify"]


@dataclass(frozen=True)
class Verified:
    """The outcome for one checkpoint: ``error`` is None when every digest matched."""

    checkpoint_id: CheckpointId
    epoch: int | None
    artifacts: int
    size_bytes: int
    error: str | None

    @property
    def ok(self) -> bool:
        """True when the checkpoint loaded and verified."""
        return self.error is None


async def verify_one(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> Verified:
    """Load ``cid`` with every digest checked; integrity failures are returned, not raised.

    Store failures (:class:`cairn.StoreError`) are raised: they say nothing about the
    checkpoint.
    """
    try:
        loaded = await ckpt.load(cid, verify=True)
    except (IntegrityError, CodecError, CheckpointNotFoundError) as exc:
        return Verified(cid, None, 0, 0, describe(exc))
    links = [link for chain in loaded.chains.values() for link in chain]
    size = sum(memoryview(link.data).nbytes for link in links)
    return Verified(cid, loaded.epoch, len(links), size, None)


async def verify(
    ckpt: ObjectStoreCheckpointer, ids: list[CheckpointId], progress: Transfer
) -> list[Verified]:
    """Verify each of ``ids`` in turn, advancing ``progress`` by one per checkpoint."""
    results: list[Verified] = []
    for cid in ids:
        progress.describe(f"verifying {cid}")
        results.append(await verify_one(ckpt, cid))
        progress.advance(1)
    return results
