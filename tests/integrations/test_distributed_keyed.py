"""Keyed state in a two-phase save: workers upload :class:`~cairn.KeyedSnapshot`
partitions with ``upload_partitions``, and ``commit_distributed`` checks each against
the store by its range index before it commits."""

from __future__ import annotations

from pathlib import Path

import pytest
from obstore.store import MemoryStore

from cairn import (
    CheckpointId,
    IntegrityMismatchError,
    KeyedSnapshot,
    KeyGroups,
    ObjectStoreCheckpointer,
    WorkerReport,
    commit_distributed,
    upload_partitions,
)

SPACE = KeyGroups(16)
EXPECTED = [("counts", 0), ("counts", 1)]


def state(group: int) -> bytes:
    return f"state of group {group}".encode() * (group + 1)


async def upload_both(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> list[WorkerReport]:
    reports = []
    for worker in range(2):
        groups = {g: state(g) for g in SPACE.groups_of(worker, 2)}
        report = await upload_partitions(
            ckpt,
            cid,
            [("counts", worker, False, KeyedSnapshot(SPACE, groups))],
            worker=f"w{worker}",
        )
        reports.append(WorkerReport.from_json(report.to_json()))  # as it travels
    return reports


@pytest.mark.parametrize("kind", ["local", "memory"])
async def test_keyed_partitions_are_uploaded_by_workers_and_committed_once(
    kind: str, tmp_path: Path
) -> None:
    ckpt = ObjectStoreCheckpointer(str(tmp_path) if kind == "local" else MemoryStore())
    cid = CheckpointId.now()
    manifest = await commit_distributed(ckpt, cid, 1, EXPECTED, await upload_both(ckpt, cid))
    assert await ckpt.latest_id() == cid == manifest.checkpoint_id
    groups = await ckpt.load_key_groups(cid, "counts", range(SPACE.count))
    assert {g: bytes(data) for g, data in groups.items()} == {g: state(g) for g in range(16)}
    plan = await ckpt.restore_plan(cid, workers=3)  # restored at another parallelism
    part = await ckpt.load_assignment(plan.worker(2).keyed["counts"])
    assert {g: bytes(d) for g, d in part.items()} == {g: state(g) for g in SPACE.groups_of(2, 3)}


async def test_a_keyed_partition_whose_index_was_changed_is_not_committed(tmp_path: Path) -> None:
    ckpt = ObjectStoreCheckpointer(str(tmp_path))
    cid = CheckpointId.now()
    reports = await upload_both(ckpt, cid)
    _, entry = reports[1].entries[0]
    stored = tmp_path / str(cid) / entry.path
    data = bytearray(stored.read_bytes())
    data[-1] ^= 1  # the last byte of its range index
    stored.write_bytes(bytes(data))
    with pytest.raises(IntegrityMismatchError) as refused:
        await commit_distributed(ckpt, cid, 1, EXPECTED, reports)
    assert entry.path in str(refused.value)
    assert await ckpt.latest_id() is None
    assert not (tmp_path / str(cid) / "manifest.json").exists()
