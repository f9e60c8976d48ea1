"""Train with PyTorch Distributed Checkpoint on cairn: checkpoint, get killed, resume.

A small regression model trained by two ranks (DDP over gloo, on CPU) checkpoints every
``--every`` steps with :class:`cairn.torch.CairnWriter`. Started again after a crash, it
takes over the store (fencing the dead job), loads the newest checkpoint with
:class:`cairn.torch.CairnReader` (every byte verified) and goes on: the loss curve is
the one an uninterrupted run draws, to the last bit.

One run (the script starts torchrun with two ranks itself)::

    python examples/torch_train.py --store ./dcp-run

Killed after step 25, on purpose, then resumed::

    python examples/torch_train.py --store ./b --kill-at 25
    python examples/torch_train.py --store ./b

With ``--kill-at`` rank 1 SIGKILLs itself after that step, like a crash; the other rank
and torchrun then fail as they do after a real one. The script reports that expected
failure in one line (the newest checkpoint, verified, and how to resume); any other
failure is shown as torchrun printed it, tracebacks and all.

The ranks also run under a torchrun of your own, which reports a killed rank its own
way (``torchrun --standalone --nproc-per-node 2 examples/torch_train.py --store DIR``).

The checkpoints go in the store's root (``--prefix`` to put them under a prefix),
where ``cairn`` reads by default: ``cairn list --store ./b`` lists them.

``python examples/torch_train.py --demo`` does all three (an uninterrupted run, a killed
one, its resumption) in a temporary directory and compares the loss curves.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cairn import CheckpointPaths, MissingExtraError, SyncCheckpointer

if TYPE_CHECKING:
    import torch

DEFAULT_PREFIX = ""
"""The base prefix ``cairn`` reads when given no ``--prefix``."""
FEATURES = 32
RANKS = 2
"""How many ranks the script starts under torchrun."""


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch for ``step``: the same on every run, whatever was restarted."""
    import torch

    truth = torch.Generator().manual_seed(12345)
    weights = torch.randn(FEATURES, 1, generator=truth)
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, FEATURES, generator=gen)
    return x, x @ weights + 0.1 * torch.randn(64, 1, generator=gen)


