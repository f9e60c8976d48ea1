"""Incremental RocksDB checkpoints: a directory partition uploads only the new files.

    python bench/bench_rocksdb.py [--quick] [--mib 256] [--stores local,s3] [--reps 3]
                                  [--pattern range|random] [--json out.json]

Per store, in a fresh work directory: a RocksDB database (rocksdict, raw mode) of
``--mib`` MiB of random, incompressible 4 KiB values under sorted keys, compacted into
SST files of about ``--mib``/32 MiB (at least 1 MiB: a compaction then rewrites only
the files whose key range changed), is checkpointed with
``rocksdict.Checkpoint(db).create_checkpoint(dir)`` and that directory saved as a cairn
directory partition (the base, untimed). Then per round: 1 % of the keys get new random
values (``range``: the next 1 % of the key space, as a time-ordered workload writes;
``random``: keys drawn anywhere, which makes every compaction rewrite most files),
``db.flush()``, the background compactions are waited for, a new RocksDB checkpoint is
made, and that directory is saved twice, in alternating order: **incremental** (parent:
the previous round's incremental checkpoint, so the chain grows as a job's does) and
**full** (no parent). The full checkpoint is deleted after its round (untimed).

What RocksDB changed is counted from the two checkpoint directories, the parent's and
this one: a file is **new** when its relative path is not in the parent's checkpoint or
its size differs (new SST files, the grown MANIFEST, a fresh WAL). RocksDB's checkpoint
hard-links SST and OPTIONS files, so an unchanged one keeps its inode and its mtime;
``CURRENT``, ``MANIFEST-*`` and ``rocksdict-config.json`` are written afresh each time, so
one of those with an unchanged size still has a new mtime, and cairn, which carries a file
only when path, size and mtime (ns) are all equal, uploads it again: those are counted
apart ("same size, new mtime"), and "new + mtime" is what cairn's rule must upload. The
bytes cairn did upload are read from ``manifest.stats`` (and checked against that sum).

Reported per store, medians over ``--reps`` rounds after one discarded warm-up round:
the new files' bytes (SST and other), the incremental save's uploaded bytes and files
(uploaded / carried), the full save's uploaded bytes, the wall time of each save, the
incremental / full ratios of time and bytes, and uploaded / new bytes against the target
**uploaded bytes <= 1.2 x new files' bytes**. Stores: ``memory``, ``local`` (cairn's
own local store, fsyncing, in a temporary directory; ``harness.settle`` before each
timed save) and ``s3`` (moto's server on a loopback port, ``tests/support/servers.py``).
``--quick``: 16 MiB, memory and local, 1 round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import rocksdict

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_rocksdb.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers

from bench.harness import MiB, memory_or_moto_store, settle, table  # noqa: E402
from cairn import CheckpointData, CheckpointPaths, ObjectStoreCheckpointer  # noqa: E402
from cairn.format.ids import CheckpointId  # noqa: E402
from cairn.format.manifest import CheckpointManifest  # noqa: E402
from cairn.stores import Store  # noqa: E402

KEY = ("rocksdb", 0)
VALUE_BYTES = 4096
REWRITE = 0.01
TARGET = 1.2  # uploaded bytes <= TARGET x new files' bytes
Listing = dict[str, tuple[int, int]]
"""A directory's regular files: relative path -> (size, mtime ns)."""


def options(sst_bytes: int) -> rocksdict.Options:
    """Raw keys and values; SST files of about ``sst_bytes``, memtables no larger."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_target_file_size_base(sst_bytes)
    opts.set_write_buffer_size(sst_bytes)
    return opts


def db_key(i: int) -> bytes:
    return b"key/%010d" % i


def wait_for_background(db: rocksdict.Rdict, timeout: float = 120.0) -> None:
    """Until no flush or compaction runs or is pending (so each round checkpoints a
    settled database), or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    busy = (
        "rocksdb.num-running-compactions",
        "rocksdb.compaction-pending",
        "rocksdb.num-running-flushes",
        "rocksdb.mem-table-flush-pending",
    )
    while time.monotonic() < deadline:
        if not any(db.property_int_value(name) for name in busy):
            return
        time.sleep(0.02)


def build(path: Path, keys: int, sst_bytes: int) -> rocksdict.Rdict:
    """The database: ``keys`` random values, flushed and compacted to the bottom level."""
    db = rocksdict.Rdict(str(path), options(sst_bytes))
    for i in range(keys):
        db.put(db_key(i), os.urandom(VALUE_BYTES))
    db.flush()
    compact = rocksdict.CompactOptions()
    compact.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force())
    db.compact_range(None, None, compact)
    wait_for_background(db)
    return db


