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
import functools
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
)
from pathlib import Path

import obstore
from obstore.store import LocalStore

from cairn import CheckpointData, CheckpointId, ObjectStoreCheckpointer

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_save.py``
    sys.path.insert(0, str(REPO))

from bench.harness import (  # noqa: E402
    STORES,
    Floor,
    MiB,
    Run,
    Scenario,
    StoreFactory,
    Variant,
    artifact_path,
    bounded,
    emit_json,
    fixed,
    fsync_upwards,
    measure,
    print_report,
    report,
    sha256_hex,
)

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer


# -- stores and helpers ------------------------------------------------------------------


# -- variants ------------------------------------------------------------------------------


def cairn_save(factory: StoreFactory, parts: Sequence[bytes], limit: int) -> Variant:
    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        with factory() as store:
            ckpt = ObjectStoreCheckpointer(store, max_concurrent_uploads=limit)
            uploads = [("op", i, False, data) for i, data in enumerate(parts)]
            yield lambda: ckpt.save_partitions_concurrent(CheckpointId.now(), uploads)

    return variant


def raw_save(
    factory: StoreFactory, parts: Sequence[bytes], limit: int, sha: bool, fsync: bool = False
) -> Variant:
    """Raw obstore puts of ``parts``; with ``sha`` each hashed in a thread meanwhile, with
    ``fsync`` (a local store) each then fsynced with its directories, as cairn does."""

    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        with factory() as store:

            async def put(i: int) -> None:
                upload = obstore.put_async(store, artifact_path(i), parts[i])
                if sha:
                    await asyncio.gather(asyncio.to_thread(sha256_hex, parts[i]), upload)
                else:
                    await upload
                if fsync:
                    assert isinstance(store, LocalStore), store
                    assert store.prefix is not None, store
                    await asyncio.to_thread(fsync_upwards, store.prefix, artifact_path(i))

            yield lambda: bounded(limit, len(parts), put)

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


def hash_all(parts: Sequence[bytes], threads: int) -> Run:
    """SHA-256 of every part on ``threads`` threads: the hashing a save must do, alone."""
    return lambda: bounded(threads, len(parts), lambda i: asyncio.to_thread(sha256_hex, parts[i]))


@asynccontextmanager
async def floor_scenario(kind: str, parts: Sequence[bytes]) -> AsyncIterator[Scenario]:
    """A save of ``parts`` against its floor: the slower of the puts and the hashes, alone."""
    factory = STORES[kind]
    yield Scenario(
        name=f"save {len(parts)}x{len(parts[0]) // MiB}MiB c=8 floor",
        store=kind,
        amount=sum(map(len, parts)) / MiB,
        unit="MiB",
        variants={
            "cairn": cairn_save(factory, parts, 8),
            "put": raw_save(factory, parts, 8, sha=False),
            "put+fsync": raw_save(factory, parts, 8, sha=False, fsync=True),
            "sha x2": fixed(hash_all(parts, 2)),
        },
        ratios=[("cairn", "put", None), ("cairn", "put+fsync", None)],
        floors=[
            Floor("cairn", ("put", "sha x2"), 0.9, cpu_target=1 / 1.2),
            Floor("cairn", ("put+fsync", "sha x2"), 0.9),
            Floor("cairn", ("put", "sha x2"), None, cores=os.cpu_count()),
            Floor("cairn", ("put+fsync", "sha x2"), None, cores=os.cpu_count()),
        ],
        settle=kind == "local",
    )


@asynccontextmanager
async def partitions_scenario(kind: str, parts: Sequence[bytes]) -> AsyncIterator[Scenario]:
    """Many small partitions both ways: cairn's save and load against raw puts and gets of
    the same objects at the same concurrency (8, cairn's default both ways)."""
    factory = STORES[kind]
    with factory() as loaded:
        ckpt = ObjectStoreCheckpointer(loaded)
        data = CheckpointData(epoch=0, snapshots={("op", i): b for i, b in enumerate(parts)})
        manifest = await ckpt.save(data)
        paths = [ckpt.paths.resolve(data.id, e.path) for _, e in manifest.partition_entries()]

        async def raw_get(i: int) -> Buffer:
            result = await obstore.get_async(loaded, paths[i])
            return await result.bytes_async()

        yield Scenario(
            name=f"partitions {len(parts)}x{len(parts[0])}B c=8",
            store=kind,
            amount=len(parts),
            unit="obj",
            variants={
                "cairn save": cairn_save(factory, parts, 8),
                "put": raw_save(factory, parts, 8, sha=False),
                "cairn load": fixed(lambda: ckpt.load(data.id)),
                "get": fixed(lambda: bounded(8, len(paths), raw_get)),
            },
            ratios=[
                ("cairn save", "put", 0.7),
                ("cairn load", "get", 0.7),
                ("cairn load", "cairn save", 1.0),
            ],
        )


@asynccontextmanager
async def durable_scenario(kind: str, parts: Sequence[bytes]) -> AsyncIterator[Scenario]:
    """Small partitions on a local directory: what a durable put costs. cairn's local store
    fsyncs each put's file and directories; obstore's does not ("put"); "put+fsync" does
    the same fsyncs after each raw put."""
    factory = STORES[kind]
    yield Scenario(
        name=f"durable {len(parts)}x{len(parts[0])}B c=8",
        store=kind,
        amount=len(parts),
        unit="obj",
        variants={
            "cairn save": cairn_save(factory, parts, 8),
            "put": raw_save(factory, parts, 8, sha=False),
            "put+fsync": raw_save(factory, parts, 8, sha=False, fsync=True),
        },
        ratios=[("cairn save", "put+fsync", None), ("cairn save", "put", None)],
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


async def run_all(reps: int, only: str) -> list[Scenario]:
    big = [os.urandom(8 * MiB) for _ in range(64)]
    small = [os.urandom(1024) for _ in range(10_000)]
    tiny = [os.urandom(16) for _ in range(20_000)]
    # (the scenario's "name store", as --only matches it; its builder): a scenario left
    # out is not built, so its setup (a checkpoint saved to load from) does not run either.
    builders: list[tuple[str, Callable[[], AbstractAsyncContextManager[Scenario]]]] = [
        *(
            (f"save 64x8MiB c=8 floor {kind}", functools.partial(floor_scenario, kind, big))
            for kind in ("local", "tmpfs")
            if kind in STORES
        ),
        *((f"save 64x8MiB c=8 {k}", functools.partial(save_scenario, k, big)) for k in STORES),
        *((f"load 64x8MiB c=8 {k}", functools.partial(load_scenario, k, big)) for k in STORES),
        ("small 10000x1KiB memory", functools.partial(small_scenario, "memory", small)),
        ("partitions 20000x16B c=8 memory", functools.partial(partitions_scenario, "memory", tiny)),
        ("durable 2000x16B c=8 local", functools.partial(durable_scenario, "local", tiny[:2000])),
    ]
    done = []
    for label, build in builders:
        if only not in label:
            continue
        async with build() as sc:
            assert f"{sc.name} {sc.store}" == label, (sc.name, sc.store, label)
            print(f"running {sc.name} on {sc.store}...", file=sys.stderr, flush=True)
            await measure(sc, reps)
        done.append(sc)
    return done


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
