"""The RocksDB example is exactly-once across crashes, and its saves are incremental.

``examples/rocksdb_job.py`` keeps per-key (count, sum) in a RocksDB database and saves
it as a cairn directory partition together with its source offset. Here it is killed
at seeded random events (``--kill-at``, then once by this test's SIGKILL right after a
checkpoint line, which may land inside the next save) and restarted until it finishes:
the counts must equal the stream's, every checkpoint after the first must upload less
than it holds (the SST files its parent already has are carried), and the newest
checkpoint restored with ``restore_directory`` must open as a database with the right
counts.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support.cli import cairn
from support.paths import REPO

from cairn import CheckpointData, CheckpointPaths, SyncCheckpointer

EXAMPLE = REPO / "examples" / "rocksdb_job.py"
EVENTS, KEYS, EVERY = 40_000, 10_000, 2_000
SEED = 20261201


@pytest.fixture(scope="module")
def job() -> ModuleType:
    """The example as a module, for its ground truth and its database layout."""
    spec = importlib.util.spec_from_file_location("rocksdb_job", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(*extra: str) -> list[str]:
    """The job's command line, on a store and work directory in the current directory."""
    return [
        sys.executable,
        str(EXAMPLE),
        "--store",
        "store",
        "--events",
        str(EVENTS),
        "--keys",
        str(KEYS),
        "--every",
        str(EVERY),
        *extra,
    ]


def run(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run the job to its end (or its kill) in ``cwd``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        command(*extra), cwd=cwd, capture_output=True, text=True, timeout=60, env=env, check=False
    )


