"""One checkpoint a second, sustained: a stream job's incremental checkpoints on a slow store.

    python bench/bench_interval.py [--seconds 60] [--interval 1] [--delay 0.05]
                                   [--stores memory,moto] [--keep-last 10] [--json out.json]

A job of 8 operators x 32 partitions (256), each holding 1-16 KiB of state, and a
source of 32 partitions whose offsets every checkpoint records. Every interval 10 % of
the partitions change: the checkpoint saves their new state as snapshots and names the
one before as its parent, so the other 90 % are carried by reference (an incremental
checkpoint, as RocksDB's changed files are). The job hands each checkpoint to
``save_async`` (``max_saves_in_flight=2``) on the tick and goes on; retention keeps the
last 10 (``RetentionPolicy(keep_last=10)``, its GC in the background after each commit,
as a job running for days needs; ``--keep-last 0``: no retention, the save's own
cost). Every store call waits ``--delay`` seconds before it
goes to the store: on the memory store, and on moto's S3 server on loopback (started
here, ``tests/support/servers.py``). The first checkpoint, a full one, is taken before
the clock starts.

It reports, per store:

* the commit latency of each checkpoint, from its tick to its commit (p50, p99, max),
  and the interval achieved between commits;
* whether a backlog grew: the saves still in flight at each tick, and how late the job
  handed each over (``save_async`` waits while two are in flight), over the first and
  the last third of the run;
* the requests per checkpoint by kind: those of the save itself (what its manifest's
  statistics record) and all of them (the retention GC's included);
* the client's CPU time (this process: user + system) per checkpoint and as a share of
  one core over the run; moto's own CPU is not counted;
* ``load_latest`` at the end, in a new checkpointer (as a restarted job does), and
  whether what it loaded equals the job's state.

Targets: no backlog growth, p99 commit <= 500 ms, client CPU <= 10 % of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import itertools
import json
import os
import random
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obstore.store import S3Store

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "tests"))  # for support.servers

from cairn import (  # noqa: E402
    CheckpointData,
    CheckpointManifest,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    SourceOffsetEntry,
)
from cairn.format.ids import CheckpointId  # noqa: E402
from cairn.observe import Observer, Operation, StoreCall  # noqa: E402
from cairn.observe._dispatch import REQUEST_KINDS  # noqa: E402
from cairn.stores import ForwardingStore, Store, StoreMethod, as_store  # noqa: E402

# Imported by name at run time: tests/ is not a package (see bench_s3.py).
servers: Any = importlib.import_module("support.servers")

OPERATORS = 8
PARTITIONS = 32
SOURCE_PARTITIONS = 32
CHANGING = 0.10
MIN_STATE = 1024
MAX_STATE = 16 * 1024
KEEP_LAST = 10
IN_FLIGHT = 2
P99_TARGET_S = 0.5
CPU_TARGET = 0.10


class DelayedStore(ForwardingStore):
    """Every call waits ``delay`` seconds, then goes to the store: a store's round trip."""

    def __init__(self, inner: Store, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    async def _around(
        self, operation: StoreMethod, path: str, call: Callable[[], Awaitable[Any]], **_: Any
    ) -> Any:
        await asyncio.sleep(self.delay)
        return await call()


def _root(operation: Operation | None) -> str:
    while operation is not None and operation.parent is not None:
        operation = operation.parent
    return operation.name if operation is not None else "other"


class RequestTally(Observer):
    """Every store request by kind (PUT, GET, ...), and by the operation it was made in."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.by_operation: Counter[str] = Counter()

    def store_call(self, operation: Operation | None, call: StoreCall) -> None:
        self.by_kind[REQUEST_KINDS.get(call.operation, call.operation)] += 1  # type: ignore[call-overload]
        self.by_operation[_root(operation)] += 1

    def reset(self) -> None:
        self.by_kind.clear()
        self.by_operation.clear()


class Job:
    """The job's state: 256 partitions of 1-16 KiB, and its source's offsets."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.state = {
            (f"op{o}", p): self.new_state() for o in range(OPERATORS) for p in range(PARTITIONS)
        }
        self.offsets = [0] * SOURCE_PARTITIONS

    def new_state(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(MIN_STATE, MAX_STATE))

    def advance(self) -> dict[tuple[str, int], bytes]:
        """One interval of work: 10 % of the partitions change; the new state of each."""
        keys = self.rng.sample(sorted(self.state), round(CHANGING * len(self.state)))
        for key in keys:
            self.state[key] = self.new_state()
        self.offsets = [offset + self.rng.randint(100, 1000) for offset in self.offsets]
        return {key: self.state[key] for key in keys}

    def source_offsets(self, epoch: int) -> dict[str, SourceOffsetEntry]:
        positions = {str(p): str(offset) for p, offset in enumerate(self.offsets)}
        return {"events": SourceOffsetEntry("kafka", positions, epoch)}