def rewrite(db: rocksdict.Rdict, keys: int, rnd: int, pattern: str) -> None:
    """Give 1 % of the keys new random values (round ``rnd``'s share), then flush."""
    count = max(1, int(keys * REWRITE))
    if pattern == "range":
        start = (rnd * count) % keys
        chosen: list[int] = [(start + i) % keys for i in range(count)]
    else:
        chosen = random.Random(rnd).sample(range(keys), count)
    for i in chosen:
        db.put(db_key(i), os.urandom(VALUE_BYTES))
    db.flush()
    wait_for_background(db)


def listing(root: Path) -> Listing:
    found: Listing = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            info = path.lstat()
            found[path.relative_to(root).as_posix()] = (info.st_size, info.st_mtime_ns)
    return found


def changes(parent: Listing, current: Listing) -> dict[str, int]:
    """What RocksDB changed between two checkpoint directories, in bytes and files."""
    new_sst = new_other = restamped = new_files = restamped_files = 0
    for path, (size, mtime) in current.items():
        before = parent.get(path)
        if before is None or before[0] != size:
            new_files += 1
            if path.endswith(".sst"):
                new_sst += size
            else:
                new_other += size
        elif before[1] != mtime:
            restamped += size
            restamped_files += 1
    return {
        "new_sst_bytes": new_sst,
        "new_other_bytes": new_other,
        "new_bytes": new_sst + new_other,
        "new_files": new_files,
        "same_size_new_mtime_bytes": restamped,
        "same_size_new_mtime_files": restamped_files,
        "rule_bytes": new_sst + new_other + restamped,
        "files": len(current),
        "bytes": sum(size for size, _ in current.values()),
    }


@contextmanager
def opened(kind: str) -> Iterator[Store | str]:
    """What an ObjectStoreCheckpointer is given for store ``kind``: a local directory's
    path (cairn's own fsyncing store), a MemoryStore, or a bucket on a moto server."""
    if kind == "local":
        root = tempfile.mkdtemp(prefix="cairn-bench-rocksdb-store-")
        try:
            yield root
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    from cairn.stores import as_store

    with memory_or_moto_store(kind, "cairn-bench-rocksdb") as raw:
        yield as_store(raw)


async def timed_save(
    ckpt: ObjectStoreCheckpointer, data: CheckpointData, calm: bool
) -> tuple[float, CheckpointManifest]:
    if calm:
        await asyncio.to_thread(settle)
    began = time.perf_counter()
    manifest = await ckpt.save(data)
    return time.perf_counter() - began, manifest


def stats_of(manifest: CheckpointManifest, seconds: float) -> dict[str, Any]:
    stats = manifest.stats
    assert stats is not None
    return {
        "s": seconds,
        "uploaded_bytes": stats.uploaded_bytes,
        "uploaded_files": stats.uploaded_artifacts,
        "carried_bytes": stats.carried_bytes,
        "carried_files": stats.carried_artifacts,
    }


