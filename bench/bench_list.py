"""list_checkpoints over 1,000 committed checkpoints: cairn against the same calls by hand.

    python bench/bench_list.py [--quick] [--json out.json] [--reps N] [--checkpoints 1000]

Commits ``--checkpoints`` checkpoints of 5 artifacts (1 KiB each) with cairn's ``save``
to a MemoryStore (untimed), then measures ``list_checkpoints()`` against the raw obstore
baseline doing the same work by hand: one ``list_with_delimiter_async`` of the base
prefix, then one ``head_async`` per listed directory's ``manifest.json`` at concurrency 8
(cairn's default ``max_concurrent_downloads``), keeping the directories whose manifest
exists, sorted. cairn additionally parses each directory name as a CheckpointId and
goes through its retrying, error-translating store wrapper.

Measured as in bench_save.py (its ``measure`` and ``report``): one event loop,
interleaved rounds rotating which variant goes first, round 0 a discarded warm-up,
medians, paired ratios and CPU seconds. Throughput is in checkpoints listed per second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import obstore
from obstore.store import MemoryStore, ObjectStore

from cairn import CheckpointData, ObjectStoreCheckpointer

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_list.py``
    sys.path.insert(0, str(REPO))

from bench.harness import (  # noqa: E402
    Scenario,
    bounded,
    emit_json,
    fixed,
    measure,
    print_report,
    report,
)

ARTIFACTS = 5
CONCURRENCY = 8


async def raw_list(store: ObjectStore, base: str) -> list[str]:
    """The committed checkpoint directories under ``base``, with raw obstore calls."""
    listing = await obstore.list_with_delimiter_async(store, base or None)
    dirs = sorted(p.rstrip("/") for p in listing["common_prefixes"])

    async def committed(i: int) -> bool:
        try:
            await obstore.head_async(store, f"{dirs[i]}/manifest.json")
        except FileNotFoundError:
            return False
        return True

    found = await bounded(CONCURRENCY, len(dirs), committed)
    return [d for d, ok in zip(dirs, found, strict=True) if ok]


async def populate(ckpt: ObjectStoreCheckpointer, count: int) -> None:
    payloads = [os.urandom(1024) for _ in range(ARTIFACTS)]
    for epoch in range(count):
        snapshots = {("op", p): payloads[p] for p in range(ARTIFACTS)}
        await ckpt.save(CheckpointData(epoch=epoch, snapshots=snapshots))


async def run_all(reps: int, count: int) -> list[Scenario]:
    store = MemoryStore()
    ckpt = ObjectStoreCheckpointer(store, max_concurrent_downloads=CONCURRENCY)
    began = time.perf_counter()
    print(f"committing {count} checkpoints...", file=sys.stderr, flush=True)
    await populate(ckpt, count)
    print(f"  took {time.perf_counter() - began:.1f}s", file=sys.stderr, flush=True)
    base = ckpt.paths.base_prefix
    ids, dirs = await ckpt.list_checkpoints(), await raw_list(store, base)
    if [f"{base}{cid}" for cid in ids] != dirs or len(ids) != count:
        raise RuntimeError(f"cairn listed {len(ids)}, raw {len(dirs)}, expected {count}")
    sc = Scenario(
        name=f"list {count} checkpoints x{ARTIFACTS} c={CONCURRENCY}",
        store="memory",
        amount=count,
        unit="ckpt",
        variants={
            "cairn": fixed(ckpt.list_checkpoints),
            "list+head": fixed(lambda: raw_list(store, base)),
        },
        ratios=[("cairn", "list+head", None)],
    )
    print(f"running {sc.name}...", file=sys.stderr, flush=True)
    await measure(sc, reps)
    return [sc]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 repetitions instead of 15")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 15, 5 with --quick)")
    parser.add_argument("--checkpoints", type=int, default=1000, help="default 1000")
    args = parser.parse_args()
    reps = args.reps or (5 if args.quick else 15)
    out = report(asyncio.run(run_all(reps, args.checkpoints)), reps)
    out["checkpoints"] = args.checkpoints
    out["artifacts_per_checkpoint"] = ARTIFACTS
    print_report(out)
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
