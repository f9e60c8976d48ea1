"""``load(progress=...)`` moves while one large artifact is read: a call per ranged part,
adding up to the artifact's size, a retried part counted once."""

from __future__ import annotations

from pathlib import Path

import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer, make_store
from support.faults import FaultPlan, FaultyStore

from cairn import CheckpointData, CheckpointPaths
from cairn.protocol import _download as download
from cairn.stores import as_store

PART = 256 * 1024
SIZE = 5 * PART + 123  # not a multiple of the part: the last one is short
PAYLOAD = bytes(range(256)) * (SIZE // 256) + b"x" * (SIZE % 256)


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "LOAD_PART_BYTES", PART)


@pytest.mark.parametrize("backend", ["memory", "s3"])
async def test_one_large_artifact_reports_each_part(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    ckpt = make_checkpointer(make_store(backend, tmp_path, request), CheckpointPaths(""))
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots={("big", 0): PAYLOAD}))
    seen: list[int] = []
    loaded = await ckpt.load(saved.checkpoint_id, progress=seen.append)
    assert bytes(loaded.artifacts[("big", 0)]) == PAYLOAD
    assert seen == [PART] * 5 + [123]
    assert sum(seen) == SIZE


async def test_a_retried_part_is_counted_once() -> None:
    store = FaultyStore(as_store(MemoryStore()))
    ckpt = make_checkpointer(store, CheckpointPaths(""))
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots={("big", 0): PAYLOAD}))
    store.plan = FaultPlan(transient_burst=2, transient_ops=frozenset({"get_range"}))
    before = store.ops.get("get_range", 0)
    seen: list[int] = []
    loaded = await ckpt.load(saved.checkpoint_id, progress=seen.append)
    assert bytes(loaded.artifacts[("big", 0)]) == PAYLOAD
    assert store.ops["get_range"] - before == 6 + 2  # six parts, two of them tried again
    assert sum(seen) == SIZE and len(seen) == 6


async def test_without_progress_the_artifact_is_one_request() -> None:
    store = FaultyStore(as_store(MemoryStore()))
    ckpt = make_checkpointer(store, CheckpointPaths(""))
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots={("big", 0): PAYLOAD}))
    before = store.ops.get("get_range", 0)
    await ckpt.load(saved.checkpoint_id)
    assert store.ops["get_range"] - before == 1


async def test_a_compressed_large_artifact_reports_once() -> None:
    ckpt = make_checkpointer(MemoryStore(), compression="zstd")
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots={("big", 0): PAYLOAD}))
    seen: list[int] = []
    await ckpt.load(saved.checkpoint_id, progress=seen.append)
    assert seen == [SIZE]
