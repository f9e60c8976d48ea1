"""Train with PyTorch Distributed Checkpoint on cairn: checkpoint, get killed, resume.

A small regression model trained by two ranks (DDP over gloo, on CPU) checkpoints every
``--every`` steps with :class:`cairn.torch.CairnWriter`. Started again after a crash, it
takes over the store (fencing the dead job), loads the newest checkpoint with
:class:`cairn.torch.CairnReader` (every byte verified) and goes on: the loss curve is
the one an uninterrupted run draws, to the last bit.

One run::

    torchrun --standalone --nproc-per-node 2 examples/torch_train.py --store ./dcp-run

Killed at step 25 (rank 1 gets SIGKILL), then resumed::

    torchrun --standalone --nproc-per-node 2 examples/torch_train.py --store ./b --kill-at 25
    torchrun --standalone --nproc-per-node 2 examples/torch_train.py --store ./b

``python examples/torch_train.py --demo`` does all three (an uninterrupted run, a killed
one, its resumption) in a temporary directory and compares the loss curves.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.nn.parallel import DistributedDataParallel

from cairn import CheckpointPaths, SyncCheckpointer
from cairn.torch import CairnReader, CairnWriter, SafeLoadPlanner

PREFIX = "train/"
FEATURES = 32


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch for ``step``: the same on every run, whatever was restarted."""
    truth = torch.Generator().manual_seed(12345)
    weights = torch.randn(FEATURES, 1, generator=truth)
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, FEATURES, generator=gen)
    return x, x @ weights + 0.1 * torch.randn(64, 1, generator=gen)


def train(args: argparse.Namespace) -> None:
    """One rank of the training job (started by torchrun)."""
    warnings.filterwarnings("ignore", module="torch.distributed")  # experimental-API notes
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # Checkpoints get a process group of their own: an async save's collectives run in
    # another thread, and must not interleave with DDP's on the training group.
    checkpoint_group = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = torch.full((args.steps,), float("nan"))

    # Take over the store (a job that died can no longer commit) and find where to start.
    ckpt = SyncCheckpointer(args.store, CheckpointPaths(PREFIX))
    found: list[Any] = [None, 0]
    if rank == 0:
        found = [ckpt.latest_id(), ckpt.take_over()]
    dist.broadcast_object_list(found, src=0)
    latest, generation = found
    start = 0
    if latest is not None:
        model_sd, optim_sd = get_state_dict(model, optim)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "losses": losses, "step": 0}
        reader = CairnReader(args.store, checkpoint_id=latest, prefix=PREFIX)
        dcp_load(
            state,
            storage_reader=reader,
            planner=SafeLoadPlanner(),  # non-tensor values: weights_only=True
            process_group=checkpoint_group,
        )
        set_state_dict(model, optim, model_state_dict=model_sd, optim_state_dict=optim_sd)
        start = int(state["step"])
        if rank == 0:
            print(f"resumed from checkpoint {latest} at step {start}", flush=True)

    pending: Future[Any] | None = None
    for step in range(start, args.steps):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(ddp(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses[step] = mean / world
        if rank == 0:
            print(f"step {step:3d}  loss {losses[step].item():.6f}", flush=True)
        if args.kill_at is not None and step + 1 == args.kill_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no clean-up, no goodbye
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            model_sd, optim_sd = get_state_dict(model, optim)
            state = {"model": model_sd, "optim": optim_sd, "losses": losses, "step": step + 1}
            writer = CairnWriter(
                args.store, epoch=step + 1, prefix=PREFIX, writer_generation=generation
            )
            if pending is not None:
                pending.result()  # one save in flight at a time
            if args.async_save:  # training goes on while the bytes travel
                response = async_save(
                    state,
                    storage_writer=writer,
                    process_group=checkpoint_group,
                    async_checkpointer_type=AsyncCheckpointerType.THREAD,
                )
                # DCP's default stager copies the state before async_save returns: the
                # training may change it from here on. What comes back is one Future.
                assert isinstance(response, Future)
                pending = response
            else:
                dcp_save(state, storage_writer=writer, process_group=checkpoint_group)
    if pending is not None:
        pending.result()
    if rank == 0 and args.losses:
        Path(args.losses).write_text(json.dumps(losses.tolist()))
    dist.destroy_process_group()


def torchrun(store: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run this script under torchrun with two ranks."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", __file__, "--store", str(store), *extra]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def demo() -> int:
    """An uninterrupted run, a run killed at step 25 and its resumption; same curves?"""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        common = ["--steps", "40", "--every", "10"]
        whole = torchrun(root / "whole", *common, "--losses", str(root / "whole.json"))
        print(whole.stdout, end="")
        if whole.returncode != 0:
            print(whole.stderr, file=sys.stderr)
            return 1
        killed = torchrun(root / "crashy", *common, "--kill-at", "25")
        print(f"... the second run is killed at step 25 (exit code {killed.returncode})")
        resumed = torchrun(
            root / "crashy", *common, "--async-save", "--losses", str(root / "resumed.json")
        )
        print(resumed.stdout, end="")
        if killed.returncode == 0 or resumed.returncode != 0:
            print(killed.stderr, resumed.stderr, file=sys.stderr)
            return 1
        same = (root / "whole.json").read_text() == (root / "resumed.json").read_text()
        print("loss curves identical:", same)
        return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="where checkpoints go: a directory or a URL")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--kill-at", type=int, help="rank 1 is SIGKILLed after this step")
    parser.add_argument("--async-save", action="store_true", help="use dcp.async_save")
    parser.add_argument("--losses", help="write the loss curve (JSON) here at the end")
    parser.add_argument("--demo", action="store_true", help="run the crash-and-resume demo")
    args = parser.parse_args()
    if args.demo:
        return demo()
    if not args.store:
        parser.error("--store is required (or --demo)")
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