async def run_store(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    keys = max(100, args.mib * MiB // VALUE_BYTES)
    sst_bytes = max(MiB, args.mib * MiB // 32)
    rounds: list[dict[str, Any]] = []
    with opened(kind) as store, tempfile.TemporaryDirectory(prefix="cairn-bench-rocksdb-") as work:
        workdir = Path(work)
        ckpt = ObjectStoreCheckpointer(store, CheckpointPaths("bench/"))
        began = time.perf_counter()
        db = build(workdir / "db", keys, sst_bytes)
        try:
            previous = workdir / "checkpoint-0"
            rocksdict.Checkpoint(db).create_checkpoint(str(previous))
            base = await ckpt.save(CheckpointData(epoch=0, directories={KEY: previous}))
            parent: CheckpointId = base.checkpoint_id
            print(
                f"{kind}: {args.mib} MiB database and its base saved in "
                f"{time.perf_counter() - began:.1f}s",
                file=sys.stderr,
                flush=True,
            )
            for rnd in range(1, args.reps + 2):  # round 1 is the warm-up
                rewrite(db, keys, rnd, args.pattern)
                current = workdir / f"checkpoint-{rnd}"
                made = time.perf_counter()
                rocksdict.Checkpoint(db).create_checkpoint(str(current))
                made = time.perf_counter() - made
                row: dict[str, Any] = dict(changes(listing(previous), listing(current)))
                row["rocksdb_checkpoint_s"] = made
                calm = kind == "local"
                incremental = CheckpointData(
                    epoch=rnd, directories={KEY: current}, parent_id=parent
                )
                full = CheckpointData(epoch=rnd, directories={KEY: current})
                if rnd % 2:
                    inc_s, inc = await timed_save(ckpt, incremental, calm)
                    full_s, whole = await timed_save(ckpt, full, calm)
                else:
                    full_s, whole = await timed_save(ckpt, full, calm)
                    inc_s, inc = await timed_save(ckpt, incremental, calm)
                row["incremental"] = stats_of(inc, inc_s)
                row["full"] = stats_of(whole, full_s)
                await ckpt.delete_checkpoint(whole.checkpoint_id)
                shutil.rmtree(previous)
                previous, parent = current, inc.checkpoint_id
                if rnd > 1:
                    rounds.append(row)
                print(
                    f"{kind}: round {rnd}/{args.reps + 1}"
                    f"{' (warm-up)' if rnd == 1 else ''}: incremental {inc_s:.2f}s, "
                    f"full {full_s:.2f}s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            db.close()
        await ckpt.close()
    return summarize(kind, rounds)


def summarize(kind: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(pick: Any) -> float:
        return float(statistics.median(pick(r) for r in rounds))

    uploaded = med(lambda r: r["incremental"]["uploaded_bytes"])
    new = med(lambda r: r["new_bytes"])
    per_round_ok = [r["incremental"]["uploaded_bytes"] <= TARGET * r["new_bytes"] for r in rounds]
    return {
        "store": kind,
        "rounds": rounds,
        "db_bytes": med(lambda r: r["bytes"]),
        "db_files": med(lambda r: r["files"]),
        "new_sst_bytes": med(lambda r: r["new_sst_bytes"]),
        "new_other_bytes": med(lambda r: r["new_other_bytes"]),
        "new_bytes": new,
        "same_size_new_mtime_bytes": med(lambda r: r["same_size_new_mtime_bytes"]),
        "incremental_uploaded_bytes": uploaded,
        "incremental_uploaded_files": med(lambda r: r["incremental"]["uploaded_files"]),
        "incremental_carried_files": med(lambda r: r["incremental"]["carried_files"]),
        "full_uploaded_bytes": med(lambda r: r["full"]["uploaded_bytes"]),
        "incremental_s": med(lambda r: r["incremental"]["s"]),
        "full_s": med(lambda r: r["full"]["s"]),
        "time_ratio": med(lambda r: r["incremental"]["s"] / r["full"]["s"]),
        "bytes_ratio": med(
            lambda r: r["incremental"]["uploaded_bytes"] / r["full"]["uploaded_bytes"]
        ),
        "uploaded_over_new": uploaded / new if new else float("inf"),
        "as_rule_says": all(r["incremental"]["uploaded_bytes"] == r["rule_bytes"] for r in rounds),
        "ok": all(per_round_ok),
    }


def mib(value: float) -> str:
    return f"{value / MiB:.2f}"


def print_tables(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"RocksDB {args.mib} MiB, {args.pattern} rewrites of 1 % per round, "
        f"{args.reps} round(s) after a warm-up; medians"
    )
    print(
        table(
            [
                "store",
                "db MiB",
                "files",
                "new sst MiB",
                "new other KiB",
                "same size, new mtime KiB",
                "incr. MiB",
                "incr. files up/carried",
                "full MiB",
                "as the rule says",
            ],
            [
                [
                    r["store"],
                    mib(r["db_bytes"]),
                    f"{r['db_files']:.0f}",
                    mib(r["new_sst_bytes"]),
                    f"{r['new_other_bytes'] / 1024:.1f}",
                    f"{r['same_size_new_mtime_bytes'] / 1024:.2f}",
                    mib(r["incremental_uploaded_bytes"]),
                    f"{r['incremental_uploaded_files']:.0f}/{r['incremental_carried_files']:.0f}",
                    mib(r["full_uploaded_bytes"]),
                    "yes" if r["as_rule_says"] else "NO",
                ]
                for r in results
            ],
        )
    )
    print()
    print(
        table(
            [
                "store",
                "incr. s",
                "full s",
                "incr./full time",
                "incr./full bytes",
                "uploaded / new",
                f"target <= {TARGET}",
            ],
            [
                [
                    r["store"],
                    f"{r['incremental_s']:.3f}",
                    f"{r['full_s']:.3f}",
                    f"{r['time_ratio']:.3f}",
                    f"{r['bytes_ratio']:.4f}",
                    f"{r['uploaded_over_new']:.3f}",
                    "yes" if r["ok"] else "MISSED",
                ]
                for r in results
            ],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="database size (default 256)")
    parser.add_argument("--stores", default="local,s3", help="memory, local and/or s3 (moto)")
    parser.add_argument("--reps", type=int, default=3, help="timed rounds (after one warm-up)")
    parser.add_argument("--pattern", choices=["range", "random"], default="range")
    parser.add_argument("--quick", action="store_true", help="16 MiB, memory and local, 1 round")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.mib, args.stores, args.reps = 16, "memory,local", 1
    stores = [s.strip() for s in args.stores.split(",")]
    if set(stores) - {"memory", "local", "s3"}:
        parser.error(f"unknown store(s) in {stores}: choose memory, local, s3")
    if args.mib < 1 or args.reps < 1:
        parser.error("--mib and --reps must be >= 1")
    results = [asyncio.run(run_store(kind, args)) for kind in stores]
    print_tables(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
