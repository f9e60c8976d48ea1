"""Save to an S3 test server (moto): cairn against raw obstore put + SHA-256.

    python bench/bench_s3.py [--quick] [--json out.json] [--reps N]

Starts moto's S3 server on a loopback port (``tests/support/servers.py``), creates a
bucket, and measures cairn's ``save_partitions_concurrent`` of 16 x 8 MiB
(``max_concurrent_uploads=8``) against ``put_async`` under ``Semaphore(8)``, alone and
alongside SHA-256 in a thread ("put+sha", the honest baseline): the variants of
bench_save.py, on an S3Store. The bucket is emptied after every run (untimed).

moto is a Python server on the same 2 cores: its CPU seconds per run (utime + stime of
its process, from /proc) are reported beside the client's, since it, not obstore or
cairn, sets the pace. Measured as in bench_save.py (its ``measure`` and ``report``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import obstore
from obstore.store import ObjectStore, S3Store

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_s3.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers

from bench.bench_save import cairn_save, raw_save  # noqa: E402
from bench.harness import (  # noqa: E402
    MiB,
    Run,
    Scenario,
    StoreFactory,
    Variant,
    emit_json,
    measure,
    print_report,
    report,
    table,
)

# Imported by name at run time: tests/ is not a package, so ``mypy bench`` cannot resolve
# ``support.servers``, and naming it ``tests.support.servers`` would make a whole-project
# ``mypy`` see tests/support/servers.py under two module names.
servers: Any = importlib.import_module("support.servers")

PARTS = 16
CONCURRENCY = 8


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc_pid_stat(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def emptied_after(store: ObjectStore) -> StoreFactory:
    """A StoreFactory for bench_save's variants: the same store, emptied after each run."""

    @contextmanager
    def factory() -> Iterator[ObjectStore]:
        try:
            yield store
        finally:
            paths = [meta["path"] for meta in obstore.list(store).collect()]
            if paths:
                obstore.delete(store, paths)

    return factory


def with_server_cpu(variant: Variant, server_pid: int, sink: list[float]) -> Variant:
    """``variant``, also recording the server's CPU seconds during each timed run."""

    @asynccontextmanager
    async def wrapped() -> AsyncIterator[Run]:
        async with variant() as run:

            async def timed() -> None:
                before = process_cpu_seconds(server_pid)
                await run()
                sink.append(process_cpu_seconds(server_pid) - before)

            yield timed

    return wrapped


async def run_all(reps: int) -> tuple[Scenario, dict[str, list[float]], float]:
    with servers.S3Server() as server:
        bucket = servers.unique_name("cairn-bench")
        server.create_bucket(bucket)
        store = S3Store(bucket, **servers.s3_store_options(server))
        pid: int = server._proc.pid  # the moto process (a private attribute of the helper)
        factory = emptied_after(store)
        parts = [os.urandom(8 * MiB) for _ in range(PARTS)]
        server_cpu: dict[str, list[float]] = {"cairn": [], "put": [], "put+sha": []}
        variants = {
            "cairn": cairn_save(factory, parts, CONCURRENCY),
            "put": raw_save(factory, parts, CONCURRENCY, sha=False),
            "put+sha": raw_save(factory, parts, CONCURRENCY, sha=True),
        }
        sc = Scenario(
            name=f"save {PARTS}x8MiB c={CONCURRENCY}",
            store="s3 (moto)",
            amount=PARTS * 8,
            unit="MiB",
            variants={
                name: with_server_cpu(v, pid, server_cpu[name]) for name, v in variants.items()
            },
            ratios=[("cairn", "put+sha", 0.9), ("cairn", "put", None)],
        )
        print(
            f"moto up in {server.startup_seconds:.1f}s; running {sc.name}...",
            file=sys.stderr,
            flush=True,
        )
        await measure(sc, reps)
        # measure() discards round 0, in which every variant ran once: drop it here too.
        startup: float = server.startup_seconds
        return sc, {name: cpu[1:] for name, cpu in server_cpu.items()}, startup


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 5, 3 with --quick)")
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 5)
    sc, server_cpu, startup = asyncio.run(run_all(reps))
    out = report([sc], reps)
    out["server"] = {
        "startup_s": startup,
        "cpu_s": server_cpu,
        "median_cpu_s": {name: statistics.median(v) for name, v in server_cpu.items()},
    }
    print_report(out)
    print()
    print(
        table(
            ["variant", "client cpu s", "moto cpu s", "client + moto cpu s"],
            [
                [
                    r["variant"],
                    f"{r['median_cpu_s']:.3f}",
                    f"{out['server']['median_cpu_s'][r['variant']]:.3f}",
                    f"{r['median_cpu_s'] + out['server']['median_cpu_s'][r['variant']]:.3f}",
                ]
                for r in out["results"]
            ],
        )
    )
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
