"""``cairn history``: the chart a person reads and the series a script reads."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from pathlib import Path

import jsonschema
from support.cli import PREFIX, cairn_many

from cairn import CheckpointData, CheckpointId, CheckpointPaths, ObjectStoreCheckpointer
from cairn.cli import views

MINUTE_MS = 60_000


def id_at(unix_ms: int) -> CheckpointId:
    """A UUIDv7 checkpoint id made at ``unix_ms`` (as a save then would have made it)."""
    value = (unix_ms << 80) | (0x7 << 76) | (random.getrandbits(12) << 64)
    value |= (0b10 << 62) | random.getrandbits(62)
    return CheckpointId.from_uuid(uuid.UUID(int=value))


async def history_store(root: Path) -> list[str]:
    """Four saves a minute apart then one after an hour, a failed save, a damaged manifest."""
    ckpt = ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths(PREFIX))
    start = int(time.time() * 1000) - 2 * 3600 * 1000
    ids: list[str] = []
    parent = None
    for i, offset in enumerate((0, 1, 2, 3, 63)):
        stamp = start + offset * MINUTE_MS
        full = parent is None
        data = CheckpointData(
            epoch=i,
            snapshots={("op", 0): b"s" * 4000} if full else {},
            deltas={} if full else {("op", 0): b"d" * 100},
            parent_id=parent,
            checkpoint_id=id_at(stamp),
            timestamp_ms=stamp,
        )
        parent = (await ckpt.save(data)).checkpoint_id
        ids.append(str(parent))
    # A save that never committed: its upload is there, its manifest is not.
    failed = CheckpointData(epoch=9, snapshots={("op", 0): b"x"})
    await ckpt.save_snapshot(failed.id, "op", 0, b"x")
    ids.append(str(failed.id))
    damaged = root / PREFIX / ids[2] / "manifest.json"
    damaged.write_text(damaged.read_text().replace('"epoch": 2', '"epoch": 7'))
    return ids


def test_history_draws_sizes_kinds_failures_and_gaps(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ids = asyncio.run(history_store(root))
    store = ["--store", root.as_uri(), "--prefix", PREFIX]
    chart, data = cairn_many([["history", *store], ["history", *store, "--json"]])
    assert chart.code == 0, chart.explain()
    rows = [
        line for line in chart.stdout.splitlines() if line.strip() and "carried over" not in line
    ]
    assert sum(" F " in r for r in rows) == 1 and sum(" I " in r for r in rows) == 3
    assert any("✗" in r and "not committed" in r for r in rows)
    assert any("?" in r and "unreadable manifest" in r for r in rows)
    assert any("gap:" in r for r in rows), chart.stdout
    full = next(r for r in rows if " F " in r)
    assert "█" in full and "░" not in full
    assert all("░" in r for r in rows if " I " in r)  # incremental: carried state drawn

    assert data.code == 0, data.explain()
    doc = json.loads(data.stdout)
    jsonschema.Draft202012Validator(views.json_schema("history")).validate(doc)
    assert [row["id"] for row in doc["series"]] == ids
    statuses = [row["status"] for row in doc["series"]]
    assert statuses == [
        "committed",
        "committed",
        "unreadable",
        "committed",
        "committed",
        "uncommitted",
    ]
    assert (doc["count"], doc["failures"]) == (4, 2)
    first, second = doc["series"][0], doc["series"][1]
    assert (first["kind"], first["uploaded_bytes"], first["carried_bytes"]) == ("full", 4000, 0)
    assert (second["kind"], second["uploaded_bytes"], second["carried_bytes"]) == (
        "incremental",
        100,
        4000,
    )
    assert "duration_ms" in first and first["duration_ms"] >= 0
    assert [row["after_gap"] for row in doc["series"]].index(True) == 4
