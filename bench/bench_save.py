"""Throughput of cairn's save and load against raw obstore, interleaved to cancel noise.

    python bench/bench_save.py [--quick] [--json out.json]

Every scenario runs its variants (cairn and the raw-obstore baselines) round-robin, one
timed run each per repetition, rotating which goes first; the first round is a discarded
warm-up. The whole run uses one event loop (one ``asyncio.run``): the default thread pool
(where SHA-256 runs) and obstore's runtime stay warm, as in a long-lived job, instead of
being rebuilt and joined per repetition, which would add noise unrelated to cairn.

Ratios are cairn's throughput over a baseline's (1.0 = as fast, higher is better):
"of medians" divides median throughputs; "paired" is the median of per-round ratios (the
two ran back to back); "cpu" divides median process CPU seconds (all threads), the
measure least disturbed by a shared machine. Baselines hash with
``asyncio.to_thread(sha256_hex, buf)``, so the hash itself runs in the thread.
"""

from __future__ import annotations

import argparse
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

from cairn import CheckpointData, CheckpointId, ObjectStoreCheckpointer

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


# -- stores and helpers ------------------------------------------------------------------


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


# -- variants ------------------------------------------------------------------------------


def cairn_save(factory: StoreFactory, parts: Sequence[bytes], limit: int) -> Variant:
    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        with factory() as store:
            ckpt = ObjectStoreCheckpointer(store, max_concurrent_uploads=limit)
            uploads = [("op", i, False, data) for i, data in enumerate(parts)]
            yield lambda: ckpt.save_partitions_concurrent(CheckpointId.now(), uploads)

    return variant


def raw_save(factory: StoreFactory, parts: Sequence[bytes], limit: int, sha: bool) -> Variant:
    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        with factory() as store:

            async def put(i: int) -> None:
                upload = obstore.put_async(store, artifact_path(i), parts[i])
                if sha:
                    await asyncio.gather(asyncio.to_thread(sha256_hex, parts[i]), upload)
                else:
                    await upload

            yield lambda: bounded(limit, len(parts), put)

    return variant


def fixed(run: Run) -> Variant:
    """A variant with nothing to prepare or clean up."""

    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        yield run

    return variant


# -- scenarios -----------------------------------------------------------------------------


@asynccontextmanager
async def save_scenario(kind: str, parts: Sequence[bytes]) -> AsyncIterator[Scenario]:
    factory = STORES[kind]
    yield Scenario(
        name=f"save {len(parts)}x{len(parts[0]) // MiB}MiB c=8",
        store=kind,
        amount=sum(map(len, parts)) / MiB,
        unit="MiB",
        variants={
            "cairn": cairn_save(factory, parts, 8),
            "put": raw_save(factory, parts, 8, sha=False),
            "put+sha": raw_save(factory, parts, 8, sha=True),
        },
        ratios=[("cairn", "put+sha", 0.9), ("cairn", "put", None)],
    )


@asynccontextmanager
async def load_scenario(kind: str, parts: Sequence[bytes]) -> AsyncIterator[Scenario]:
    with STORES[kind]() as store:
        ckpt = ObjectStoreCheckpointer(store, max_concurrent_downloads=8)
        data = CheckpointData(epoch=0, snapshots={("op", i): b for i, b in enumerate(parts)})
        manifest = await ckpt.save(data)
        paths = [ckpt.paths.resolve(data.id, e.path) for _, e in manifest.partition_entries()]

        async def raw_get(i: int) -> Buffer:  # keeps the bytes until the run ends, as load does
            result = await obstore.get_async(store, paths[i])
            body = await result.bytes_async()
            await asyncio.to_thread(sha256_hex, body)
            return body

        yield Scenario(
            name=f"load {len(parts)}x{len(parts[0]) // MiB}MiB c=8",
            store=kind,
            amount=sum(map(len, parts)) / MiB,
            unit="MiB",
            variants={
                "cairn": fixed(lambda: ckpt.load(data.id)),
                "get+sha": fixed(lambda: bounded(8, len(paths), raw_get)),
            },
            ratios=[("cairn", "get+sha", 0.9)],
        )


@asynccontextmanager
async def small_scenario(kind: str, parts: Sequence[bytes]) -> AsyncIterator[Scenario]:
    factory = STORES[kind]
    yield Scenario(
        name=f"small {len(parts)}x{len(parts[0]) // 1024}KiB",
        store=kind,
        amount=len(parts),
        unit="put",
        variants={
            "cairn c=8": cairn_save(factory, parts, 8),
            "put c=8": raw_save(factory, parts, 8, sha=False),
            "put c=64": raw_save(factory, parts, 64, sha=False),
        },
        ratios=[("cairn c=8", "put c=8", 0.7), ("cairn c=8", "put c=64", None)],
    )


# -- measuring and reporting --------------------------------------------------------------


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


async def run_all(reps: int, only: str) -> list[Scenario]:
    big = [os.urandom(8 * MiB) for _ in range(64)]
    small = [os.urandom(1024) for _ in range(10_000)]
    builders: list[AbstractAsyncContextManager[Scenario]] = [
        *(save_scenario(kind, big) for kind in STORES),
        *(load_scenario(kind, big) for kind in STORES),
        small_scenario("memory", small),
    ]
    done = []
    for builder in builders:
        async with builder as sc:
            if only not in f"{sc.name} {sc.store}":
                continue
            print(f"running {sc.name} on {sc.store}...", file=sys.stderr, flush=True)
            await measure(sc, reps)
        done.append(sc)
    return done


def emit_json(out: dict[str, Any], path: str | None) -> None:
    """Print the report as JSON, and also write it to ``path`` when one is given."""
    text = json.dumps(out, indent=2)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 5, 3 with --quick)")
    parser.add_argument("--only", default="", help="run scenarios whose 'name store' has this")
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 5)
    out = report(asyncio.run(run_all(reps, args.only)), reps)
    print_report(out)
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
