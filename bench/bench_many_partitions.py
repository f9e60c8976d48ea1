"""Streaming state of many small partitions: one save, a load of all, a load of one.

    python bench/bench_many_partitions.py [--quick] [--partitions 100000] [--size 1024]
                                          [--stores memory,s3] [--baseline-stores memory]
                                          [--reps 1] [--json out.json]

One ``ObjectStoreCheckpointer.save`` of ``--partitions`` partitions of one operator, each
``--size`` bytes (default 100,000 x 1 KiB: the keyed state of a stream processor spread
over many key groups), then ``load`` of the whole checkpoint (every partition checked
against what was saved) and ``load_chain`` of one partition (the middle one, checked).
``--partitions`` scales it down (``--quick``: 10,000, memory only).

Three layouts: ``packs``, what ``save`` writes (small partitions merged into pack objects
of up to 64 MiB, each partition a byte range of one, and a manifest of more than 4,096
entries stored as a small root and parts of about 4,096 entries each); ``one-manifest``,
the same packs with the manifest stored whole (the layout before manifest parts, made by
raising ``cairn.format.manifest.PART_ENTRIES`` for the run); and ``whole``: the same partitions
saved with ``save_partitions_concurrent`` then committed, one object per partition (the
layout before packs). The ``whole`` baseline costs a request per partition, so it runs
only on ``--baseline-stores`` (default: memory; ``""`` for none).

Stores: a MemoryStore, and moto's S3 server on a loopback port
(``tests/support/servers.py``); every store call is counted by wrapping the store in the
tests' ``RecordingStore`` (``tests/support/recording.py``): one request per call.

Reported per store: wall seconds of each step (median over ``--reps`` saves, each into a
fresh prefix), the objects in the checkpoint's directory, the requests of each step by
kind, and the bytes of the manifest (its root) and of its parts; against the target the
layout must meet: <= 64 objects per checkpoint, whatever the number of partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import obstore
from obstore.store import ObjectStore

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_many_partitions.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers, support.recording

from bench.harness import MiB, emit_json, memory_or_moto_store, table  # noqa: E402
from cairn import CheckpointData, CheckpointId, ObjectStoreCheckpointer  # noqa: E402
from cairn.format import manifest as manifest_module  # noqa: E402
from cairn.format.layout import CheckpointPaths  # noqa: E402
from cairn.protocol._save import assemble_manifest  # noqa: E402
from cairn.stores import as_store  # noqa: E402

recording: Any = importlib.import_module("support.recording")

OPERATOR = "window-agg"
TARGET_OBJECTS = 64


def payload(partition: int, size: int) -> bytes:
    """Partition ``partition``'s state: its number, then filler (distinct per partition)."""
    head = partition.to_bytes(8, "little")
    return (head * (size // 8 + 1))[:size]


async def one_run(
    raw: ObjectStore, prefix: str, partitions: int, size: int, layout: str
) -> dict[str, Any]:
    """Save (as ``layout`` says), load all, load one; times, requests per step, objects
    and manifest bytes."""
    snapshots = {(OPERATOR, p): payload(p, size) for p in range(partitions)}
    out: dict[str, Any] = {}
    store = recording.RecordingStore(as_store(raw))
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(prefix))
    start = time.perf_counter()
    if layout in ("packs", "one-manifest"):
        manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
    else:  # one object per partition, no packs
        cid = CheckpointId.now()
        uploads = [(op, p, False, data) for (op, p), data in snapshots.items()]
        entries = await ckpt.save_partitions_concurrent(cid, uploads)
        manifest = await ckpt.commit(assemble_manifest(cid, 1, entries))
    out["save_s"] = time.perf_counter() - start
    out["save_requests"] = dict(store.ops)
    cid = manifest.checkpoint_id

    store = recording.RecordingStore(as_store(raw))
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(prefix))
    start = time.perf_counter()
    loaded = await ckpt.load(cid)
    out["load_all_s"] = time.perf_counter() - start
    out["load_all_requests"] = dict(store.ops)
    if len(loaded.artifacts) != partitions or any(
        bytes(loaded.artifacts[key]) != data for key, data in snapshots.items()
    ):
        raise AssertionError("load returned other partitions than were saved")
    del loaded

    store = recording.RecordingStore(as_store(raw))
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(prefix))
    middle = partitions // 2
    start = time.perf_counter()
    chain = await ckpt.load_chain(cid, OPERATOR, middle)
    out["load_one_s"] = time.perf_counter() - start
    out["load_one_requests"] = dict(store.ops)
    if bytes(chain[-1].data) != snapshots[(OPERATOR, middle)]:
        raise AssertionError(f"partition {middle} loaded other bytes")

    paths = CheckpointPaths(prefix)
    directory, root = paths.checkpoint_dir(cid), paths.manifest(cid)
    objects, manifest_bytes, parts, part_bytes = 0, 0, 0, 0
    for chunk in obstore.list(raw, directory, chunk_size=1000):
        for meta in chunk:
            objects += 1
            if meta["path"] == root:
                manifest_bytes = meta["size"]
            elif paths.is_manifest_part(meta["path"].removeprefix(directory)):
                parts, part_bytes = parts + 1, part_bytes + meta["size"]
    out["objects"], out["manifest_bytes"] = objects, manifest_bytes
    out["parts"], out["part_bytes"] = parts, part_bytes
    return out


