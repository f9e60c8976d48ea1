"""Distributed save: worker processes upload to S3, a coordinator commits once."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import multiprocessing
import queue
import time
from collections.abc import Iterator
from multiprocessing.context import SpawnProcess
from typing import Any

import msgspec
import pytest
from obstore.store import LocalStore, S3Store
from support.distributed_worker import WORKER_LEASE, partition_bytes, run_worker
from support.servers import S3Server, s3_store_options

from cairn import (
    CheckpointAbortedError,
    CheckpointData,
    CheckpointId,
    CheckpointManifest,
    IncompleteCheckpointError,
    IntegrityMismatchError,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    SourceOffsetEntry,
    WorkerReport,
    commit_distributed,
    upload_partitions,
)
from cairn.protocol._lease import STAMP_RESOLUTION

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

OPERATORS = ("join", "agg")
KEYS = [(op, p) for op in OPERATORS for p in range(8)]  # 16 partitions over 4 workers
CTX = multiprocessing.get_context("spawn")


def shares(workers: int) -> list[list[tuple[str, int]]]:
    return [KEYS[w::workers] for w in range(workers)]


class Cluster:
    """Worker processes uploading one checkpoint to one bucket."""

    def __init__(self, server: S3Server, bucket: str, cid: CheckpointId) -> None:
        self.bucket = bucket
        self.options: dict[str, Any] = dict(s3_store_options(server.endpoint))
        self.cid = cid
        self.reports: Any = CTX.Queue()
        self.procs: list[SpawnProcess] = []

    def start(self, worker: int, keys: list[tuple[str, int]], mode: str = "honest") -> SpawnProcess:
        proc = CTX.Process(
            target=run_worker,
            args=(self.bucket, self.options, str(self.cid), worker, keys, self.reports, mode),
        )
        proc.start()
        self.procs.append(proc)
        return proc

    def collect(self, count: int, timeout: float = 60.0) -> list[WorkerReport]:
        """What the coordinator receives: up to ``count`` reports within ``timeout``."""
        got: list[WorkerReport] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            try:
                got.append(WorkerReport.from_json(self.reports.get(timeout=0.5)))
            except queue.Empty:
                if not any(p.is_alive() for p in self.procs) and self.reports.empty():
                    break
        return got

    def stop(self) -> None:
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()


@pytest.fixture
def cluster(s3_server: S3Server, s3_bucket: str) -> Iterator[Cluster]:
    c = Cluster(s3_server, s3_bucket, CheckpointId.now())
    yield c
    c.stop()


def coordinator(cluster: Cluster) -> ObjectStoreCheckpointer:
    return ObjectStoreCheckpointer(S3Store(cluster.bucket, **cluster.options))


async def test_four_workers_one_commit(cluster: Cluster) -> None:
    ckpt = coordinator(cluster)
    for w, keys in enumerate(shares(4)):
        cluster.start(w, keys)
    reports = cluster.collect(4)
    assert len(reports) == 4
    assert await ckpt.list_checkpoints() == [], "uploads alone commit nothing"
    offsets = {"events": SourceOffsetEntry("kafka", {"0": "99"}, 7)}
    manifest = await commit_distributed(ckpt, cluster.cid, 7, KEYS, reports, source_offsets=offsets)
    assert await ckpt.list_checkpoints() == [cluster.cid]
    assert await ckpt.read_latest() == cluster.cid
    loaded = await ckpt.load(cluster.cid)
    assert loaded.manifest == manifest and loaded.source_offsets == offsets
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {
        k: partition_bytes(*k) for k in KEYS
    }


async def test_a_worker_killed_mid_upload_commits_nothing(cluster: Cluster) -> None:
    ckpt = coordinator(cluster)
    before = await ckpt.save(CheckpointData(epoch=1, snapshots={("x", 0): b"previous"}))
    parts = shares(4)
    for w in range(3):
        cluster.start(w, parts[w])
    doomed = cluster.start(3, parts[3], mode="slow")
    prefix = ckpt.paths.checkpoint_dir(cluster.cid)
    deadline = time.monotonic() + 60
    while not [i for i in await ckpt.store.list(prefix) if "partition" in i.path]:
        assert time.monotonic() < deadline, "the slow worker never uploaded"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.6)
    doomed.kill()
    reports = cluster.collect(4, timeout=20)
    assert len(reports) == 3
    with pytest.raises(IncompleteCheckpointError, match="not reported"):
        await commit_distributed(ckpt, cluster.cid, 2, KEYS, reports)
    assert await ckpt.list_checkpoints() == [before.checkpoint_id]
    assert await ckpt.read_latest() == before.checkpoint_id
    left = [i.path for i in await ckpt.store.list(prefix)]
    assert left, "the workers did leave orphans behind"
    # No worker renews the lease any more. S3 stamps whole seconds, so GC counts a lease
    # as lapsed one STAMP_RESOLUTION past its end: wait for both.
    await asyncio.sleep((WORKER_LEASE + STAMP_RESOLUTION).total_seconds() + 0.2)
    swept = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert sorted(swept.orphans_deleted) == sorted(left)
    # GC claimed the id before sweeping: only its tombstone is left, and nothing can commit.
    [tombstone] = await ckpt.store.list(prefix)
    assert tombstone.path == ckpt.paths.manifest(cluster.cid) and tombstone.size == 0
    with pytest.raises(CheckpointAbortedError):
        await ckpt.commit(CheckpointManifest.new(cluster.cid, 2))


async def test_a_worker_reporting_a_wrong_digest_commits_nothing(cluster: Cluster) -> None:
    ckpt = coordinator(cluster)
    for w, keys in enumerate(shares(4)):
        cluster.start(w, keys, mode="lie" if w == 2 else "honest")
    reports = cluster.collect(4)
    assert len(reports) == 4
    liar = next(r for r in reports if r.worker == "w2")
    _, entry = liar.entries[0]
    with pytest.raises(IntegrityMismatchError) as info:
        await commit_distributed(ckpt, cluster.cid, 3, KEYS, reports)
    assert info.value.path == ckpt.paths.resolve(cluster.cid, entry.path)
    assert info.value.expected == "0" * 64
    real = hashlib.sha256(partition_bytes(liar.entries[0][0], entry.partition_id)).hexdigest()
    assert info.value.actual == real
    assert await ckpt.list_checkpoints() == []
    assert await ckpt.read_latest() is None


async def test_reports_round_trip_and_bad_sets_are_refused(tmp_path: Any) -> None:
    ckpt = ObjectStoreCheckpointer(LocalStore(tmp_path))
    cid = CheckpointId.now()
    keys = [("op", p) for p in range(4)]
    first = await upload_partitions(
        ckpt, cid, [("op", p, False, bytes([p]) * 10) for p in range(2)], worker="a"
    )
    second = await upload_partitions(
        ckpt, cid, [("op", p, False, bytes([p]) * 10) for p in range(2, 4)], worker="b"
    )
    assert WorkerReport.from_json(first.to_json()) == first
    with pytest.raises(IncompleteCheckpointError, match="twice"):
        await commit_distributed(ckpt, cid, 1, keys, [first, first, second])
    with pytest.raises(IncompleteCheckpointError, match="not expected"):
        await commit_distributed(ckpt, cid, 1, keys[:3], [first, second])
    with pytest.raises(IncompleteCheckpointError, match="checkpoint"):
        await commit_distributed(ckpt, CheckpointId.now(), 1, keys, [first, second])
    with pytest.raises(InvalidInputError, match="not a worker report"):
        WorkerReport.from_json(b'{"entries": 1}')
    op, entry = second.entries[0]
    grown = msgspec.structs.replace(entry, size_bytes=entry.size_bytes + 1)
    bad_size = msgspec.structs.replace(second, entries=((op, grown), *second.entries[1:]))
    with pytest.raises(IntegrityMismatchError, match="size"):
        await commit_distributed(ckpt, cid, 1, keys, [first, bad_size])
    forged = msgspec.structs.replace(entry, sha256="1" * 64)  # local store: hashed from the file
    bad_digest = msgspec.structs.replace(second, entries=((op, forged), *second.entries[1:]))
    with pytest.raises(IntegrityMismatchError, match="sha256"):
        await commit_distributed(ckpt, cid, 1, keys, [first, bad_digest])
    assert await ckpt.list_checkpoints() == []
    manifest = await commit_distributed(ckpt, cid, 1, keys, [second, first])
    assert (await ckpt.load(cid)).manifest == manifest


async def test_a_distributed_save_records_how_long_it_took(tmp_path: Any) -> None:
    """From the time its id carries to the commit point; the workers' requests are not
    reported, so the statistics leave them unknown rather than undercount them."""
    ckpt = ObjectStoreCheckpointer(LocalStore(tmp_path))
    cid = CheckpointId.now()
    keys = [("op", p) for p in range(2)]
    report = await upload_partitions(ckpt, cid, [("op", p, False, b"x" * 10) for p in range(2)])
    await asyncio.sleep(0.05)  # the uploads and the wait for the reports take time
    manifest = await commit_distributed(ckpt, cid, 1, keys, [report])
    stats = manifest.stats
    assert stats is not None
    assert stats.duration_ms >= 50 and stats.upload_ms >= 50
    assert stats.duration_ms == stats.upload_ms + stats.commit_ms or (
        abs(stats.duration_ms - stats.upload_ms - stats.commit_ms) <= 1
    )
    assert (stats.uploaded_artifacts, stats.uploaded_bytes) == (2, 20)
    assert stats.requests is msgspec.UNSET
    assert stats.stored_bytes is not msgspec.UNSET and stats.stored_bytes > 20
    assert (await ckpt.load_manifest(cid)).stats == stats
