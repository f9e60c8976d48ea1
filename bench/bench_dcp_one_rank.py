"""One process's DCP save to the local disk: one object per rank against the per-tensor
layout, in the same run.

    python bench/bench_dcp_one_rank.py [--mib 256] [--reps 5]

256 MiB of float32 in 16 tensors, saved with ``dcp.save(no_dist=True)`` through
``CairnWriter`` (one object of ranges) and through the per-tensor layout (an object per
tensor of 1 MiB or more: ``bench.per_tensor.PerTensorWriter``), alternating which goes first,
``harness.settle`` before each; round 0 is a discarded warm-up. Reports the median save
seconds of each and their ratio.
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
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: E402

from bench.harness import settle, table  # noqa: E402
from bench.per_tensor import PerTensorWriter  # noqa: E402
from cairn.torch import CairnWriter  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "torch.distributed is disabled")
    rows = args.mib * 1024 * 1024 // 4 // 16 // 1024
    state = {f"t{i}": torch.randn(rows, 1024) for i in range(16)}
    writers = {"one object per rank": CairnWriter, "per tensor": PerTensorWriter}
    times: dict[str, list[float]] = {name: [] for name in writers}
    root = tempfile.mkdtemp(prefix="cairn-bench-one-rank-", dir=REPO.parent)
    try:
        for round_ in range(args.reps + 1):
            order = list(writers.items())
            for name, cls in order if round_ % 2 else order[::-1]:
                prefix = f"{name.replace(' ', '-')}-{round_}/"
                settle()
                start = time.perf_counter()
                dcp_save(state, storage_writer=cls(root, epoch=1, prefix=prefix), no_dist=True)
                if round_:
                    times[name].append(time.perf_counter() - start)
                shutil.rmtree(os.path.join(root, prefix))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    body = [[name, f"{median:.3f}"] for name, median in medians.items()]
    print(table(["layout", "median save s"], body))
    ratio = medians["one object per rank"] / medians["per tensor"]
    print(f"\none object per rank / per tensor, time: {ratio:.3f}")


if __name__ == "__main__":
    main()
