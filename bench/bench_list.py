"""list_checkpoints over 1,000 committed checkpoints: cairn against the calls it could make.

    python bench/bench_list.py [--quick] [--json out.json] [--reps N] [--checkpoints 1000]
                               [--artifacts 5] [--s3]

Writes ``--checkpoints`` committed checkpoints of ``--artifacts`` artifacts each (what
cairn's ``save`` leaves: the artifacts and a manifest, written by hand, untimed) to a
MemoryStore, or with ``--s3`` to moto's S3 server on a loopback port, then measures
``list_checkpoints()`` against raw obstore calls:

* "list+head": one ``list_with_delimiter_async`` of the base prefix, then one
  ``head_async`` per listed directory's ``manifest.json`` at concurrency 8 (cairn's
  default ``max_concurrent_downloads``), keeping the directories whose manifest exists;
* "list -r": one recursive listing of the base (every object), keeping the directories
  whose ``manifest.json`` it names: the listing alone decides;
* "list -d": the delimiter listing alone, which cannot tell committed directories from
  others: the floor of any answer that needs it.

cairn chooses between the first two by the size of the newest manifest (see
``cairn.protocol._catalog.list_checkpoints``).

Measured as in bench_save.py (its ``measure`` and ``report``): one event loop,
interleaved rounds rotating which variant goes first, round 0 a discarded warm-up,
medians, paired ratios and CPU seconds. Throughput is in checkpoints listed per second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
from obstore.store import MemoryStore, ObjectStore, S3Store

from cairn import CheckpointId, ObjectStoreCheckpointer
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import (
    CheckpointManifest,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    encode_manifest,
)

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


async def raw_list_recursive(store: ObjectStore, base: str) -> list[str]:
    """The committed checkpoint directories under ``base``, from one recursive listing."""
    found: list[str] = []
    async for chunk in obstore.list(store, base or None, chunk_size=1000):
        found.extend(
            meta["path"].removesuffix("/manifest.json")
            for meta in chunk
            if meta["path"].endswith("/manifest.json") and meta["size"] > 0
        )
    return sorted(found)


async def raw_list_dirs(store: ObjectStore, base: str) -> list[str]:
    """The directories under ``base`` (committed or not): the delimiter listing alone."""
    listing = await obstore.list_with_delimiter_async(store, base or None)
    return sorted(p.rstrip("/") for p in listing["common_prefixes"])


async def populate(store: ObjectStore, paths: CheckpointPaths, count: int, artifacts: int) -> None:
    """``count`` committed checkpoints of ``artifacts`` 1 KiB artifacts, by hand."""
    payload = bytes(1024)
    digest = hashlib.sha256(payload).hexdigest()
    jobs = []
    for epoch in range(count):
        cid = CheckpointId.now()
        entries = [
            PartitionSnapshotEntry(
                partition_id=p,
                is_delta=False,
                path=paths.relative_artifact("op", p, False),
                size_bytes=len(payload),
                sha256=digest,
            )
            for p in range(artifacts)
        ]
        manifest = CheckpointManifest.new(cid, epoch)
        manifest = CheckpointManifest(
            version=manifest.version,
            checkpoint_id=cid,
            epoch=epoch,
            timestamp_ms=manifest.timestamp_ms,
            operators={"op": OperatorSnapshotEntry.from_partitions(entries)},
            total_size_bytes=len(payload) * artifacts,
        )
        jobs += [(paths.snapshot(cid, "op", p), payload) for p in range(artifacts)]
        jobs.append((paths.manifest(cid), encode_manifest(manifest)))
    await bounded(16, len(jobs), lambda i: obstore.put_async(store, *jobs[i]))


@contextlib.contextmanager
def open_store(s3: bool) -> Iterator[tuple[ObjectStore, str]]:
    """A MemoryStore, or a bucket on a fresh moto server: (store, label)."""
    if not s3:
        yield MemoryStore(), "memory"
        return
    sys.path.append(str(REPO / "tests"))  # for support.servers (tests/ is not a package)
    servers: Any = importlib.import_module("support.servers")
    with servers.S3Server() as server:
        bucket = servers.unique_name("cairn-bench-list")
        server.create_bucket(bucket)
        yield S3Store(bucket, **servers.s3_store_options(server)), "s3 (moto)"


async def run_all(reps: int, count: int, artifacts: int, s3: bool) -> list[Scenario]:
    with open_store(s3) as (store, label):
        ckpt = ObjectStoreCheckpointer(store, max_concurrent_downloads=CONCURRENCY)
        began = time.perf_counter()
        print(f"writing {count} checkpoints to {label}...", file=sys.stderr, flush=True)
        await populate(store, ckpt.paths, count, artifacts)
        print(f"  took {time.perf_counter() - began:.1f}s", file=sys.stderr, flush=True)
        base = ckpt.paths.base_prefix
        ids, dirs = await ckpt.list_checkpoints(), await raw_list(store, base)
        if [f"{base}{cid}" for cid in ids] != dirs or len(ids) != count:
            raise RuntimeError(f"cairn listed {len(ids)}, raw {len(dirs)}, expected {count}")
        if await raw_list_recursive(store, base) != dirs:
            raise RuntimeError("the recursive listing disagrees with list+head")
        sc = Scenario(
            name=f"list {count} checkpoints x{artifacts} c={CONCURRENCY}",
            store=label,
            amount=count,
            unit="ckpt",
            variants={
                "cairn": fixed(ckpt.list_checkpoints),
                "list+head": fixed(lambda: raw_list(store, base)),
                "list -r": fixed(lambda: raw_list_recursive(store, base)),
                "list -d": fixed(lambda: raw_list_dirs(store, base)),
            },
            ratios=[
                ("cairn", "list+head", None),
                ("cairn", "list -r", None),
                ("cairn", "list -d", None),
            ],
        )
        print(f"running {sc.name} on {label}...", file=sys.stderr, flush=True)
        await measure(sc, reps)
        return [sc]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 repetitions instead of 15")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 15, 5 with --quick)")
    parser.add_argument("--checkpoints", type=int, default=1000, help="default 1000")
    parser.add_argument("--artifacts", type=int, default=5, help="per checkpoint, default 5")
    parser.add_argument("--s3", action="store_true", help="on moto's S3 server, not in memory")
    args = parser.parse_args()
    reps = args.reps or (5 if args.quick else 15)
    out = report(asyncio.run(run_all(reps, args.checkpoints, args.artifacts, args.s3)), reps)
    out["checkpoints"] = args.checkpoints
    out["artifacts_per_checkpoint"] = args.artifacts
    print_report(out)
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
