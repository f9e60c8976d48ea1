"""Restoring keyed state at another parallelism: bytes, requests and time per worker.

    python bench/bench_rescale.py [--quick] [--size-mib 1024] [--groups 256]
                                  [--saved-by 8] [--restore-by 3,16] [--stores s3]
                                  [--reps 3] [--json out.json]

Keyed state of ``--size-mib`` MiB in ``--groups`` key groups (random bytes, equal
groups) is saved by ``--saved-by`` workers: one ``save`` of as many
``KeyedSnapshot`` partitions, each an object of ranges, one range per group. Then, for
each M of ``--restore-by``, ``restore_plan(id, workers=M)`` (the manifest and every
partition's range index) and, for each new worker in turn, ``load_assignment`` of its
part: exactly its groups, read with ranged requests and verified group by group.

The baseline, measured in the same run: a full download of the checkpoint, ``load(id)``
(every object read whole and verified), which is what a restore costs without key
groups (each worker reads everything and keeps its keys).

Reported per store and M: the bytes each worker read (min, median, max) against the
bytes of its groups (their ratio; the target is at most 1.1), the requests of the plan
and of each worker, and the median time of a worker's read against the median time of a
full download (a worker of M reads about 1/M of it). Every store call is counted by a
``ForwardingStore`` that adds the bytes each read returns.

Stores: a MemoryStore, and moto's S3 server on a loopback port
(``tests/support/servers.py``). ``--quick``: 64 MiB, memory only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_rescale.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers

from bench.harness import MiB, emit_json, memory_or_moto_store, table  # noqa: E402
from cairn import CheckpointData, KeyedSnapshot, KeyGroups, ObjectStoreCheckpointer  # noqa: E402
from cairn.stores import ForwardingStore, Store, StoreMethod, as_store  # noqa: E402

T = TypeVar("T")
OPERATOR = "keyed-state"


class CountingStore(ForwardingStore):
    """Counts requests, and the bytes each read returns."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.requests = 0
        self.bytes_read = 0

    def reset(self) -> tuple[int, int]:
        counted = (self.requests, self.bytes_read)
        self.requests = self.bytes_read = 0
        return counted

    async def _around(
        self, operation: StoreMethod, path: str, call: Callable[[], Awaitable[T]], **_: object
    ) -> T:
        result = await call()
        self.requests += 1
        if operation == "get":
            self.bytes_read += memoryview(result.data).nbytes  # type: ignore[attr-defined]
        elif operation == "get_range":
            self.bytes_read += memoryview(result).nbytes  # type: ignore[arg-type]
        return result


async def run_store(kind: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    space = KeyGroups(args.groups)
    group_bytes = args.size_mib * MiB // args.groups
    state = {g: os.urandom(group_bytes) for g in range(args.groups)}
    rows: list[dict[str, Any]] = []
    with memory_or_moto_store(kind, "bench-rescale") as raw:
        store = CountingStore(as_store(raw))
        ckpt = ObjectStoreCheckpointer(store)
        snapshots = {
            (OPERATOR, w): KeyedSnapshot(
                space, {g: state[g] for g in space.groups_of(w, args.saved_by)}
            )
            for w in range(args.saved_by)
        }
        began = time.perf_counter()
        manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
        save_s = time.perf_counter() - began
        cid = manifest.checkpoint_id
        store.reset()
        full_s: list[float] = []
        for _ in range(args.reps):
            began = time.perf_counter()
            await ckpt.load(cid)
            full_s.append(time.perf_counter() - began)
        full_requests, full_bytes = store.reset()
        full_requests //= args.reps
        full_bytes //= args.reps
        for workers in args.restore_by:
            began = time.perf_counter()
            plan = await ckpt.restore_plan(cid, workers=workers)
            plan_s = time.perf_counter() - began
            plan_requests, plan_bytes = store.reset()
            read_bytes: list[int] = []
            ratios: list[float] = []
            requests: list[int] = []
            times: list[float] = []
            for part in plan.assignments:
                assignment = part.keyed[OPERATOR]
                wanted = sum(len(state[g]) for g in assignment.groups)
                worker_s = []
                for _ in range(args.reps):
                    store.reset()
                    began = time.perf_counter()
                    got = await ckpt.load_assignment(assignment)
                    worker_s.append(time.perf_counter() - began)
                    assert sorted(got) == list(assignment.groups)
                calls, fetched = store.reset()
                requests.append(calls)
                read_bytes.append(fetched)
                ratios.append(fetched / wanted if wanted else 1.0)
                times.append(statistics.median(worker_s))
            rows.append(
                {
                    "store": kind,
                    "size_mib": args.size_mib,
                    "groups": args.groups,
                    "saved_by": args.saved_by,
                    "restored_by": workers,
                    "save_s": save_s,
                    "full_download_s": statistics.median(full_s),
                    "full_download_bytes": full_bytes,
                    "full_download_requests": full_requests,
                    "plan_s": plan_s,
                    "plan_requests": plan_requests,
                    "plan_bytes": plan_bytes,
                    "worker_bytes": {
                        "min": min(read_bytes),
                        "median": statistics.median(read_bytes),
                        "max": max(read_bytes),
                    },
                    "worker_bytes_over_groups_max": max(ratios),
                    "worker_requests_max": max(requests),
                    "worker_s_median": statistics.median(times),
                    "worker_s_max": max(times),
                    "worker_over_full_time": statistics.median(times) / statistics.median(full_s),
                    "target_bytes_ok": max(ratios) <= 1.1,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--saved-by", type=int, default=8)
    parser.add_argument("--restore-by", default="3,16")
    parser.add_argument("--stores", default="s3")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    args.restore_by = [int(n) for n in args.restore_by.split(",")]
    stores = args.stores.split(",")
    if args.quick:
        args.size_mib, stores = 64, ["memory"]
    rows: list[dict[str, Any]] = []
    for kind in stores:
        rows += asyncio.run(run_store(kind, args))
    print(
        table(
            [
                "store",
                "N->M",
                "worker MiB min/med/max",
                "bytes/groups",
                "plan req",
                "worker req",
                "worker s",
                "full s",
                "worker/full",
            ],
            [
                [
                    r["store"],
                    f"{r['saved_by']}->{r['restored_by']}",
                    "/".join(f"{r['worker_bytes'][k] / MiB:.1f}" for k in ("min", "median", "max")),
                    f"{r['worker_bytes_over_groups_max']:.4f}",
                    str(r["plan_requests"]),
                    str(r["worker_requests_max"]),
                    f"{r['worker_s_median']:.3f}",
                    f"{r['full_download_s']:.3f}",
                    f"{r['worker_over_full_time']:.3f}",
                ]
                for r in rows
            ],
        )
    )
    emit_json({"benchmark": "rescale", "results": rows}, args.json)


if __name__ == "__main__":
    main()
