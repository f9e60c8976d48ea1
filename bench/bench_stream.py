"""One 2 GiB artifact from a file: cairn's streamed save and load against their floors, with memory.

    python bench/bench_stream.py [--quick] [--json out.json] [--reps N] [--only save|load]
                                 [--dir /dev/shm] [--size-mib 2048] [--warm N]

Creates a 2 GiB file (a 64 MiB random block, repeated; fsynced, so its write-back does
not land in a timed run) in a temp dir under ``--dir`` (the default temp dir: the local
disk; ``/dev/shm``: tmpfs, where the disk's write-back cannot hide CPU costs), and
measures on a LocalStore in a temp dir beside it:

* save: cairn's ``save_partitions_concurrent(cid, [("op", 0, False, Path(file))])``
  against its floor, the slower of ``obstore.put_async(store, path, Path(file),
  chunk_size=8 MiB, max_concurrency=4)`` without any hash ("put") and one SHA-256 pass
  over the file in 8 MiB reads ("sha"), each alone: a save that hashes on the other core
  while the bytes go out, reading them once, reaches 1.0. Its CPU seconds are compared
  with put's plus sha's (target: at most 1.2 times). cairn's local store fsyncs what it
  puts (the file, then each directory up to the root) and obstore's does not, so the
  floor of a durable save, "put+fsync" (the same put, then those fsyncs) against "sha",
  is reported too: on tmpfs the two floors agree, on a disk the fsync waits for it;
* load: cairn's ``load_artifact_to(path, Path(out), expected_sha256=...)`` (verified,
  fsynced, renamed), with the façade's default ranges ("cairn") and with 1 MiB ranges
  (``cairn.protocol._download.RESTORE_CHUNK``, "cairn 1MiB"), against its floor, the slower of
  8 MiB ranged reads, one ahead, written to a file and fsynced, without a hash
  ("get+fsync"), and one SHA-256 pass over the stored object ("sha").

Each run is a fresh subprocess, so that its peak RSS is its own: the memory reported is
the peak RSS at the end (``VmHWM``) minus the RSS after the imports (``VmRSS``), both from
/proc/self/status. Not ``ru_maxrss``: at fork+exec Linux folds the parent's RSS into the
child's ``ru_maxrss``, which then reads at least the parent's size (each run in the JSON
keeps it, as ``ru_maxrss_kib``). Wall and CPU seconds (all the child's threads) are
measured in the child around the operation alone, not interpreter start-up or store
construction. Before each run the parent calls ``os.sync()`` and waits for the dirty
page cache to drain (:func:`bench.harness.settle`), so no run pays for the previous
one's write-back; outputs are deleted right after each run. With ``--warm N`` each
child first runs its operation N times, untimed, deleting what it wrote: this virtual
machine hands freed memory back to its host (free page reporting), and a run that
writes a GiB into pages just handed back pays a host fault per page, which one run
pays and the next does not, depending only on what ran before it. Each run reports the
memory handed back before and during it. As in bench_save.py, each
round runs every variant once, rotating which goes first; the warm-up is one discarded
run (see ``measure_children``). The source file stays in the page cache (reads are
memory-speed); on the disk, writes go to the page cache and only fsync waits for the
disk, so the load figures there are disk-bound. Temp files are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import obstore
from obstore.store import LocalStore

from cairn import CheckpointId, ObjectStoreCheckpointer
from cairn.stores import PART_SIZE, PARTS_IN_FLIGHT

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_stream.py``
    sys.path.insert(0, str(REPO))

from bench.harness import (  # noqa: E402
    SHM,
    Floor,
    MiB,
    Scenario,
    artifact_path,
    emit_json,
    fsync_upwards,
    print_report,
    report,
    reported_mib,
    settle,
    table,
)

BLOCK = 64 * MiB
CHUNK = 8 * MiB
RSS_TARGET_MIB = 48.0
"""Peak RSS above the post-import baseline that cairn's variants must stay under."""
Spec = dict[str, str]
"""What a child run needs: variant, file, store root, artifact path, digest, output."""
ChildRun = Callable[[], Awaitable[str]]
Prepare = Callable[[str], AbstractContextManager[Spec]]
"""Sets up one run of a variant (untimed), yields its spec, cleans up after it."""


# -- the child: one timed run in a fresh process ------------------------------------------


