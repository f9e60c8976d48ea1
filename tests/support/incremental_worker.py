"""A rank of the 2-rank incremental DCP scenario of ``test_torch_incremental.py``."""

from __future__ import annotations

import datetime as dt
import json
import os
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor import zeros as dtensor_zeros

PREFIX = "dcp/"


def full_state(step: int) -> dict[str, torch.Tensor]:
    """The whole tensors: a frozen 2 MiB base, a small replicated bias, an adapter."""
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(1024, 512, generator=gen)
    bias = torch.randn(512, generator=gen)
    adapter = torch.randn(64, 16, generator=torch.Generator().manual_seed(100 + step))
    return {"base": base, "bias": bias, "adapter": adapter}


def sharded(step: int, mesh: Any, dim: int = 0) -> dict[str, Any]:
    full = full_state(step)
    return {
        "base": distribute_tensor(full["base"], mesh, [Shard(dim)]),
        "bias": full["bias"],
        "adapter": distribute_tensor(full["adapter"], mesh, [Shard(0)]),
    }


def run_rank(rank: int, port: int, root: str, outdir: str) -> None:
    """Join the gloo group, save incrementally three times, load resharded, report."""
    from cairn.torch import CairnReader, CairnWriter

    warnings.simplefilter("ignore")
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=dt.timedelta(seconds=60))
    out: dict[str, Any] = {}
    try:
        mesh = init_device_mesh("cpu", (2,))

        def save(state: dict[str, Any], epoch: int) -> str:
            writer = CairnWriter(root, epoch=epoch, prefix=PREFIX, incremental=True)
            dcp_save(state, storage_writer=writer)
            return str(writer.checkpoint_id)

        # Built on the single-process save: the base is now in two shards, uploaded.
        out["sharded"] = save(sharded(1, mesh), 2)
        # The adapter trains: the base's shards and the bias are carried.
        out["trained"] = save(sharded(2, mesh), 3)
        # Loaded into another placement (Shard(1)): the carried shards reshard.
        target: dict[str, Any] = {
            "base": dtensor_zeros([1024, 512], device_mesh=mesh, placements=[Shard(1)]),
            "bias": torch.zeros(512),
            "adapter": dtensor_zeros([64, 16], device_mesh=mesh, placements=[Shard(0)]),
        }
        dcp_load(target, storage_reader=CairnReader(root, prefix=PREFIX))
        full = full_state(2)
        out["resharded"] = bool(
            torch.equal(target["base"].full_tensor(), full["base"])
            and torch.equal(target["bias"], full["bias"])
            and torch.equal(target["adapter"].full_tensor(), full["adapter"])
        )
    except BaseException:
        out["error"] = traceback.format_exc()
    Path(outdir, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()