def train(args: argparse.Namespace) -> None:
    """One rank of the training job (started by torchrun)."""
    # Only the ranks import torch: the launcher, --help and a usage error start at once.
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, async_save
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
    from torch.nn.parallel import DistributedDataParallel

    from cairn.torch import CairnReader, CairnWriter, SafeLoadPlanner

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
    if rank == 0:
        if args.temporary:  # the demo deletes it: no command to look at it later
            print(f"store {args.store} (temporary, deleted when the demo ends)", flush=True)
        else:
            print(
                f"store {args.store}, prefix {args.prefix!r}; {inspect_command(args)}", flush=True
            )
        if args.kill_at is not None:
            print(
                f"rank 1 will be SIGKILLed after step {args.kill_at} (--kill-at): "
                "the crash that follows is on purpose",
                flush=True,
            )

    # Take over the store (a job that died can no longer commit) and find where to start.
    ckpt = SyncCheckpointer(args.store, CheckpointPaths(args.prefix))
    found: list[Any] = [None, 0]
    if rank == 0:
        found = [ckpt.latest_id(), ckpt.take_over()]
    dist.broadcast_object_list(found, src=0)
    latest, generation = found
    start = 0
    if latest is not None:
        model_sd, optim_sd = get_state_dict(model, optim)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "losses": losses, "step": 0}
        reader = CairnReader(args.store, checkpoint_id=latest, prefix=args.prefix)
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
            if args.kill_note:  # tells the launcher that this is the injected failure
                Path(args.kill_note).write_text(str(step + 1))
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no clean-up, no goodbye
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            model_sd, optim_sd = get_state_dict(model, optim)
            state = {"model": model_sd, "optim": optim_sd, "losses": losses, "step": step + 1}
            writer = CairnWriter(
                args.store, epoch=step + 1, prefix=args.prefix, writer_generation=generation
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


def inspect_command(args: argparse.Namespace) -> str:
    """The ``cairn list`` command that lists this run's checkpoints."""
    return f"cairn list --store {shlex.quote(args.store)} --prefix {shlex.quote(args.prefix)}"


def torchrun(rank_args: list[str], *, capture_stdout: bool) -> subprocess.CompletedProcess[str]:
    """Run this script's ranks under torchrun; their stderr is captured, for :func:`outcome`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(RANKS), __file__, *rank_args]
    # torchrun sets 1 itself when unset, with a banner saying so.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    stdout = subprocess.PIPE if capture_stdout else None
    return subprocess.run(
        command, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, check=False
    )


def outcome(
    proc: subprocess.CompletedProcess[str], kill_note: Path, store: str, prefix: str
) -> tuple[bool, str]:
    """Whether the run failed only by the injected kill, and what to show about it.

    Only a failed run whose rank 1 wrote ``kill_note`` (just before its SIGKILL) is the
    expected one: it is summarised in one line naming the newest checkpoint, which is
    loaded with every digest verified first (a failure there raises, traceback and all).
    Any other run shows torchrun's stderr as it is.
    """
    if proc.returncode == 0 or not kill_note.exists():
        return False, proc.stderr
    step = int(kill_note.read_text())
    said = f"rank 1 was killed on purpose after step {step} (--kill-at {step})"
    ckpt = SyncCheckpointer(store, CheckpointPaths(prefix))
    try:
        newest = ckpt.newest_id()  # the newest committed, loaded here to prove it intact
        if newest is None:
            return True, f"{said}, before its first checkpoint; run again without --kill-at"
        epoch = ckpt.load(newest).epoch
    finally:
        ckpt.close()
    return True, (
        f"{said}; the newest checkpoint, step {epoch}, is intact (every digest verified); "
        "run again without --kill-at to resume from it"
    )


def launch(args: argparse.Namespace, rank_args: list[str]) -> int:
    """Start the ranks under torchrun; the injected kill ends in one line, not tracebacks."""
    with tempfile.TemporaryDirectory() as tmp:
        note = Path(tmp) / "killed"
        if args.kill_at is not None:
            rank_args = [*rank_args, "--kill-note", str(note)]
        proc = torchrun(rank_args, capture_stdout=False)
        _, report = outcome(proc, note, args.store, args.prefix)
    if report:
        print(report.rstrip("\n"), file=sys.stderr)
    return proc.returncode


def demo() -> int:
    """An uninterrupted run, a run killed at step 25 and its resumption; same curves?"""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        common = ["--steps", "40", "--every", "10", "--temporary"]
        whole = torchrun(
            ["--store", str(root / "whole"), *common, "--losses", str(root / "whole.json")],
            capture_stdout=True,
        )
        print(whole.stdout, end="")
        if whole.returncode != 0:
            print(whole.stderr, file=sys.stderr)
            return 1
        crashy = str(root / "crashy")
        note = root / "killed"
        killed = torchrun(
            ["--store", crashy, *common, "--kill-at", "25", "--kill-note", str(note)],
            capture_stdout=True,
        )
        print(f"... the second run is killed at step 25 (exit code {killed.returncode})")
        expected, report = outcome(killed, note, crashy, DEFAULT_PREFIX)
        if not expected:
            print(killed.stdout, end="")
            print(report, file=sys.stderr)
            return 1
        print(report)
        resumed = torchrun(
            ["--store", crashy, *common, "--async-save", "--losses", str(root / "resumed.json")],
            capture_stdout=True,
        )
        print(resumed.stdout, end="")
        if resumed.returncode != 0:
            print(resumed.stderr, file=sys.stderr)
            return 1
        same = (root / "whole.json").read_text() == (root / "resumed.json").read_text()
        print("loss curves identical:", same)
        print(
            "the demo's stores are deleted; to keep checkpoints for `cairn list`, run "
            "python examples/torch_train.py --store ./dcp-run --kill-at 25, then again "
            "without --kill-at"
        )
        return 0 if same else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--help`` and bad options exit here, before any store is made."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs the torch extra (torch, numpy, zstandard): pip install '.[torch]' in "
        "cairn's directory. Outside torchrun the script starts torchrun with two ranks "
        "itself.",
    )
    parser.add_argument(
        "--store", help="where checkpoints go: a directory (made if missing) or a URL"
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help="base prefix of the checkpoints in the store (default: the store's root, the one "
        "`cairn` reads by default: `cairn list --store STORE` lists them)",
    )
    parser.add_argument("--steps", type=int, default=40, help="train this many steps")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument(
        "--kill-at",
        type=int,
        metavar="STEP",
        help="rank 1 SIGKILLs itself after STEP, on purpose (a crash to resume from)",
    )
    parser.add_argument("--async-save", action="store_true", help="use dcp.async_save")
    parser.add_argument("--losses", help="write the loss curve (JSON) here at the end")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="run, crash and resume in a temporary directory; compare the loss curves",
    )
    parser.add_argument("--kill-note", help=argparse.SUPPRESS)  # see launch()
    parser.add_argument("--temporary", action="store_true", help=argparse.SUPPRESS)  # demo()
    args = parser.parse_args(argv)
    if not args.demo and not args.store:
        parser.error("--store is required (or --demo)")
    args.prefix = CheckpointPaths(args.prefix).base_prefix
    return args


def main(argv: list[str] | None = None) -> int:
    """A rank under torchrun; otherwise the launcher of the ranks, or the demo."""
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # set by torchrun
        train(args)
        return 0
    try:  # before torchrun: a missing package fails here once, not in every rank
        import cairn.torch  # noqa: F401
    except MissingExtraError as exc:
        sys.exit(f"torch_train.py: {exc}")
    if args.demo:
        return demo()
    return launch(args, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
