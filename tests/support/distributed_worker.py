"""A worker process for the distributed-save tests: uploads its partitions, reports back.

Run through multiprocessing (spawn): each worker is a separate interpreter with its own
obstore runtime, as a worker on another host would be.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from multiprocessing.queues import Queue
from typing import Any

import msgspec
from obstore.store import S3Store

from cairn import (
    CheckpointId,
    ObjectStoreCheckpointer,
    PartitionSnapshotEntry,
    WorkerReport,
    upload_partitions,
)

WORKER_LEASE = dt.timedelta(seconds=1)


def partition_bytes(operator: str, partition: int) -> bytes:
    """The state a worker uploads for a partition: derived from its key, ~200 KiB."""
    return f"{operator}:{partition};".encode() * 20_000


def run_worker(
    bucket: str,
    options: dict[str, Any],
    checkpoint_id: str,
    worker: int,
    keys: list[tuple[str, int]],
    reports: Queue[bytes],
    mode: str = "honest",
) -> None:
    """Upload ``keys`` for ``checkpoint_id`` and put the JSON report on ``reports``.

    ``mode``: ``"honest"``; ``"slow"`` uploads one partition at a time with pauses (so it
    can be killed mid-upload); ``"lie"`` reports a wrong digest for its first partition.
    """

    async def upload() -> WorkerReport:
        # A short lease, so that the lease of a worker the tests kill lapses quickly.
        ckpt = ObjectStoreCheckpointer(S3Store(bucket, **options), lease=WORKER_LEASE)
        cid = CheckpointId.parse(checkpoint_id)
        uploads = [(op, p, False, partition_bytes(op, p)) for op, p in keys]
        if mode != "slow":
            return await upload_partitions(ckpt, cid, uploads, worker=f"w{worker}")
        entries: list[tuple[str, PartitionSnapshotEntry]] = []
        for item in uploads:
            entries.extend((await upload_partitions(ckpt, cid, [item])).entries)
            await asyncio.sleep(0.5)
        return WorkerReport(checkpoint_id=cid, worker=f"w{worker}", entries=tuple(entries))

    report = asyncio.run(upload())
    if mode == "lie":
        operator, entry = report.entries[0]
        forged = msgspec.structs.replace(entry, sha256="0" * 64)
        report = msgspec.structs.replace(report, entries=((operator, forged), *report.entries[1:]))
    reports.put(report.to_json())
