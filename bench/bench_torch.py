"""DCP on cairn against DCP's own writers: save, load and async_save of one state, 2 ranks.

Two spawned ranks (gloo, CPU) hold the same state in every variant: ``--mib`` MiB of
float32 tensors (16 tensors, each sharded in halves across the ranks as DTensors, so
each rank writes half) plus a step counter. Per store, each round runs every variant
once, rotating which goes first; round 0 is a discarded warm-up. Per variant and round:
``dcp.save`` (timed from a barrier to a barrier), ``dcp.load`` of what it saved into a
preallocated state (checked equal, untimed), then ``dcp.async_save`` in thread mode
(the time until it returns is the training loop's stall; then until its future is
done), then the outputs are deleted (untimed).

Stores and variants:

* ``local`` (a directory on the disk) and ``shm`` (tmpfs, where the disk cannot hide
  CPU costs): ``cairn`` (CairnWriter/CairnReader: SHA-256 of every byte, atomic
  commit, one object per rank), ``cairn-per-tensor`` (the same writer in the earlier
  layout, ``bench/per_tensor.py``: an object per tensor of 1 MiB or more), ``fs``
  (FileSystemWriter/Reader, defaults: fsyncs each file, no digests),
  ``fs-nosync`` (the same without fsync, as obstore's local store writes);
* ``s3`` (moto's server on a loopback port): ``cairn``, ``cairn-per-tensor``,
  ``cairn-unsigned`` (the same
  with obstore's ``unsigned_payload=True``: no SigV4 SHA-256 of each body, which
  cairn's own digest makes redundant for integrity at rest, though S3 then no longer
  checks the bytes in transit) and ``fsspec`` (FsspecWriter/Reader over s3fs, installed
  on first use into a private directory: s3fs pins a botocore older than the tests'
  boto3 needs, so it stays out of .venv).

Reported: median wall seconds and MiB/s, median client CPU seconds (both ranks' user +
system time, every thread: obstore's and aiobotocore's I/O threads are in-process;
moto's CPU is reported apart), and ratios cairn / baseline: throughput (wall) and, for
CPU, baseline CPU / cairn CPU (above 1: cairn spends less). On local disk, ``os.sync()``
and a settle precede every timed save (see /work/shared/DESIGN.md).

    python bench/bench_torch.py                  # local and s3, 5 rounds, ~5 minutes
    python bench/bench_torch.py --only shm --reps 9 --json out.json
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_torch.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers

S3FS = "s3fs==2026.9.0"
S3FS_DIR = Path.home() / ".cache" / "cairn-bench" / S3FS.replace("==", "-")
if S3FS_DIR.is_dir():  # ahead of .venv: its botocore is the one s3fs was installed with
    sys.path.insert(0, str(S3FS_DIR))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint.filesystem import (  # noqa: E402
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import (  # noqa: E402
    AsyncCheckpointerType,
    async_save,
)
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: E402
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_tensor  # noqa: E402

from bench.harness import MiB, settle, table  # noqa: E402
from bench.per_tensor import PerTensorWriter  # noqa: E402
from cairn.torch import CairnReader, CairnWriter  # noqa: E402

TENSORS = 16
VARIANTS = {
    "local": ["cairn", "cairn-per-tensor", "fs", "fs-nosync"],
    "shm": ["cairn", "cairn-per-tensor", "fs", "fs-nosync"],
    "s3": ["cairn", "cairn-unsigned", "cairn-per-tensor", "fsspec"],
}
BASELINES = {
    "local": ["fs", "fs-nosync", "cairn-per-tensor"],
    "shm": ["fs", "fs-nosync", "cairn-per-tensor"],
    "s3": ["fsspec", "cairn-per-tensor"],
}


def ensure_s3fs() -> None:
    """Install s3fs into its private directory on first use (see the module docstring)."""
    if S3FS_DIR.is_dir():
        return
    print(f"installing {S3FS} into {S3FS_DIR} (first run only) ...", file=sys.stderr)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # --no-warn-conflicts: pip would compare the private directory's botocore with .venv's
    # boto3, which never meet.
    subprocess.run([*pip, "--no-warn-conflicts", "--target", str(S3FS_DIR), S3FS], check=True)
    sys.path.insert(0, str(S3FS_DIR))


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- one rank -------------------------------------------------------------------------


class Where:
    """Where a variant writes in one round, and how to empty it afterwards (rank 0)."""

    def __init__(self, where: str, config: dict[str, Any], variant: str, round_: int) -> None:
        self.where, self.config, self.variant = where, config, variant
        self.name = f"{variant}-{round_}"

    def writer(self, epoch: int) -> StorageWriter:
        if self.variant == "cairn-per-tensor":
            return PerTensorWriter(self._store(), epoch=epoch, prefix=f"{self.name}/")
        if self.variant.startswith("cairn"):
            return CairnWriter(self._store(), epoch=epoch, prefix=f"{self.name}/")
        if self.variant == "fsspec":
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

            return FsspecWriter(self._url(), **self._s3fs_options())
        sync = self.variant == "fs"
        return FileSystemWriter(os.path.join(self.config["root"], self.name), sync_files=sync)

    def reader(self) -> StorageReader:
        if self.variant.startswith("cairn"):
            return CairnReader(self._store(), prefix=f"{self.name}/")
        if self.variant == "fsspec":
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            return FsspecReader(self._url(), **self._s3fs_options())
        return FileSystemReader(os.path.join(self.config["root"], self.name))

    def clear(self) -> None:
        if self.where != "s3":
            shutil.rmtree(os.path.join(self.config["root"], self.name), ignore_errors=True)
            return
        import obstore

        store = self._store()
        paths = [m["path"] for chunk in obstore.list(store, f"{self.name}/") for m in chunk]
        for start in range(0, len(paths), 500):
            obstore.delete(store, paths[start : start + 500])

    def _store(self) -> Any:
        if self.where != "s3":
            return self.config["root"]
        from obstore.store import S3Store

        unsigned = self.variant == "cairn-unsigned"
        return S3Store(self.config["bucket"], **self.config["options"], unsigned_payload=unsigned)

    def _url(self) -> str:
        return f"s3://{self.config['bucket']}/{self.name}"

    def _s3fs_options(self) -> dict[str, Any]:
        options = self.config["options"]
        return {
            "key": options["access_key_id"],
            "secret": options["secret_access_key"],
            "endpoint_url": options["endpoint"],
            "client_kwargs": {"region_name": options["region"]},
        }


def make_state(mesh: Any, mib: int, fill: bool) -> dict[str, Any]:
    """``mib`` MiB of float32 in TENSORS tensors sharded over the ranks, and a counter."""
    rows = mib * MiB // 4 // TENSORS // 1024
    gen = torch.Generator().manual_seed(0)
    state: dict[str, Any] = {"step": 7 if fill else 0}
    for i in range(TENSORS):
        full = torch.randn(rows, 1024, generator=gen) if fill else torch.zeros(rows, 1024)
        state[f"layer{i}"] = distribute_tensor(full, mesh, [Shard(0)])
    return state


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def local(value: Any) -> Any:
        return value.to_local() if isinstance(value, DTensor) else value

    return all(
        torch.equal(local(a[k]), local(b[k])) if isinstance(a[k], DTensor) else a[k] == b[k]
        for k in a
    )


def timed(
    op: Callable[[], object], group: Any, settle_first: bool, rank: int
) -> tuple[float, float]:
    """(wall seconds, both ranks' CPU seconds) of ``op`` run by every rank at once."""
    if settle_first and rank == 0:
        settle()
    dist.barrier(group)
    cpu, start = time.process_time(), time.perf_counter()
    op()
    dist.barrier(group)
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    totals: list[Any] = [None, None]
    dist.all_gather_object(totals, used, group=group)
    return wall, float(sum(totals))


def run_rank(rank: int, port: int, config: dict[str, Any]) -> None:
    """One rank: every store, every round, every variant; rank 0 writes the samples."""
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    group = dist.new_group(backend="gloo")  # a second group for DCP's collectives
    mesh = init_device_mesh("cpu", (2,))
    state = make_state(mesh, config["mib"], fill=True)
    target = make_state(mesh, config["mib"], fill=False)
    samples: dict[str, Any] = {}
    for where, store_config in config["stores"].items():
        names = VARIANTS[where]
        for round_ in range(config["reps"] + 1):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for variant in order:
                place = Where(where, store_config, variant, round_)
                disk = where == "local"
                writer, reader = place.writer(round_), place.reader()
                save = timed(
                    functools.partial(dcp_save, state, storage_writer=writer, process_group=group),
                    group,
                    disk,
                    rank,
                )
                load = timed(
                    functools.partial(dcp_load, target, storage_reader=reader, process_group=group),
                    group,
                    False,
                    rank,
                )
                if not same(state, target):
                    raise AssertionError(f"{variant} on {where} loaded other values")
                for value in target.values():
                    if isinstance(value, DTensor):
                        value.to_local().zero_()
                dist.barrier(group)
                if rank == 0:
                    place.clear()
                dist.barrier(group)
                if disk and rank == 0:
                    settle()
                dist.barrier(group)
                start = time.perf_counter()
                future = async_save(
                    state,
                    storage_writer=place.writer(round_),
                    process_group=group,
                    async_checkpointer_type=AsyncCheckpointerType.THREAD,
                )
                blocked = time.perf_counter() - start
                future.result()  # type: ignore[union-attr]
                total = time.perf_counter() - start
                dist.barrier(group)
                if rank == 0:
                    place.clear()
                    if round_ > 0:
                        key = f"{where}/{variant}"
                        entry = samples.setdefault(key, {"save": [], "load": [], "async": []})
                        entry["save"].append(save)
                        entry["load"].append(load)
                        entry["async"].append((blocked, total))
                    print(
                        f"{where} round {round_} {variant}: save {save[0]:.2f}s "
                        f"load {load[0]:.2f}s async {blocked:.2f}/{total:.2f}s",
                        file=sys.stderr,
                        flush=True,
                    )
                dist.barrier(group)
    if rank == 0:
        Path(config["out"]).write_text(json.dumps(samples))
    dist.barrier()
    dist.destroy_process_group()


# -- the driver -------------------------------------------------------------------------


def spawn(config: dict[str, Any]) -> dict[str, Any]:
    import multiprocessing

    servers: Any = importlib.import_module("support.servers")
    ctx = multiprocessing.get_context("spawn")
    port = servers.free_port()
    procs = [ctx.Process(target=run_rank, args=(r, port, config)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode != 0 for proc in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    result: dict[str, Any] = json.loads(Path(config["out"]).read_text())
    return result


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(samples: dict[str, Any], mib: int, moto_cpu: dict[str, float]) -> dict[str, Any]:
    rows, ratios = [], []
    out: dict[str, Any] = {"mib": mib, "variants": {}, "ratios": []}
    for key, entry in samples.items():
        summary = {
            op: {
                "wall_s": median([s[0] for s in entry[op]]),
                "cpu_s": median([s[1] for s in entry[op]]),
            }
            for op in ("save", "load")
        }
        summary["async"] = {
            "blocked_s": median([s[0] for s in entry["async"]]),
            "total_s": median([s[1] for s in entry["async"]]),
        }
        out["variants"][key] = summary
        rows.append(
            [
                key,
                f"{summary['save']['wall_s']:.2f}",
                f"{mib / summary['save']['wall_s']:.0f}",
                f"{summary['save']['cpu_s']:.2f}",
                f"{summary['load']['wall_s']:.2f}",
                f"{mib / summary['load']['wall_s']:.0f}",
                f"{summary['load']['cpu_s']:.2f}",
                f"{summary['async']['blocked_s']:.3f}",
                f"{summary['async']['total_s']:.2f}",
            ]
        )
    pairs = [
        (where, ours, baseline)
        for where, baselines in BASELINES.items()
        for ours in VARIANTS[where]
        if ours.startswith("cairn")
        for baseline in baselines
        if baseline != ours and not (ours != "cairn" and baseline.startswith("cairn"))
    ]
    for where, ours, baseline in pairs:
        cairn = out["variants"].get(f"{where}/{ours}")
        other = out["variants"].get(f"{where}/{baseline}")
        if cairn is None or other is None:
            continue
        for op in ("save", "load"):
            ratio = {
                "store": where,
                "op": op,
                "variant": ours,
                "baseline": baseline,
                "throughput": other[op]["wall_s"] / cairn[op]["wall_s"],
                "cpu": other[op]["cpu_s"] / cairn[op]["cpu_s"],
            }
            out["ratios"].append(ratio)
            ratios.append(
                [
                    f"{where} {op}",
                    f"{ours} / {baseline}",
                    f"{ratio['throughput']:.2f}",
                    f"{ratio['cpu']:.2f}",
                ]
            )
    headers = ["variant", "save s", "MiB/s", "cpu s", "load s", "MiB/s", "cpu s"]
    print(table([*headers, "async stall s", "async total s"], rows))
    print()
    print(table(["scenario", "ratio", "throughput", "cpu (baseline/cairn)"], ratios))
    if moto_cpu:
        print(f"\nmoto's CPU seconds over the whole S3 run: {moto_cpu['total']:.1f}")
    out["moto_cpu_s"] = moto_cpu
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="measured rounds (plus a warm-up)")
    parser.add_argument("--mib", type=int, default=256, help="MiB of tensors across both ranks")
    parser.add_argument(
        "--only", default="local,s3", help="stores, comma-separated: local, shm, s3"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    args = parser.parse_args()
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(wanted) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown store(s) {sorted(unknown)}: choose from {sorted(VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        config: dict[str, Any] = {"reps": args.reps, "mib": args.mib, "stores": {}}
        config["out"] = str(Path(tmp) / "samples.json")
        if "local" in wanted:
            os.mkdir(Path(tmp) / "local")
            config["stores"]["local"] = {"root": str(Path(tmp) / "local")}
        shm = None
        if "shm" in wanted:
            shm = tempfile.mkdtemp(prefix="bench-torch-", dir="/dev/shm")
            config["stores"]["shm"] = {"root": shm}
        moto_cpu: dict[str, float] = {}
        try:
            if "s3" in wanted:
                ensure_s3fs()
                servers: Any = importlib.import_module("support.servers")
                with servers.S3Server() as server:
                    bucket = servers.unique_name("bench-torch")
                    server.create_bucket(bucket)
                    options = dict(servers.s3_store_options(server))
                    config["stores"]["s3"] = {"bucket": bucket, "options": options}
                    pid = server._proc.pid  # the moto process (a private attribute)
                    before = process_cpu_seconds(pid)
                    samples = spawn(config)
                    moto_cpu["total"] = process_cpu_seconds(pid) - before
            else:
                samples = spawn(config)
        finally:
            if shm is not None:
                shutil.rmtree(shm, ignore_errors=True)
    out = report(samples, args.mib, moto_cpu)
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
