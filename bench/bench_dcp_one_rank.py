"""One process's DCP save and load on the local disk: cairn's one object per rank (what it
writes to a local directory) against the per-tensor layout, in the same run.

    python bench/bench_dcp_one_rank.py [--mib 256] [--reps 5] [--compression zstd]

256 MiB of float32 in 16 tensors, saved with ``dcp.save(no_dist=True)`` through
``CairnWriter`` (one object of ranges: a local directory keeps one per rank) and through
the per-tensor layout (an object per tensor of 1 MiB or more:
``bench.per_tensor.PerTensorWriter``), then loaded back with ``CairnReader``,
alternating which layout goes first, ``harness.settle`` before each; round 0 is a
discarded warm-up. With ``--compression zstd`` both compress: each item a
frame of its rank's object, against each per-tensor object compressed whole. Reports
the median save and load seconds of each, the bytes stored, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_dcp_one_rank.py``
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: E402

from bench.harness import settle, table  # noqa: E402
from bench.per_tensor import PerTensorWriter  # noqa: E402
from cairn.torch import CairnReader, CairnWriter  # noqa: E402


def stored_bytes(root: str) -> int:
    """The bytes of every file under ``root``."""
    return sum(f.stat().st_size for f in Path(root).rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--compression", default=None, help="zstd: both layouts compress")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "torch.distributed is disabled")
    rows = args.mib * 1024 * 1024 // 4 // 16 // 1024
    state = {f"t{i}": torch.randn(rows, 1024) for i in range(16)}
    writers = {"cairn (one object per rank)": CairnWriter, "per tensor": PerTensorWriter}
    saves: dict[str, list[float]] = {name: [] for name in writers}
    loads: dict[str, list[float]] = {name: [] for name in writers}
    sizes: dict[str, int] = {}
    root = tempfile.mkdtemp(prefix="cairn-bench-one-rank-", dir=REPO.parent)
    try:
        for round_ in range(args.reps + 1):
            order = list(writers.items())
            for name, cls in order if round_ % 2 else order[::-1]:
                prefix = f"{name.replace(' ', '-')}-{round_}/"
                writer = cls(root, epoch=1, prefix=prefix, compression=args.compression)
                settle()
                start = time.perf_counter()
                dcp_save(state, storage_writer=writer, no_dist=True)
                saved = time.perf_counter() - start
                sizes[name] = stored_bytes(os.path.join(root, prefix))
                blank = {k: torch.empty_like(v) for k, v in state.items()}
                settle()
                start = time.perf_counter()
                dcp_load(blank, storage_reader=CairnReader(root, prefix=prefix), no_dist=True)
                loaded = time.perf_counter() - start
                assert all(torch.equal(blank[k], v) for k, v in state.items())
                if round_:
                    saves[name].append(saved)
                    loads[name].append(loaded)
                shutil.rmtree(os.path.join(root, prefix))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    save_s = {name: statistics.median(values) for name, values in saves.items()}
    load_s = {name: statistics.median(values) for name, values in loads.items()}
    body = [
        [name, f"{save_s[name]:.3f}", f"{load_s[name]:.3f}", f"{sizes[name] / 2**20:.1f}"]
        for name in writers
    ]
    print(f"compression: {args.compression or 'none'}")
    print(table(["layout", "median save s", "median load s", "stored MiB"], body))
    new, old = "cairn (one object per rank)", "per tensor"
    print(f"\n{new} / {old}, save time: {save_s[new] / save_s[old]:.3f}")
    print(f"{new} / {old}, load time: {load_s[new] / load_s[old]:.3f}")


if __name__ == "__main__":
    main()
