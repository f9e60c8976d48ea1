"""A DCP checkpoint out to S3 as Hugging Face safetensors: cairn's streamed export against
DCP's own consolidation on the local disk plus an upload of its result.

    python bench/bench_export_hf.py [--mib 1024] [--shard-mib 512] [--reps 3]

Starts moto's S3 server on a loopback port (``tests/support/servers.py``). Untimed setup,
in a child process: a state dict of ``--mib`` MiB (float32 tensors of 32 MiB, each with
a small bias) saved with ``dcp.save(no_dist=True)`` twice: through ``CairnWriter`` to
the S3 bucket, and through DCP's ``HuggingFaceStorageWriter(save_distributed=True)`` to
a local directory (DCP's sharded safetensors, the input its consolidation takes).

Timed, each run in a fresh process (its time and peak RSS, the RSS after imports
subtracted, from ``getrusage`` and ``/proc/self/status``):

* **cairn**: ``cairn.torch.export_hf`` from the S3 checkpoint into another S3 prefix:
  shards of at most ``--shard-mib`` MiB streamed by multipart upload, every item checked
  against its SHA-256;
* **cairn-local**: the same from a copy of the checkpoint that ``CairnWriter`` saved to
  the local disk: the same source medium as the baseline's;
* **dcp+upload**: ``consolidate_safetensors_files`` from the local sharded directory to
  a local output directory (the same shard plan), then each output file uploaded to S3
  with obstore's streamed ``put`` (a multipart upload of the file).

Order alternates between rounds; ``harness.settle`` (``os.sync`` and a wait for the
dirty page cache to drain) comes before each run; outputs are deleted after each
(untimed); round 0 is a discarded warm-up. Reports medians and the ratios cairn / dcp.
moto is a Python server on the same cores as both; it sets much of the pace, and a ranged
GET costs it time in proportion to the whole object read from (see
``moto_ranged_reads.py``), which the "cairn" variant pays and real S3 does not: compare
"cairn-local" with the baseline for the export itself.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_export_hf.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers

from bench.harness import settle, table  # noqa: E402

# By name at run time, as bench_s3.py does (tests/ is not a package).
servers: Any = importlib.import_module("support.servers")

MiB = 1 << 20
TENSOR_MIB = 32


def rss_mib() -> float:
    """The process's resident set now (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def peak_mib() -> float:
    """The process's peak resident set so far (ru_maxrss, KiB on Linux), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def state_dict(mib: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    rows = TENSOR_MIB * MiB // 4 // 2048
    state: dict[str, Any] = {}
    for i in range(max(1, mib // TENSOR_MIB)):
        state[f"layers.{i}.weight"] = torch.randn(rows, 2048, generator=gen)
        state[f"layers.{i}.bias"] = torch.randn(2048, generator=gen)
    return state


def shard_index(state: dict[str, Any], shard_bytes: int) -> dict[str, int]:
    """Each tensor's shard (from 1), as cairn plans them (``transformers``' rule)."""
    from cairn.torch._safetensors import ShardTensor, plan_shards

    entries = [
        ShardTensor(k, "F32", tuple(v.shape), v.numel() * v.element_size(), 4)
        for k, v in state.items()
    ]
    shards = plan_shards(entries, shard_bytes)
    return {e.name: n for n, shard in enumerate(shards, 1) for e in shard}


def s3_store(endpoint: str, bucket: str, prefix: str) -> Any:
    from obstore.store import S3Store

    return S3Store(bucket, prefix=prefix, **servers.s3_store_options(endpoint))


def child(args: argparse.Namespace) -> None:
    """One role in a fresh process; prints one JSON line."""
    warnings.filterwarnings("ignore", "torch.distributed is disabled")
    import obstore
    import torch  # noqa: F401
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
    )
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from cairn.stores import ObstoreStore
    from cairn.torch import CairnWriter, export_hf

    base = rss_mib()
    began = time.perf_counter()
    shard_bytes = args.shard_mib * MiB
    if args.child == "setup":
        state = state_dict(args.mib)
        source = ObstoreStore(s3_store(args.endpoint, args.bucket, "ckpt"))
        dcp_save(state, storage_writer=CairnWriter(source, epoch=1), no_dist=True)
        local = args.work + "/cairn-local"
        dcp_save(state, storage_writer=CairnWriter(local, epoch=1), no_dist=True)
        writer = HuggingFaceStorageWriter(args.work + "/sharded", save_distributed=True)
        dcp_save(state, storage_writer=writer, no_dist=True)
        index = shard_index(state, shard_bytes)
        Path(args.work, "index.json").write_text(json.dumps(index))
    elif args.child in ("cairn", "cairn-local"):
        source = (
            ObstoreStore(s3_store(args.endpoint, args.bucket, "ckpt"))
            if args.child == "cairn"
            else args.work + "/cairn-local"
        )
        dest = ObstoreStore(s3_store(args.endpoint, args.bucket, args.out))
        export_hf(source, None, dest, max_shard_bytes=shard_bytes)
    else:
        index = json.loads(Path(args.work, "index.json").read_text())
        out = Path(args.work, "consolidated")
        out.mkdir()
        consolidate_safetensors_files(args.work + "/sharded", str(out), index)
        dest = s3_store(args.endpoint, args.bucket, args.out)
        for file in sorted(out.iterdir()):
            obstore.put(dest, file.name, file)
        shutil.rmtree(out)
    seconds = time.perf_counter() - began
    print(json.dumps({"seconds": seconds, "peak_mib": peak_mib(), "base_mib": base}))


def run_child(role: str, args: argparse.Namespace, out: str = "") -> dict[str, float]:
    command = [sys.executable, __file__, "--child", role, "--mib", str(args.mib)]
    command += ["--shard-mib", str(args.shard_mib), "--endpoint", args.endpoint]
    command += ["--bucket", args.bucket, "--work", args.work, "--out", out]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{role} failed:\n{done.stdout}\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def empty(endpoint: str, bucket: str, prefix: str) -> int:
    """Delete every object under ``prefix``; the bytes they held."""
    import obstore

    store = s3_store(endpoint, bucket, prefix)
    metas = [m for chunk in obstore.list(store) for m in chunk]
    if metas:
        obstore.delete(store, [m["path"] for m in metas])
    return sum(int(m["size"]) for m in metas)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="state dict size (MiB)")
    parser.add_argument("--shard-mib", type=int, default=512, help="max tensor MiB per shard")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--variants",
        default="cairn,cairn-local,dcp+upload",
        help="which to run (cairn reads its source from moto, whose ranged GETs each read "
        "the whole object: minutes at 1 GiB)",
    )
    parser.add_argument(
        "--dir", default=None, help="where DCP's local files go (default: beside the repo)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    parser.add_argument("--bucket", default="", help=argparse.SUPPRESS)
    parser.add_argument("--work", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    args.work = tempfile.mkdtemp(prefix="cairn-bench-hf-", dir=args.dir or REPO.parent)
    try:
        with servers.S3Server() as server:
            args.endpoint, args.bucket = server.endpoint, "bench-export-hf"
            server.create_bucket(args.bucket)
            run_child("setup", args)
            names = [
                name
                for name in ("cairn", "cairn-local", "dcp+upload")
                if name in args.variants.split(",")
            ]
            results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
            written: dict[str, int] = {}
            for round_ in range(args.reps + 1):
                order = names if round_ % 2 == 0 else names[::-1]
                for name in order:
                    settle()
                    out = f"out-{name.split('+')[0]}-{round_}"
                    got = run_child(name.split("+")[0], args, out)
                    written[name] = empty(args.endpoint, args.bucket, out)
                    if round_:
                        results[name].append(got)
                    print(f"round {round_} {name}: {got['seconds']:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    report(args, results, written)


def report(
    args: argparse.Namespace, results: dict[str, list[dict[str, float]]], written: dict[str, int]
) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def above(name: str) -> float:
        return statistics.median(r["peak_mib"] - r["base_mib"] for r in results[name])

    rows = []
    for name in results:
        seconds = median(name, "seconds")
        rows.append(
            [
                name,
                f"{seconds:.2f}",
                f"{args.mib / seconds:.0f}",
                f"{median(name, 'peak_mib'):.0f}",
                f"{above(name):.0f}",
                f"{written[name] / MiB:.1f}",
            ]
        )
    headers = ["variant", "median s", "MiB/s", "peak RSS MiB", "above imports MiB", "MiB to S3"]
    print(f"{args.mib} MiB state dict, shards of <= {args.shard_mib} MiB, {args.reps} rounds")
    print(table(headers, rows))
    for name in ("cairn", "cairn-local"):
        if name not in results or "dcp+upload" not in results:
            continue
        time_ratio = median("dcp+upload", "seconds") / median(name, "seconds")
        rss_ratio = above(name) / above("dcp+upload")
        print(
            f"{name} / dcp+upload: throughput {time_ratio:.2f}, "
            f"peak RSS above imports {rss_ratio:.2f}"
        )


if __name__ == "__main__":
    main()
