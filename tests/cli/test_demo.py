"""``cairn demo`` and the job it runs (:mod:`cairn.demo`: the harness and the job).

In-process: the stream is a pure function of seed and offset, a checkpointed run that
crashes and restarts ends in the uninterrupted run's state, and delta checkpoints carry
unchanged partitions over by reference. As a user runs it: ``cairn demo --json`` with a
small stream, against a local directory and against moto's S3 server, must SIGKILL its
job, restore it, and report ``exactly_once: true``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from obstore.store import MemoryStore
from support.servers import S3_ACCESS_KEY_ID, S3_REGION, S3_SECRET_ACCESS_KEY, S3Server

from cairn import ObjectStoreCheckpointer
from cairn.demo.job import (
    OPERATORS,
    PARTITIONS,
    JobConfig,
    event_at,
    reference_pipeline,
    restore_pipeline,
    restored_offset,
    run_job,
)

EVENTS = 1500


class Crash(Exception):
    """Stands in for the process dying after some checkpoints."""


def test_the_stream_is_a_pure_function_of_seed_and_offset() -> None:
    assert [event_at(7, o) for o in range(100)] == [event_at(7, o) for o in range(100)]
    assert [event_at(7, o) for o in range(100)] != [event_at(8, o) for o in range(100)]
    times = [event_at(7, o).time_ms for o in range(100)]
    assert times == sorted(times)


async def test_a_crashed_job_restarts_into_the_uninterrupted_state() -> None:
    ckpt = ObjectStoreCheckpointer(MemoryStore())
    config = JobConfig(seed=3, events=EVENTS, checkpoint_every=100, full_every=4)
    seen: list[dict[str, Any]] = []

    def crash_after_six(message: dict[str, Any]) -> None:
        seen.append(message)
        if len([m for m in seen if m["type"] == "checkpoint"]) == 6:
            raise Crash

    with pytest.raises(Crash):
        await run_job(ckpt, config, crash_after_six)
    reports: list[dict[str, Any]] = []
    final = await run_job(ckpt, config, reports.append)

    reference = reference_pipeline(config.seed, config.events)
    assert final.state == reference.state
    assert reports[0]["restored"]["offset"] == 600 and reports[0]["restored"]["epoch"] == 6
    assert reports[-1] == {"type": "done", "offset": EVENTS, "state_sha256": reference.digest()}
    loaded = await ckpt.load_latest()
    assert loaded is not None and restored_offset(loaded) == EVENTS
    assert restore_pipeline(loaded).state == reference.state

    kinds = [m["kind"] for m in seen + reports if m["type"] == "checkpoint"]
    assert kinds[:6] == ["full", "incremental", "incremental", "incremental", "full", "incremental"]
    deltas = [m for m in seen + reports if m["type"] == "checkpoint" and m["kind"] == "incremental"]
    assert all(m["uploaded"] + m["carried"] == len(OPERATORS) * PARTITIONS for m in deltas)
    assert any(m["carried"] > 0 for m in deltas), "no partition was carried over by reference"


# -- the command, as a real process --------------------------------------------------------


def run_demo(store: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``cairn demo --json`` on ``store`` with a small, quick stream; its report."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cairn.cli",
            "demo",
            "--events",
            str(EVENTS),
            "--stream-seconds",
            "1.5",
            "--store",
            store,
            "--json",
        ],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def check_report(report: dict[str, Any]) -> None:
    """What every demo run must show."""
    assert report["exactly_once"] is True
    assert report["kill"]["killed"] is True and report["kill"]["signal"] == "SIGKILL"
    assert report["kill"]["exit_status"] == -9
    restored = report["restored"]
    assert restored is not None and 0 < restored["offset"] < EVENTS
    assert report["replayed_events"] == EVENTS - restored["offset"]
    rows = report["checkpoints"]
    assert [row["restored"] for row in rows].count(True) == 1
    assert {row["made_by"] for row in rows} >= {"restarted job"}
    assert rows[-1]["offset"] == EVENTS and report["final"]["offset"] == EVENTS
    assert {row["kind"] for row in rows} == {"full", "incremental"}  # one word, as `cairn list`
    assert report["final"]["state_sha256"] == report["reference_state_sha256"]


def test_demo_on_a_local_directory(tmp_path: Path) -> None:
    report = run_demo(str(tmp_path / "store"))
    check_report(report)
    assert report["store"] == (tmp_path / "store").as_uri()
    assert report["prefix"].startswith("demo/")


def test_demo_on_s3(s3_server: S3Server, s3_bucket: str) -> None:
    env = {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
        "AWS_REGION": S3_REGION,
        "AWS_ALLOW_HTTP": "true",
    }
    check_report(run_demo(f"s3://{s3_bucket}", env))


def test_demo_refuses_a_memory_store() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "demo", "--store", "memory://"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: the demo restarts its job in a new process")
