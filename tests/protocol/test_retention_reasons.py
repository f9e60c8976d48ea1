"""Why GC keeps each checkpoint: the reasons of :attr:`cairn.protocol.retention.GcPlan.reasons`."""

from __future__ import annotations

import asyncio
import datetime as dt

from obstore.store import MemoryStore
from support.samples import reference_style_delta

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    ObjectStoreCheckpointer,
    RetentionPolicy,
)
from cairn.protocol.retention import span_text

NOW = dt.timedelta(0)


def checkpointer() -> ObjectStoreCheckpointer:
    return ObjectStoreCheckpointer(MemoryStore(), CheckpointPaths("ck/"))


async def series(ckpt: ObjectStoreCheckpointer, count: int) -> list[CheckpointId]:
    """Full snapshot every third epoch, deltas in between."""
    ids: list[CheckpointId] = []
    for epoch in range(count):
        if epoch % 3 == 0:
            data = CheckpointData(epoch=epoch, snapshots={("op", 0): bytes([epoch]) * 10})
        else:
            data = CheckpointData(
                epoch=epoch, deltas={("op", 0): bytes([epoch])}, parent_id=ids[-1]
            )
        ids.append((await ckpt.save(data)).checkpoint_id)
    return ids


def test_each_kept_checkpoint_says_which_rules_keep_it() -> None:
    async def scenario() -> None:
        ckpt = checkpointer()
        ids = await series(ckpt, 7)
        await ckpt.update_latest(ids[4], force=True)
        policy = RetentionPolicy(keep_last=1, keep_every_n_epochs=3, pinned=(ids[2],))
        result = await ckpt.gc(policy, min_age=NOW, dry_run=True)
        assert result.reasons == {
            ids[0]: ["keep-every-n-epochs 3"],
            ids[2]: ["pinned"],
            ids[3]: ["keep-every-n-epochs 3"],
            ids[4]: ["latest"],
            ids[5]: ["newer than latest"],
            ids[6]: ["keep-last 1", "keep-every-n-epochs 3", "newer than latest"],
        }
        assert sorted(result.reasons) == result.retained

    asyncio.run(scenario())


def test_keep_within_alone_is_a_reason() -> None:
    async def scenario() -> None:
        ckpt = checkpointer()
        ids = await series(ckpt, 2)
        within = RetentionPolicy(keep_within=dt.timedelta(days=7))
        result = await ckpt.gc(within, min_age=NOW, dry_run=True)
        assert result.reasons[ids[0]] == ["keep-within 7d"]
        assert result.reasons[ids[1]] == ["keep-within 7d", "latest"]

    asyncio.run(scenario())


def test_the_parent_a_reference_style_manifest_needs_is_kept_as_its_base() -> None:
    async def scenario() -> None:
        ckpt = checkpointer()
        base, cid = await reference_style_delta(ckpt)
        await ckpt.update_latest(cid)
        result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW, dry_run=True)
        assert result.reasons == {
            base: ["base of a kept incremental"],
            cid: ["keep-last 1", "latest"],
        }

    asyncio.run(scenario())


def test_span_text() -> None:
    assert span_text(dt.timedelta(days=7)) == "7d"
    assert span_text(dt.timedelta(hours=1, minutes=30)) == "1h30m"
    assert span_text(dt.timedelta(seconds=0.5)) == "0s"
