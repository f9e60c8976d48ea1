"""What every benchmark here shares: scenarios of variants, interleaved measurement,
medians and ratios, and the report (a table and JSON).

Every scenario runs its variants round-robin, one timed run each per repetition,
rotating which goes first; round 0 is a discarded warm-up. Ratios are throughput over a
baseline's (1.0 = as fast): "of medians" divides median throughputs, "paired" is the
median of per-round ratios (run back to back), "cpu" divides median process CPU seconds.

A *floor* compares a variant with the slower of several baselines that each do one part
of its work alone (a raw put without a hash, and one SHA-256 pass over the same bytes):
a variant that overlaps the parts perfectly reaches 1.0. Its "of medians" divides the
largest median time of the parts by the variant's median time; "paired" does the same
per round; "cpu" divides the *sum* of the parts' median CPU seconds by the variant's
(the CPU a variant that does both parts, and nothing else, would spend).

On the local disk, :func:`settle` before a timed run lets the write-back of the previous
run finish first (see /work/shared/DESIGN.md, "Measuring on these machines").
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
from pathlib import Path
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


@dataclass(frozen=True)
class Floor:
    """``variant`` against the slowest of ``parts`` (see the module docstring).

    ``target`` is for the wall-time ratio, ``cpu_target`` for the CPU one. With
    ``cores``, the floor is also at least the parts' CPU seconds summed and spread over
    that many cores: what no variant doing all the parts on this machine can beat
    (named "cpu/N" in the ratio).
    """

    variant: str
    parts: tuple[str, ...]
    target: float | None = None
    cpu_target: float | None = None
    cores: int | None = None


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
    floors: list[Floor] = field(default_factory=list)
    settle: bool = False  # os.sync() and wait for the disk before each timed run


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


@contextmanager
def memory_or_moto_store(kind: str, bucket_prefix: str) -> Iterator[ObjectStore]:
    """A MemoryStore (``kind`` "memory"), or a fresh bucket named after ``bucket_prefix``
    on a moto server started for it (``kind`` "s3"; needs ``tests/`` on ``sys.path``)."""
    if kind == "memory":
        yield MemoryStore()
        return
    import importlib

    from obstore.store import S3Store

    servers: Any = importlib.import_module("support.servers")
    with servers.S3Server() as server:
        bucket = servers.unique_name(bucket_prefix)
        server.create_bucket(bucket)
        yield S3Store(bucket, **servers.s3_store_options(server))


SHM = "/dev/shm"
"""tmpfs: where the disk's write-back cannot hide CPU costs (hashing, copies, per-call work)."""


@contextmanager
def shm_store() -> Iterator[ObjectStore]:
    """A LocalStore in a fresh directory on tmpfs, removed on exit."""
    root = tempfile.mkdtemp(prefix="cairn-bench-", dir=SHM)
    try:
        yield LocalStore(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


STORES: dict[str, StoreFactory] = {"local": local_store, "memory": memory_store}
if os.path.isdir(SHM):
    STORES["tmpfs"] = shm_store


def dirty_mib() -> float:
    """Dirty and under-writeback page cache, in MiB (/proc/meminfo); 0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
    except OSError:
        return 0.0
    return sum(int(fields.get(k, "0 kB").split()[0]) for k in ("Dirty", "Writeback")) / 1024


REPORTED_KIB = Path("/sys/module/page_reporting/parameters/reported_kib")


def reported_mib() -> float | None:
    """Free memory this virtual machine has handed back to its host so far, in MiB (the
    kernel's free page reporting, ``virtio_balloon``); None where it is not reported.

    Memory handed back costs a fault on the host when the guest touches it again: a run
    that writes 1 GiB into pages just reported pays for it, one that reuses pages still
    backed does not."""
    try:
        return int(REPORTED_KIB.read_text()) / 1024
    except (OSError, ValueError):
        return None


def settle(pause: float = 0.5, timeout: float = 60.0) -> None:
    """``os.sync()``, then wait until the page cache holds under 32 MiB to write, and pause.

    Other processes on a shared machine write too: after ``timeout`` seconds, go on.
    """
    os.sync()
    deadline = time.monotonic() + timeout
    while dirty_mib() > 32 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(pause)


def sha256_hex(data: Buffer) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_path(i: int) -> str:
    """Same depth as cairn's layout, so a LocalStore creates as many directories."""
    return f"ckpt/operators/op/partition-{i}.snap"


def fsync_upwards(root: Path, path: str) -> None:
    """fsync the file at ``path`` below ``root``, then each directory up to ``root``: what
    cairn's local store does after every put, so that the put survives a power cut."""
    directories = [root / parent for parent in Path(path).parents]  # parent first, root last
    for synced in [root / path, *directories]:
        fd = os.open(synced, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
                if sc.settle:
                    await asyncio.to_thread(settle)
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
        ratios.extend(floor_ratio(sc, floor) for floor in sc.floors)
    return {
        "reps": reps,
        "python": sys.version.split()[0],
        "obstore": obstore.__version__,
        "cpus": os.cpu_count(),
        "results": results,
        "ratios": ratios,
    }


def floor_ratio(sc: Scenario, floor: Floor) -> dict[str, Any]:
    """A :class:`Floor`'s ratios, in the shape of :func:`report`'s ratios."""
    num, parts, target, cpu_target = floor.variant, floor.parts, floor.target, floor.cpu_target
    cpu_parts = sum(statistics.median(sc.cpu[p]) for p in parts)
    spread = cpu_parts / floor.cores if floor.cores else 0.0
    slowest = max(spread, *(statistics.median(sc.times[p]) for p in parts))
    value = slowest / statistics.median(sc.times[num])
    rounds = zip(sc.times[num], *(sc.times[p] for p in parts), strict=True)
    paired = statistics.median(max(spread, *others) / own for own, *others in rounds)
    cpu = cpu_parts / statistics.median(sc.cpu[num])
    names = [*parts, f"cpu/{floor.cores}"] if floor.cores else parts
    return {
        "scenario": sc.name,
        "store": sc.store,
        "ratio": f"{num} / floor(max {', '.join(names)})",
        "value": value,
        "paired_median": paired,
        "cpu_ratio": cpu,
        "target": target,
        "ok": None if target is None else value >= target,
        "cpu_target": cpu_target,
        "cpu_ok": None if cpu_target is None else cpu >= cpu_target,
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
                    _targets(r),
                    " ".join(_OK[r[key]] for key in ("ok", "cpu_ok") if r.get(key) is not None),
                ]
                for r in out["ratios"]
            ],
        )
    )


_OK = {True: "yes", False: "MISSED"}


def _targets(ratio: dict[str, Any]) -> str:
    wall = "" if ratio["target"] is None else f">= {ratio['target']}"
    cpu = ratio.get("cpu_target")
    return wall if cpu is None else f"{wall or '-'}, cpu >= {cpu:.2f}"


def emit_json(out: dict[str, Any], path: str | None) -> None:
    """Print the report as JSON, and also write it to ``path`` when one is given."""
    text = json.dumps(out, indent=2)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)
