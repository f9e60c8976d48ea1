"""Incremental DCP saves: a frozen base is carried, only the adapter is uploaded.

    python bench/bench_dcp_incremental.py [--base-mib 256] [--adapter-mib 2]
                                          [--stores local,s3] [--reps 3] [--json out.json]

One process (``no_dist``) holds a frozen base model (``--base-mib`` MiB of float32
tensors of 4 MiB, each an artifact of its own, plus a small bias per tensor, bundled)
and a trainable adapter (``--adapter-mib`` MiB in 256 KiB tensors, bundled). Per store
and rep, in a fresh prefix: a full save (``CairnWriter``), the adapter changes, then an
incremental save (``incremental=True``), both timed wall-clock; the bytes each stores
under its own checkpoint directory are counted from a listing (artifacts, metadata,
manifest); the incremental checkpoint is loaded back and checked bit-exact (untimed).
Stores: ``local`` (a temporary directory) and ``s3`` (moto's server on a loopback
port). Targets: the incremental save stores at most 4 MiB and takes at most 0.2 of the
full save's wall time (medians).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_dcp_incremental.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers

import obstore  # noqa: E402
import torch  # noqa: E402
from obstore.store import LocalStore, S3Store  # noqa: E402
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: E402

from bench.harness import MiB, table  # noqa: E402
from cairn import CheckpointId  # noqa: E402
from cairn.torch import CairnReader, CairnWriter  # noqa: E402

MAX_UPLOAD = 4 * MiB
MAX_RATIO = 0.2


def make_state(base_mib: int, adapter_mib: int, step: int) -> dict[str, Any]:
    """The base (same for every step) and the adapter (new values at every step)."""
    gen = torch.Generator().manual_seed(0)
    base = {f"w{i}": torch.randn(1024, 1024, generator=gen) for i in range(base_mib // 4)}
    base |= {f"b{i}": torch.randn(1024, generator=gen) for i in range(base_mib // 4)}
    gen = torch.Generator().manual_seed(1000 + step)
    adapter = {f"a{i}": torch.randn(256, 256, generator=gen) for i in range(adapter_mib * 4)}
    return {"base": base, "adapter": adapter, "step": step}


def stored_bytes(store: Any, prefix: str, cid: object) -> int:
    """Bytes stored under the checkpoint's own directory."""
    return sum(m["size"] for chunk in obstore.list(store, f"{prefix}{cid}/") for m in chunk)


def timed_save(
    store: Any, prefix: str, state: Any, **options: Any
) -> tuple[float, CheckpointId | None]:
    writer = CairnWriter(store, epoch=int(state["step"]), prefix=prefix, **options)
    began = time.perf_counter()
    dcp_save(state, storage_writer=writer, no_dist=True)
    return time.perf_counter() - began, writer.checkpoint_id


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
    return bool(a == b)


def blank(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: blank(v) for k, v in state.items()}
    return torch.zeros_like(state) if isinstance(state, torch.Tensor) else 0


def run_store(store: Any, args: argparse.Namespace) -> dict[str, Any]:
    full_s, inc_s, full_b, inc_b = [], [], [], []
    for rep in range(args.reps):
        prefix = f"bench-{rep}/"
        first = make_state(args.base_mib, args.adapter_mib, 1)
        seconds, cid = timed_save(store, prefix, first)
        full_s.append(seconds)
        full_b.append(stored_bytes(store, prefix, cid))
        second = make_state(args.base_mib, args.adapter_mib, 2)
        seconds, cid = timed_save(store, prefix, second, incremental=True)
        inc_s.append(seconds)
        inc_b.append(stored_bytes(store, prefix, cid))
        loaded = blank(second)
        reader = CairnReader(store, checkpoint_id=cid, prefix=prefix)
        dcp_load(loaded, storage_reader=reader, no_dist=True)
        if not same(loaded, second):
            raise SystemExit("the incremental checkpoint did not load bit-exactly")
    full, inc = statistics.median(full_s), statistics.median(inc_s)
    uploaded = statistics.median(inc_b)
    return {
        "full_s": full,
        "incremental_s": inc,
        "ratio": inc / full,
        "full_bytes": statistics.median(full_b),
        "incremental_bytes": uploaded,
        "meets_targets": uploaded <= MAX_UPLOAD and inc / full <= MAX_RATIO,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-mib", type=int, default=256)
    parser.add_argument("--adapter-mib", type=int, default=2)
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    results: dict[str, Any] = {}
    for where in args.stores.split(","):
        if where == "local":
            with tempfile.TemporaryDirectory() as root:
                results[where] = run_store(LocalStore(root), args)
        elif where == "s3":
            servers: Any = importlib.import_module("support.servers")  # tests/ is no package

            with servers.S3Server() as server:
                bucket = servers.unique_name("dcp-inc")
                server.create_bucket(bucket)
                store = S3Store(bucket, **servers.s3_store_options(server))
                results[where] = run_store(store, args)
        else:
            raise SystemExit(f"unknown store {where!r}")
    rows = [
        [
            where,
            f"{r['full_s']:.3f}",
            f"{r['incremental_s']:.3f}",
            f"{r['ratio']:.3f}",
            f"{r['full_bytes'] / MiB:.1f}",
            f"{r['incremental_bytes'] / MiB:.2f}",
            "yes" if r["meets_targets"] else "NO",
        ]
        for where, r in results.items()
    ]
    headers = ["store", "full s", "incr. s", "ratio", "full MiB", "incr. MiB", "targets"]
    print(f"base {args.base_mib} MiB, adapter {args.adapter_mib} MiB, {args.reps} reps")
    print(table(headers, rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