def proc_status_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, in KiB, from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def sha256_file(path: str) -> str:
    """SHA-256 of a file read in CHUNK-sized pieces."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def write(file: BinaryIO, chunk: Any) -> None:
    file.write(chunk)


async def raw_load(store: LocalStore, path: str, out: Path) -> str:
    """The I/O of load_artifact_to, by hand, without a hash: ranged reads, one ahead,
    each written in a thread, then fsync."""
    size = (await obstore.head_async(store, path))["size"]
    file = await asyncio.to_thread(open, out, "xb")

    def fetch(start: int) -> asyncio.Task[obstore.Bytes] | None:
        if start >= size:
            return None
        end = min(start + CHUNK, size)
        return asyncio.ensure_future(obstore.get_range_async(store, path, start=start, end=end))

    upcoming = fetch(0)
    try:
        for start in range(0, size, CHUNK):
            current, upcoming = upcoming, fetch(start + CHUNK)
            assert current is not None
            await asyncio.to_thread(write, file, await current)
        await asyncio.to_thread(file.flush)
        await asyncio.to_thread(os.fsync, file.fileno())
    finally:
        file.close()
    return ""


def prepare_child(spec: Spec) -> ChildRun:
    """The timed operation of ``spec["variant"]``, its store already built (untimed)."""
    variant, file = spec["variant"], spec["file"]
    store = LocalStore(spec["root"])
    if variant == "save/cairn":
        ckpt = ObjectStoreCheckpointer(store)
        size = os.path.getsize(file)

        async def cairn_save() -> str:
            uploads = [("op", 0, False, Path(file))]
            [(_, entry)] = await ckpt.save_partitions_concurrent(CheckpointId.now(), uploads)
            assert entry.size_bytes == size, entry
            return entry.sha256

        return cairn_save
    if variant in ("save/put", "save/put+fsync"):
        durable = variant == "save/put+fsync"  # then fsynced as cairn's local store does

        async def raw_save() -> str:
            await obstore.put_async(
                store,
                artifact_path(0),
                Path(file),
                chunk_size=PART_SIZE,
                max_concurrency=PARTS_IN_FLIGHT,
            )
            if durable:
                await asyncio.to_thread(fsync_upwards, Path(spec["root"]), artifact_path(0))
            return ""

        return raw_save
    if variant in ("save/sha", "load/sha"):
        # The save hashes the source file; the load, the stored object's bytes.
        hashed = file if variant == "save/sha" else os.path.join(spec["root"], spec["path"])
        return lambda: asyncio.to_thread(sha256_file, hashed)
    out = Path(spec["out"])
    if variant in ("load/cairn", "load/cairn 1MiB"):
        ckpt = ObjectStoreCheckpointer(store)
        # "cairn 1MiB" passes cairn.protocol._download.RESTORE_CHUNK (1 MiB), the restore's own
        # default once the façade uses it instead of READ_CHUNK; "cairn" the default.
        if variant.endswith("1MiB"):
            return lambda: ckpt.load_artifact_to(
                spec["path"], out, expected_sha256=spec["sha"], chunk_size=1 << 20
            )
        return lambda: ckpt.load_artifact_to(spec["path"], out, expected_sha256=spec["sha"])
    if variant == "load/get+fsync":
        return lambda: raw_load(store, spec["path"], out)
    raise ValueError(f"unknown variant {variant!r}")


def clear_outputs(spec: Spec) -> None:
    """Remove what a run of ``spec`` wrote (the save's store, the load's file)."""
    if spec["variant"].startswith("save/"):
        for entry in Path(spec["root"]).iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    elif "out" in spec:
        Path(spec["out"]).unlink(missing_ok=True)


async def child_measure(spec: Spec) -> dict[str, Any]:
    run = prepare_child(spec)
    for _ in range(int(spec.get("warm", "0"))):
        # Untimed: the pages the timed run writes into are then pages this VM already
        # backs (the ones the warm-up freed), not pages its host must fault in again.
        await run()
        clear_outputs(spec)
    wall, cpu = time.perf_counter(), time.process_time()
    digest = await run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_s": wall, "cpu_s": cpu, "sha256": digest}


def child_main(spec_json: str) -> None:
    base = proc_status_kib("VmRSS")  # after every import
    result = asyncio.run(child_measure(json.loads(spec_json)))
    result.update(
        rss_base_kib=base,
        rss_peak_kib=proc_status_kib("VmHWM"),
        # Not used: Linux folds the parent's RSS into a child's ru_maxrss at fork+exec.
        ru_maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    )
    print(json.dumps(result))


# -- the parent: setup, interleaved rounds, report ----------------------------------------


def run_child(spec: Spec) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec['variant']} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def make_file(path: Path, size: int) -> None:
    """``size`` bytes (a multiple of BLOCK): one random block, repeated; fsynced."""
    block = os.urandom(BLOCK)
    with open(path, "wb") as f:
        for _ in range(size // BLOCK):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def save_run(work: Path, file: Path, variant: str) -> Iterator[Spec]:
    """A fresh store dir for one save run, removed after it."""
    root = tempfile.mkdtemp(prefix="store-", dir=work)
    try:
        yield {"variant": variant, "file": str(file), "root": root}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def load_runs(work: Path, file: Path, root: str, path: str, sha: str) -> Prepare:
    @contextmanager
    def load_run(variant: str) -> Iterator[Spec]:
        """An output path for one load run, removed (with any partial file) after it."""
        out = work / "restored.bin"
        try:
            spec = {"variant": variant, "file": str(file), "root": root}
            yield {**spec, "path": path, "sha": sha, "out": str(out)}
        finally:
            for leftover in [out, *work.glob(".restored.bin.*.partial")]:
                leftover.unlink(missing_ok=True)

    return load_run


async def save_for_load(root: str, file: Path) -> tuple[str, str]:
    """Save the file once with cairn; its store path and digest."""
    ckpt = ObjectStoreCheckpointer(LocalStore(root))
    cid = CheckpointId.now()
    [(_, entry)] = await ckpt.save_partitions_concurrent(cid, [("op", 0, False, file)])
    return ckpt.paths.resolve(cid, entry.path), entry.sha256


def measure_children(
    sc: Scenario,
    names: list[str],
    reps: int,
    prepare: Prepare,
    rss: dict[str, list[float]],
    digests: set[str],
    runs: list[dict[str, Any]],
    warm: int = 0,
) -> None:
    """bench_save.measure, with each run in its own process; records peak RSS (MiB).
    With ``warm``, each child first runs its operation that many times, untimed.

    A fresh process has no runtime or thread pool to warm, so the warm-up is one
    discarded run of the first variant (it settles the page cache and the disk), not a
    whole round: a round of 2 GiB runs costs half a minute.
    """
    sc.times = {name: [] for name in names}
    sc.cpu = {name: [] for name in names}
    rss.update({name: [] for name in names})
    order = [(0, names[0])] + [
        (rnd, name)
        for rnd in range(1, reps + 1)
        for name in names[(rnd - 1) % len(names) :] + names[: (rnd - 1) % len(names)]
    ]
    for rnd, name in order:
        with prepare(f"{sc.name.split()[0]}/{name}") as spec:
            spec = {**spec, "warm": str(warm)}
            reported_before = reported_mib()
            settle()
            reported_at_start = reported_mib()
            result = run_child(spec)
            reported_at_end = reported_mib()
        if (
            reported_before is not None
            and reported_at_start is not None
            and reported_at_end is not None
        ):
            result["host_reclaimed_mib_before"] = reported_at_start - reported_before
            result["host_reclaimed_mib_during"] = reported_at_end - reported_at_start
        if result["sha256"]:
            digests.add(result["sha256"])
        peak_mib = (result["rss_peak_kib"] - result["rss_base_kib"]) / 1024
        runs.append({"scenario": sc.name, "variant": name, "round": rnd, **result})
        if rnd:  # round 0 is the warm-up
            sc.times[name].append(result["wall_s"])
            sc.cpu[name].append(result["cpu_s"])
            rss[name].append(peak_mib)
        reclaimed = ""
        if "host_reclaimed_mib_before" in result:
            reclaimed = (
                f", host reclaimed {result['host_reclaimed_mib_before']:.0f} MiB before, "
                f"{result['host_reclaimed_mib_during']:.0f} MiB during"
            )
        print(
            f"  round {rnd} {name}: {result['wall_s']:.2f}s wall, {result['cpu_s']:.2f}s cpu, "
            f"peak RSS +{peak_mib:.0f} MiB{reclaimed}",
            file=sys.stderr,
            flush=True,
        )


def memory_report(
    scenarios: list[tuple[Scenario, dict[str, list[float]]]],
) -> list[dict[str, Any]]:
    rows = []
    for sc, rss in scenarios:
        for name, peaks in rss.items():
            target = RSS_TARGET_MIB if name.startswith("cairn") else None
            rows.append(
                {
                    "scenario": sc.name,
                    "variant": name,
                    "peak_rss_above_imports_median_mib": statistics.median(peaks),
                    "peak_rss_above_imports_max_mib": max(peaks),
                    "peaks_mib": peaks,
                    "target_mib": target,
                    "ok": None if target is None else max(peaks) < target,
                }
            )
    return rows


def print_memory(rows: list[dict[str, Any]]) -> None:
    print(
        table(
            ["scenario", "variant", "peak RSS - imports, median", "max", "target", "ok"],
            [
                [
                    r["scenario"],
                    r["variant"],
                    f"{r['peak_rss_above_imports_median_mib']:.1f} MiB",
                    f"{r['peak_rss_above_imports_max_mib']:.1f} MiB",
                    "" if r["target_mib"] is None else f"< {r['target_mib']:.0f} MiB",
                    {None: "", True: "yes", False: "MISSED"}[r["ok"]],
                ]
                for r in rows
            ],
        )
    )


def run_all(reps: int, only: str, size: int, where: str | None, warm: int = 0) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-stream-", dir=where))
    kind = "tmpfs" if where is not None and Path(where).resolve() == Path(SHM) else "local"
    try:
        free = shutil.disk_usage(work).free
        if free < 3 * size + 1024 * MiB:
            raise SystemExit(f"{work}: {free / MiB:,.0f} MiB free, need {3 * size / MiB:,.0f}")
        file = work / "artifact.bin"
        print(f"writing {size / MiB:,.0f} MiB to {file}...", file=sys.stderr, flush=True)
        make_file(file, size)
        label = f"{size // MiB}MiB" if size < 1024 * MiB else f"{size // (1024 * MiB)}GiB"
        measured: list[tuple[Scenario, dict[str, list[float]]]] = []
        digests: set[str] = set()
        runs: list[dict[str, Any]] = []
        if only in f"save {label} file {kind}":
            sc = Scenario(
                name=f"save {label} file",
                store=kind,
                amount=size / MiB,
                unit="MiB",
                variants={},  # each run is a subprocess: see measure_children
                ratios=[("cairn", "put", None), ("cairn", "put+fsync", None)],
                floors=[
                    Floor("cairn", ("put", "sha"), 0.9, cpu_target=1 / 1.2),
                    Floor("cairn", ("put+fsync", "sha"), 0.9),
                    Floor("cairn", ("put", "sha"), None, cores=os.cpu_count()),
                ],
            )
            print(f"running {sc.name} on {kind}...", file=sys.stderr, flush=True)
            rss: dict[str, list[float]] = {}
            names = ["cairn", "put", "put+fsync", "sha"]
            measure_children(
                sc, names, reps, lambda v: save_run(work, file, v), rss, digests, runs, warm
            )
            measured.append((sc, rss))
        if only in f"load {label} to file {kind}":
            root = tempfile.mkdtemp(prefix="load-store-", dir=work)
            path, sha = asyncio.run(save_for_load(root, file))
            digests.add(sha)
            sc = Scenario(
                name=f"load {label} to file",
                store=kind,
                amount=size / MiB,
                unit="MiB",
                variants={},
                ratios=[("cairn", "get+fsync", None), ("cairn 1MiB", "get+fsync", None)],
                floors=[
                    Floor("cairn", ("get+fsync", "sha"), 0.9),
                    Floor("cairn 1MiB", ("get+fsync", "sha"), 0.9),
                ],
            )
            print(f"running {sc.name} on {kind}...", file=sys.stderr, flush=True)
            rss = {}
            names = ["cairn", "cairn 1MiB", "get+fsync", "sha"]
            prepare = load_runs(work, file, root, path, sha)
            measure_children(sc, names, reps, prepare, rss, digests, runs, warm)
            measured.append((sc, rss))
        if len(digests) > 1:
            raise RuntimeError(f"variants disagree on the file's SHA-256: {sorted(digests)}")
        out = report([sc for sc, _ in measured], reps)
        out["file_bytes"] = size
        out["memory"] = memory_report(measured)
        out["runs"] = runs
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition instead of 3")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 3, 1 with --quick)")
    parser.add_argument("--only", default="", help="run scenarios whose 'name store' has this")
    parser.add_argument(
        "--size-mib", type=int, default=2048, help="file size, a multiple of 64 (default 2048)"
    )
    parser.add_argument(
        "--dir", help=f"where the file and the stores go (default: the temp dir; {SHM}: tmpfs)"
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="untimed runs of the operation in each child before the timed one (default 0)",
    )
    args = parser.parse_args()
    if args.size_mib < 64 or args.size_mib % 64:
        parser.error("--size-mib must be a positive multiple of 64")
    reps = args.reps or (1 if args.quick else 3)
    out = run_all(reps, args.only, args.size_mib * MiB, args.dir, args.warm)
    print_report(out)
    print()
    print_memory(out["memory"])
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