def run_layout(
    raw: ObjectStore, prefix: str, partitions: int, size: int, layout: str
) -> dict[str, Any]:
    """:func:`one_run` of ``layout``; ``one-manifest`` with manifests never split."""
    split_above = manifest_module.PART_ENTRIES
    if layout == "one-manifest":
        manifest_module.PART_ENTRIES = 2**62
    try:
        return asyncio.run(one_run(raw, prefix, partitions, size, layout))
    finally:
        manifest_module.PART_ENTRIES = split_above


def requests(ops: dict[str, int]) -> str:
    """``{"put": 3, "get": 1}`` -> ``"put 3, get 1"`` (total first)."""
    total = sum(ops.values())
    return f"{total:,} (" + ", ".join(f"{k} {v:,}" for k, v in sorted(ops.items())) + ")"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--partitions",
        type=int,
        default=100_000,
        help="partitions to save (default 100,000; scale down here)",
    )
    parser.add_argument("--size", type=int, default=1024, help="bytes per partition (1 KiB)")
    parser.add_argument("--stores", default="memory,s3", help="memory and/or s3 (moto)")
    parser.add_argument(
        "--baseline-stores",
        default="memory",
        help="stores that also run the one-object-per-partition baseline ('' for none)",
    )
    parser.add_argument("--reps", type=int, default=1, help="saves per store (median times)")
    parser.add_argument("--quick", action="store_true", help="10,000 partitions, memory")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    args = parser.parse_args()
    partitions = 10_000 if args.quick else args.partitions
    stores = ["memory"] if args.quick else [s.strip() for s in args.stores.split(",")]
    baseline = {s.strip() for s in args.baseline_stores.split(",") if s.strip()}
    if (set(stores) | baseline) - {"memory", "s3"}:
        parser.error(f"unknown store(s) in {stores}, {sorted(baseline)}: choose memory, s3")
    if partitions < 1 or args.size < 8 or args.reps < 1:
        parser.error("--partitions and --reps must be >= 1, --size >= 8")
    rows: list[dict[str, Any]] = []
    for kind in stores:
        layouts = ["packs", "one-manifest"] + (["whole"] if kind in baseline else [])
        with memory_or_moto_store(kind, "cairn-bench-partitions") as raw:
            for layout in layouts:
                runs = []
                for rep in range(args.reps):
                    began = time.perf_counter()
                    prefix = f"{layout}-{rep}/"
                    runs.append(run_layout(raw, prefix, partitions, args.size, layout))
                    print(
                        f"{kind}, {layout}, save {rep + 1}/{args.reps}: "
                        f"{time.perf_counter() - began:.1f}s",
                        file=sys.stderr,
                        flush=True,
                    )
                first = runs[0]
                row = {
                    "store": kind,
                    "layout": layout,
                    "partitions": partitions,
                    "size": args.size,
                    "reps": args.reps,
                }
                row.update({k: v for k, v in first.items() if not k.endswith("_s")})
                for key in ("save_s", "load_all_s", "load_one_s"):
                    row[f"median_{key}"] = statistics.median(r[key] for r in runs)
                    row[key] = [r[key] for r in runs]
                # The target is the layout save writes; the baseline is there to compare.
                row["ok"] = first["objects"] <= TARGET_OBJECTS or layout != "packs"
                rows.append(row)
    headers = [
        "store",
        "layout",
        "partitions",
        "objects",
        "manifest MiB",
        "parts (MiB)",
        "save s",
        "load all s",
        "load one s",
        f"objects <= {TARGET_OBJECTS}",
    ]
    print(
        table(
            headers,
            [
                [
                    r["store"],
                    r["layout"],
                    f"{r['partitions']:,}",
                    f"{r['objects']:,}",
                    f"{r['manifest_bytes'] / MiB:.3f}",
                    f"{r['parts']} ({r['part_bytes'] / MiB:.1f})" if r["parts"] else "-",
                    f"{r['median_save_s']:.2f}",
                    f"{r['median_load_all_s']:.2f}",
                    f"{r['median_load_one_s']:.3f}",
                    ("yes" if r["ok"] else "MISSED") if r["layout"] == "packs" else "-",
                ]
                for r in rows
            ],
        )
    )
    print()
    print(
        table(
            ["store", "layout", "save requests", "load-all requests", "load-one requests"],
            [
                [
                    r["store"],
                    r["layout"],
                    requests(r["save_requests"]),
                    requests(r["load_all_requests"]),
                    requests(r["load_one_requests"]),
                ]
                for r in rows
            ],
        )
    )
    emit_json({"rows": rows}, args.json)


if __name__ == "__main__":
    main()