@dataclass
class Tick:
    """One checkpoint of the run, as the job saw it (times from the event loop's clock)."""

    epoch: int
    due: float
    in_flight: int
    handed_over: float = 0.0
    committed: float | None = None
    manifest: CheckpointManifest | None = None
    error: str | None = None

    @property
    def latency(self) -> float:
        assert self.committed is not None
        return self.committed - self.due


@dataclass
class Result:
    """What one store's run measured."""

    store: str
    seconds: float
    ticks: list[Tick]
    cpu_seconds: float
    save_requests: dict[str, float]
    all_requests: dict[str, float]
    requests_by_operation: dict[str, float]
    load_latest_s: float
    loaded_equal: bool
    uptime: str = field(default="")

    def committed(self) -> list[Tick]:
        return [tick for tick in self.ticks if tick.committed is not None]

    def summary(self) -> dict[str, Any]:
        done = self.committed()
        latencies = sorted(tick.latency for tick in done)
        commits = sorted(tick.committed for tick in done if tick.committed is not None)
        gaps = [b - a for a, b in itertools.pairwise(commits)]
        third = max(1, len(self.ticks) // 3)
        first, last = self.ticks[:third], self.ticks[-third:]
        lateness = [tick.handed_over - tick.due for tick in self.ticks]
        grew = statistics.mean(t.in_flight for t in last) > statistics.mean(
            t.in_flight for t in first
        ) + 0.5 or statistics.mean(t.handed_over - t.due for t in last) > statistics.mean(
            t.handed_over - t.due for t in first
        ) + 0.5 * (self.seconds / max(1, len(self.ticks)))
        cpu_share = self.cpu_seconds / self.seconds
        return {
            "store": self.store,
            "checkpoints": len(self.ticks),
            "committed": len(done),
            "failed": [tick.error for tick in self.ticks if tick.error is not None],
            "commit_p50_ms": 1000 * percentile(latencies, 50),
            "commit_p99_ms": 1000 * percentile(latencies, 99),
            "commit_max_ms": 1000 * latencies[-1],
            "interval_p50_s": statistics.median(gaps) if gaps else None,
            "in_flight_first_third": statistics.mean(t.in_flight for t in first),
            "in_flight_last_third": statistics.mean(t.in_flight for t in last),
            "late_max_ms": 1000 * max(lateness),
            "backlog_grew": grew,
            "save_requests_per_ckpt": self.save_requests,
            "all_requests_per_ckpt": self.all_requests,
            "requests_per_ckpt_by_operation": self.requests_by_operation,
            "client_cpu_ms_per_ckpt": 1000 * self.cpu_seconds / len(self.ticks),
            "client_cpu_share": cpu_share,
            "load_latest_ms": 1000 * self.load_latest_s,
            "loaded_equals_state": self.loaded_equal,
            "targets_met": not grew
            and percentile(latencies, 99) <= P99_TARGET_S
            and cpu_share <= CPU_TARGET
            and len(done) == len(self.ticks)
            and self.loaded_equal,
        }


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``ordered`` (ascending)."""
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_checkpoint(counts: Counter[str], checkpoints: int) -> dict[str, float]:
    return {kind: round(n / checkpoints, 2) for kind, n in sorted(counts.items())}


async def run_job(
    store: Store, name: str, seconds: float, interval: float, seed: int, keep_last: int
) -> Result:
    """The job on ``store`` for ``seconds``, a checkpoint every ``interval``; retention
    keeps the last ``keep_last`` (0: no retention, no GC)."""
    tally = RequestTally()
    retention = RetentionPolicy(keep_last=keep_last) if keep_last else None
    ckpt = ObjectStoreCheckpointer(
        store, max_saves_in_flight=IN_FLIGHT, retention=retention, observers=[tally]
    )
    job = Job(random.Random(seed))
    first = CheckpointData(epoch=0, snapshots=dict(job.state), source_offsets=job.source_offsets(0))
    parent: CheckpointId = (await ckpt.save(first)).checkpoint_id
    await ckpt.wait_for_saves()
    if retention is not None:
        await ckpt.background_gc.wait()
    tally.reset()
    loop = asyncio.get_running_loop()
    ticks: list[Tick] = []
    count = round(seconds / interval)
    cpu_started, started = cpu_now(), loop.time()
    for epoch in range(1, count + 1):
        due = started + epoch * interval
        await asyncio.sleep(max(0.0, due - loop.time()))
        tick = Tick(epoch, due, ckpt.background.in_flight)
        changed = job.advance()
        data = CheckpointData(
            epoch=epoch,
            snapshots=changed,
            parent_id=parent,
            source_offsets=job.source_offsets(epoch),
        )
        parent = data.id
        task = await ckpt.save_async(data)
        tick.handed_over = loop.time()
        ticks.append(tick)

        def ended(task: asyncio.Task[CheckpointManifest], tick: Tick = tick) -> None:
            tick.committed = loop.time() if not task.cancelled() and not task.exception() else None
            if tick.committed is not None:
                tick.manifest = task.result()
            else:
                tick.error = repr(task.exception()) if not task.cancelled() else "cancelled"

        task.add_done_callback(ended)
    with contextlib.suppress(Exception):  # each failure is on its tick
        await ckpt.wait_for_saves()
    ran = loop.time() - started
    cpu = cpu_now() - cpu_started
    all_requests = per_checkpoint(tally.by_kind, count)
    by_operation = per_checkpoint(tally.by_operation, count)
    await ckpt.close()
    saved: Counter[str] = Counter()
    for tick in ticks:
        stats = tick.manifest.stats if tick.manifest is not None else None
        requests = getattr(stats, "requests", None)
        if requests is not None:
            for kind in ("put", "get", "head", "list", "delete"):
                saved[kind] += getattr(requests, kind)
    fresh = ObjectStoreCheckpointer(store)
    load_started = time.perf_counter()
    loaded = await fresh.load_latest()
    load_latest_s = time.perf_counter() - load_started
    equal = (
        loaded is not None
        and loaded.checkpoint_id == parent
        and {key: bytes(data) for key, data in loaded.artifacts.items()} == job.state
        and loaded.source_offsets == job.source_offsets(count)
    )
    return Result(
        store=name,
        seconds=ran,
        ticks=ticks,
        cpu_seconds=cpu,
        save_requests=per_checkpoint(saved, count),
        all_requests=all_requests,
        requests_by_operation=by_operation,
        load_latest_s=load_latest_s,
        loaded_equal=equal,
    )


@contextlib.contextmanager
def opened(name: str) -> Iterator[Store]:
    """The store called ``name``: ``memory``, or ``moto`` (S3 on a loopback server)."""
    if name == "memory":
        yield as_store("memory://")
        return
    if name != "moto":
        raise SystemExit(f"--stores: unknown store {name!r} (memory, moto)")
    with servers.S3Server() as server:
        bucket = servers.unique_name("cairn-interval")
        server.create_bucket(bucket)
        yield as_store(S3Store(bucket, **servers.s3_store_options(server)))


def kinds(counts: dict[str, float]) -> str:
    return ", ".join(f"{kind.upper()} {n:g}" for kind, n in counts.items())


def print_table(rows: list[dict[str, Any]], delay: float, interval: float) -> None:
    print(
        f"\n{OPERATORS} x {PARTITIONS} partitions of {MIN_STATE // 1024}-{MAX_STATE // 1024} KiB, "
        f"{CHANGING:.0%} changing, a checkpoint every {interval:g} s, "
        f"{1000 * delay:g} ms per store call\n"
    )
    print(
        "| store | checkpoints | commit p50 | commit p99 | interval | backlog | "
        "client CPU | load_latest |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        backlog = "grew" if row["backlog_grew"] else "none"
        print(
            f"| {row['store']} + {1000 * delay:g} ms | {row['committed']}/{row['checkpoints']} "
            f"| {row['commit_p50_ms']:.0f} ms | {row['commit_p99_ms']:.0f} ms "
            f"| {row['interval_p50_s']:.3f} s | {backlog} "
            f"(in flight {row['in_flight_first_third']:.2f} -> {row['in_flight_last_third']:.2f}) "
            f"| {row['client_cpu_ms_per_ckpt']:.1f} ms/ckpt ({row['client_cpu_share']:.1%}) "
            f"| {row['load_latest_ms']:.0f} ms |"
        )
    print("\n| store | requests per checkpoint: the save's | all (GC's included) | by operation |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['store']} | {kinds(row['save_requests_per_ckpt'])} "
            f"| {kinds(row['all_requests_per_ckpt'])} "
            f"| {kinds(row['requests_per_ckpt_by_operation'])} |"
        )
    for row in rows:
        verdict = "met" if row["targets_met"] else "NOT met"
        print(
            f"\n{row['store']}: targets {verdict} (no backlog growth, p99 <= "
            f"{1000 * P99_TARGET_S:.0f} ms, CPU <= {CPU_TARGET:.0%}); "
            f"load_latest equals the job's state: {row['loaded_equals_state']}"
        )
        for error in row["failed"]:
            print(f"  failed: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per store call")
    parser.add_argument("--stores", default="memory,moto")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--keep-last", type=int, default=KEEP_LAST, help="retention after each commit (0: none)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    uptime = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    rows = []
    for name in args.stores.split(","):
        with opened(name) as raw:
            store = DelayedStore(raw, args.delay)
            print(f"running {name} for {args.seconds:g} s ...", file=sys.stderr, flush=True)
            result = asyncio.run(
                run_job(store, name, args.seconds, args.interval, args.seed, args.keep_last)
            )
        rows.append(result.summary())
    print(f"load average before the run: {' '.join(uptime)}; {os.cpu_count()} cores")
    print_table(rows, args.delay, args.interval)
    if args.json is not None:
        args.json.write_text(json.dumps({"load_average": uptime, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