def killed_after_a_checkpoint(cwd: Path, nth: int) -> str:
    """Start the job and SIGKILL it as soon as it printed its ``nth`` checkpoint line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        command(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        seen, lines = 0, []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("checkpoint "):
                seen += 1
                if seen == nth:
                    proc.send_signal(signal.SIGKILL)
                    break
        lines.extend(proc.stdout)
        proc.wait(timeout=30)
    output = "".join(lines)
    assert proc.returncode == -signal.SIGKILL, output
    return output


def test_a_killed_rocksdb_job_restarts_exactly_once_from_incremental_checkpoints(
    job: ModuleType, tmp_path: Path
) -> None:
    rocksdict = pytest.importorskip("rocksdict", reason="the RocksDB example needs rocksdict")
    rng = random.Random(SEED)
    # In the first half: the run killed by this test still has checkpoints ahead of it.
    kills = sorted(rng.sample(range(EVENTS // 2), 2))
    for kill_at in kills:
        proc = run(tmp_path, "--kill-at", str(kill_at))
        explain = proc.stdout + proc.stderr
        assert proc.returncode == -signal.SIGKILL, explain
        assert f"killing myself after event {kill_at} (--kill-at)" in proc.stdout, explain
        assert "exactly-once" not in proc.stdout
    # The last kill-at left a checkpoint near it; this run restarts there and is killed
    # once more, by us, just after one of its checkpoints: maybe inside the next save.
    killed_after_a_checkpoint(tmp_path, rng.randint(1, 3))

    proc = run(tmp_path)
    explain = proc.stdout + proc.stderr
    assert proc.returncode == 0, explain
    assert "resuming at offset" in proc.stdout, explain
    assert proc.stdout.splitlines()[-1] == "exactly-once: YES", explain
    verified = run(tmp_path, "--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.splitlines()[-1] == "exactly-once: YES"

    ckpt = SyncCheckpointer(str(tmp_path / "store"), CheckpointPaths(""))
    try:
        ids = ckpt.list_checkpoints()
        manifests = [ckpt.load(cid, verify=False).manifest for cid in ids]
        latest = ckpt.load_latest()
        assert latest is not None
        assert latest.source_offsets[job.SOURCE].offsets[job.SPLIT] == str(EVENTS)
        dest = tmp_path / "restored"
        files = ckpt.restore_directory(latest.checkpoint_id, job.OPERATOR, 0, dest)
    finally:
        ckpt.close()

    first, *later = manifests
    assert first.parent_id is None
    assert len(later) >= EVENTS // EVERY - 1
    for manifest in later:
        stats = manifest.stats
        assert manifest.parent_id is not None and stats is not None
        held = stats.uploaded_bytes + stats.carried_bytes
        assert stats.carried_bytes > 0, manifest.epoch
        assert stats.uploaded_bytes < held, (manifest.epoch, stats)
    # Over the run, the carried SST files are most of what the checkpoints hold.
    uploaded = sum(m.stats.uploaded_bytes for m in later if m.stats)
    carried = sum(m.stats.carried_bytes for m in later if m.stats)
    assert uploaded < carried, (uploaded, carried)

    assert any(f.relative_path.endswith(".sst") for f in files)
    db = rocksdict.Rdict(str(dest), job.options(rocksdict))
    try:
        assert job.check(db, EVENTS, KEYS) == []
        assert job.value(db, KEYS - 1, KEYS) == job.truth(EVENTS, KEYS)[KEYS - 1]
    finally:
        db.close()


def test_cairn_list_counts_the_files_of_directory_partitions(tmp_path: Path) -> None:
    db = tmp_path / "db"
    db.mkdir()
    (db / "000001.sst").write_bytes(b"immutable table" * 100)
    (db / "CURRENT").write_bytes(b"MANIFEST-000001")
    ckpt = SyncCheckpointer(str(tmp_path / "checkpoints"))
    try:
        base = ckpt.save(CheckpointData(epoch=1, directories={("kv", 0): db}))
        (db / "CURRENT").write_bytes(b"MANIFEST-000002")
        ckpt.save(
            CheckpointData(epoch=2, directories={("kv", 0): db}, parent_id=base.checkpoint_id)
        )
    finally:
        ckpt.close()
    listed = cairn("list", "--json", cwd=tmp_path)
    assert listed.code == 0, listed.explain()
    first, second = listed.json()["checkpoints"]
    assert (first["kind"], first["artifacts"], first["uploaded_bytes"]) == ("full", 2, 1515)
    assert second["kind"] == "incremental"
    assert (second["uploaded_artifacts"], second["uploaded_bytes"]) == (1, 15)
    assert (second["carried_artifacts"], second["carried_bytes"]) == (1, 1500)


def test_the_rocksdb_job_rescales_between_runs(job: ModuleType, tmp_path: Path) -> None:
    """Saved by 4 workers, restored on 6, then on 3: every key once, in its owner's
    database; the first checkpoint after each rescale is a full one."""
    pytest.importorskip("rocksdict", reason="the RocksDB example needs rocksdict")
    first = run(tmp_path, "--workers", "4", "--kill-at", "15000")
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    second = run(tmp_path, "--rescale-to", "6", "--kill-at", "29000")
    explain = second.stdout + second.stderr
    assert second.returncode == -signal.SIGKILL, explain
    assert "(epoch 7, 4 workers) onto 6 workers: resuming at offset 14000" in second.stdout
    copied = [line for line in second.stdout.splitlines() if line.startswith("worker ")]
    assert [line.split(":")[0] for line in copied] == [f"worker {w}" for w in range(6)]
    assert "worker 0: key groups 0..21," in second.stdout, explain
    third = run(tmp_path, "--rescale-to", "3")
    explain = third.stdout + third.stderr
    assert third.returncode == 0, explain
    assert "6 workers) onto 3 workers" in third.stdout, explain
    assert third.stdout.splitlines()[-1] == "exactly-once: YES", explain
    verified = run(tmp_path, "--verify")
    assert verified.stdout.splitlines()[-1] == "exactly-once: YES", verified.stdout

    ckpt = SyncCheckpointer(str(tmp_path / "store"), CheckpointPaths(""))
    try:
        manifests = [ckpt.load_manifest(cid) for cid in ckpt.list_checkpoints()]
    finally:
        ckpt.close()
    workers = [len({d.partition_id for d in m.directories}) for m in manifests]
    assert workers == sorted(workers, key=lambda n: {4: 0, 6: 1, 3: 2}[n])
    assert set(workers) == {4, 6, 3}
    for before, after in itertools.pairwise(manifests):
        changed = len(before.directories) != len(after.directories)
        assert (after.parent_id is None) == changed, after.epoch
