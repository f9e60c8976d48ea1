"""The keyed demo job (:mod:`cairn.demo.keyed`) and ``cairn demo --rescale-to``.

In-process: a job checkpointed by N workers that crashes restarts on M workers, each
reading only its key groups, and ends in an uninterrupted single-worker run's state. As
a user runs it: ``cairn demo --workers N --rescale-to M --json`` against a local
directory kills its job, restores it on M workers, and reports ``exactly_once: true``
with the bytes each worker read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from obstore.store import MemoryStore

from cairn import ObjectStoreCheckpointer
from cairn.cli import views
from cairn.demo.keyed import (
    KEY_GROUPS,
    OPERATOR,
    SPLITS,
    CountingStore,
    KeyedConfig,
    counts_digest,
    decode_group,
    reference_counts,
    run_keyed_job,
    splits_of,
)
from cairn.stores import as_store

PER_SPLIT = 120


class Crash(Exception):
    """Stands in for the process dying after some checkpoints."""


def test_splits_are_dealt_round_robin() -> None:
    for workers in (1, 3, 4, 6, 7):
        dealt = sorted(s for w in range(workers) for s in splits_of(w, workers))
        assert dealt == list(range(SPLITS))


@pytest.mark.parametrize(("before", "after"), [(4, 6), (6, 3), (1, 7)])
async def test_a_crashed_keyed_job_restarts_on_other_workers_into_the_uninterrupted_state(
    before: int, after: int
) -> None:
    store = CountingStore(as_store(MemoryStore()))
    ckpt = ObjectStoreCheckpointer(store)
    seen: list[dict[str, Any]] = []

    def crash_after_three(message: dict[str, Any]) -> None:
        seen.append(message)
        if len([m for m in seen if m["type"] == "checkpoint"]) == 3:
            raise Crash

    config = KeyedConfig(seed=5, per_split=PER_SPLIT, checkpoint_every=20, workers=before)
    with pytest.raises(Crash):
        await run_keyed_job(ckpt, store, config, crash_after_three)
    reports: list[dict[str, Any]] = []
    config = KeyedConfig(seed=5, per_split=PER_SPLIT, checkpoint_every=20, workers=after)
    final = await run_keyed_job(ckpt, store, config, reports.append)

    reference = reference_counts(5, PER_SPLIT)
    assert final.counts() == reference
    start = reports[0]
    assert start["restored"]["epoch"] == 3 and start["restored"]["offsets"] == [60] * SPLITS
    assert start["restored"]["workers_before"] == before
    reads = start["reads"]
    assert [r["groups"] for r in reads] == [
        [KEY_GROUPS.groups_of(w, after).start, KEY_GROUPS.groups_of(w, after).stop]
        for w in range(after)
    ]
    for read in reads:  # each worker read its groups and nothing else
        assert read["read_bytes"] == read["group_bytes"] > 0
    assert reports[-1] == {
        "type": "done",
        "offset": PER_SPLIT,
        "state_sha256": counts_digest(reference),
    }
    latest = await ckpt.latest_id()
    assert latest is not None
    groups = await ckpt.load_key_groups(latest, OPERATOR, range(KEY_GROUPS.count))
    restored = {u: n for data in groups.values() for u, n in decode_group(data).items()}
    assert restored == reference
    first_after = next(m for m in reports if m["type"] == "checkpoint")
    assert first_after["carried_bytes"] > 0  # unchanged groups carried across the rescale


# -- the command, as a real process --------------------------------------------------------


def run_rescale_demo(store: str, workers: int, rescale_to: int) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cairn.cli",
            "demo",
            "--events",
            "2400",
            "--stream-seconds",
            "1.5",
            "--workers",
            str(workers),
            "--rescale-to",
            str(rescale_to),
            "--store",
            store,
            "--json",
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_demo_rescales_on_a_local_directory(tmp_path: Path) -> None:
    report = run_rescale_demo(str(tmp_path / "store"), 4, 6)
    jsonschema.validate(report, views.json_schema("demo"))
    assert report["exactly_once"] is True
    assert report["kill"]["killed"] is True and report["kill"]["exit_status"] == -9
    assert report["workers"] == 4 and report["rescale_to"] == 6
    reads = report["restored"]["reads"]
    assert len(reads) == 6
    for read in reads:
        assert read["read_bytes"] <= 1.1 * read["group_bytes"]
    assert report["final"]["state_sha256"] == report["reference_state_sha256"]
