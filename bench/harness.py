"""What every benchmark here shares: scenarios of variants, interleaved measurement,
medians and ratios, and the report (a table and JSON).

Every scenario runs its variants round-robin, one timed run each per repetition,
rotating which goes first; round 0 is a discarded warm-up. Ratios are throughput over a
baseline's (1.0 = as fast): "of medians" divides median throughputs, "paired" is the
median of per-round ratios (run back to back), "cpu" divides median process CPU seconds.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass, field
from typing import Any, TypeVar

import obstore
from obstore.store import LocalStore, MemoryStore, ObjectStore

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer

MiB = 1 << 20
Run = Callable[[], Awaitable[object]]
"""One timed run."""
Variant = Callable[[], AbstractAsyncContextManager[Run]]
"""Prepares a timed run (untimed) and cleans up after it (untimed)."""
StoreFactory = Callable[[], AbstractContextManager[ObjectStore]]
T = TypeVar("T")


@dataclass
class Scenario:
    """Variants measured together, and the throughput ratios to report between them."""

    name: str
    store: str
    amount: float  # per run, in `unit`-seconds: MiB or puts
    unit: str
    variants: dict[str, Variant]
    ratios: list[tuple[str, str, float | None]]  # (numerator, denominator, target)
    times: dict[str, list[float]] = field(default_factory=dict)  # wall seconds per run
    cpu: dict[str, list[float]] = field(default_factory=dict)  # process CPU seconds, all threads


@contextmanager
def local_store() -> Iterator[ObjectStore]:
    """A LocalStore in a fresh temp dir, removed on exit."""
    root = tempfile.mkdtemp(prefix="cairn-bench-")
    try:
        yield LocalStore(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def memory_store() -> Iterator[ObjectStore]:
    yield MemoryStore()


STORES: dict[str, StoreFactory] = {"local": local_store, "memory": memory_store}


def sha256_hex(data: Buffer) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_path(i: int) -> str:
    """Same depth as cairn's layout, so a LocalStore creates as many directories."""
    return f"ckpt/operators/op/partition-{i}.snap"


async def bounded(limit: int, count: int, job: Callable[[int], Awaitable[T]]) -> list[T]:
    """``job(0..count-1)`` with at most ``limit`` in flight (the naive semaphore way)."""
    sem = asyncio.Semaphore(limit)

    async def one(i: int) -> T:
        async with sem:
            return await job(i)

    return await asyncio.gather(*(one(i) for i in range(count)))


def fixed(run: Run) -> Variant:
    """A variant with nothing to prepare or clean up."""

    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        yield run

    return variant


async def measure(sc: Scenario, reps: int) -> None:
    """Wall and CPU seconds per run of each variant: ``reps`` interleaved rounds after one
    warm-up round, each round starting with a different variant."""
    names = list(sc.variants)
    sc.times = {name: [] for name in names}
    sc.cpu = {name: [] for name in names}
    for rnd in range(reps + 1):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            async with sc.variants[name]() as run:
                gc.collect()
                wall, cpu = time.perf_counter(), time.process_time()
                await run()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if rnd:  # round 0 is the warm-up
                sc.times[name].append(wall)
                sc.cpu[name].append(cpu)


def rate(sc: Scenario, name: str) -> float:
    return sc.amount / statistics.median(sc.times[name])


def report(scenarios: list[Scenario], reps: int) -> dict[str, Any]:
    results, ratios = [], []
    for sc in scenarios:
        for name, ts in sc.times.items():
            results.append(
                {
                    "scenario": sc.name,
                    "store": sc.store,
                    "variant": name,
                    "median_s": statistics.median(ts),
                    "min_s": min(ts),
                    "max_s": max(ts),
                    "median_cpu_s": statistics.median(sc.cpu[name]),
                    "throughput": rate(sc, name),
                    "unit": f"{sc.unit}/s",
                    "times_s": ts,
                    "cpu_s": sc.cpu[name],
                }
            )
        for num, den, target in sc.ratios:
            value = rate(sc, num) / rate(sc, den)
            paired = statistics.median(
                b / a for a, b in zip(sc.times[num], sc.times[den], strict=True)
            )
            cpu = statistics.median(sc.cpu[den]) / statistics.median(sc.cpu[num])
            ratios.append(
                {
                    "scenario": sc.name,
                    "store": sc.store,
                    "ratio": f"{num} / {den}",
                    "value": value,
                    "paired_median": paired,
                    "cpu_ratio": cpu,
                    "target": target,
                    "ok": None if target is None else value >= target,
                }
            )
    return {
        "reps": reps,
        "python": sys.version.split()[0],
        "obstore": obstore.__version__,
        "cpus": os.cpu_count(),
        "results": results,
        "ratios": ratios,
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    line = "  ".join("{:<%d}" % w for w in widths)  # noqa: UP031 - a format built per width
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line.format(*headers), sep, *(line.format(*r) for r in rows)])


def print_report(out: dict[str, Any]) -> None:
    print(
        table(
            ["scenario", "store", "variant", "median s", "min s", "max s", "cpu s", "throughput"],
            [
                [
                    r["scenario"],
                    r["store"],
                    r["variant"],
                    f"{r['median_s']:.3f}",
                    f"{r['min_s']:.3f}",
                    f"{r['max_s']:.3f}",
                    f"{r['median_cpu_s']:.3f}",
                    f"{r['throughput']:,.0f} {r['unit']}",
                ]
                for r in out["results"]
            ],
        )
    )
    print()
    print(
        table(
            ["scenario", "store", "ratio", "of medians", "paired", "cpu", "target", "ok"],
            [
                [
                    r["scenario"],
                    r["store"],
                    r["ratio"],
                    f"{r['value']:.3f}",
                    f"{r['paired_median']:.3f}",
                    f"{r['cpu_ratio']:.3f}",
                    "" if r["target"] is None else f">= {r['target']}",
                    {None: "", True: "yes", False: "MISSED"}[r["ok"]],
                ]
                for r in out["ratios"]
            ],
        )
    )


def emit_json(out: dict[str, Any], path: str | None) -> None:
    """Print the report as JSON, and also write it to ``path`` when one is given."""
    text = json.dumps(out, indent=2)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)
