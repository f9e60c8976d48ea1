"""Train with Lightning on cairn: checkpoint every epoch, get killed, resume.

A small regression model trains for ``--epochs`` epochs of 8 steps under Lightning's
``ModelCheckpoint(save_top_k=2, save_last=True)``, with
:class:`cairn.lightning.CairnCheckpointIO` as its checkpoint plugin: each checkpoint is
a cairn checkpoint named as Lightning named its file (``last.ckpt``,
``epoch=2-step=24.ckpt``), every byte verified when it is loaded. Started again after a
crash, the run resumes from the newest ``last.ckpt`` in the store and goes on: the loss
curve is the one an uninterrupted run draws, to the last bit.

One run::

    python examples/lightning_train.py --store ./lightning-run

Killed after step 20 (SIGKILL, like a crash), then resumed::

    python examples/lightning_train.py --store ./b --kill-at 20
    python examples/lightning_train.py --store ./b

The checkpoints go in the store's root (``--prefix`` to put them under a prefix), where
``cairn`` reads by default: ``cairn list --store ./b`` lists them. Lightning's pointer
files (a few hundred bytes each, naming a checkpoint's id) go in ``--pointers``; the
resume reads ``last.ckpt`` by name from the store, so it works without them too.

``python examples/lightning_train.py --demo`` does all three (an uninterrupted run, a
killed one, its resumption) in a temporary directory and compares the loss curves.
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
from pathlib import Path
from typing import Any

STEPS_PER_EPOCH = 8
DEFAULT_EPOCHS = 4


def train(args: argparse.Namespace) -> None:
    """One training run: resume from the store's newest ``last.ckpt`` if there is one."""
    # Only a training run imports torch and Lightning: --help and --demo start at once.
    import logging

    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from cairn import CheckpointNotFoundError
    from cairn.lightning import CairnCheckpointIO

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    class Regression(LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    class Curve(Callback):  # type: ignore[misc]
        """Prints each step's loss (exactly), and kills the process after --kill-at."""

        def on_train_batch_end(
            self, trainer: Trainer, module: Any, outputs: Any, batch: Any, index: int
        ) -> None:
            step = trainer.global_step
            print(f"step {step:3d}  loss {outputs['loss'].item()!r}", flush=True)
            if step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(16 * STEPS_PER_EPOCH, 16, generator=gen)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=16)
    io = CairnCheckpointIO(args.store, prefix=args.prefix)
    last = os.path.join(args.pointers, "last.ckpt")
    try:
        resume_from = io.resolve(last)
    except CheckpointNotFoundError:
        resume_from = None
    if resume_from is not None:
        print(f"resuming from last.ckpt (checkpoint {resume_from})", flush=True)
    trainer = Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        plugins=[io],
        callbacks=[
            ModelCheckpoint(
                dirpath=args.pointers, save_top_k=2, save_last=True, monitor="train_loss"
            ),
            Curve(),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(Regression(), data, ckpt_path=last if resume_from is not None else None)
    print(f"inspect {inspect_command(args)}", flush=True)


def inspect_command(args: argparse.Namespace) -> str:
    """The ``cairn list`` command that lists what this run saved."""
    prefix = [] if args.prefix is None else ["--prefix", args.prefix]
    return shlex.join(["cairn", "list", "--store", args.store, *prefix])


def run(*argv: str, cwd: str) -> subprocess.CompletedProcess[str]:
    """This script, run again as a child in ``cwd``."""
    return subprocess.run(
        [sys.executable, os.path.abspath(__file__), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def curve(stdout: str) -> dict[int, str]:
    """The loss of each step a run printed."""
    return {
        int(line.split()[1]): line.split()[3]
        for line in stdout.splitlines()
        if line.startswith("step ")
    }


def demo(epochs: int) -> int:
    """An uninterrupted run, a run killed after step 20, and its resumption, compared."""
    with tempfile.TemporaryDirectory(prefix="cairn-lightning-") as tmp:
        print("== an uninterrupted run ==")
        whole = run("--store", "a", "--pointers", "a-pointers", "--epochs", str(epochs), cwd=tmp)
        print(whole.stdout, end="")
        if whole.returncode != 0:
            print(whole.stderr, file=sys.stderr)
            return 1
        print("== a run killed after step 20 ==")
        argv = ["--store", "b", "--pointers", "b-pointers", "--epochs", str(epochs)]
        killed = run(*argv, "--kill-at", "20", cwd=tmp)
        print(killed.stdout, end="")
        if killed.returncode != -signal.SIGKILL:
            print(killed.stderr, file=sys.stderr)
            return 1
        print(f"... killed at step 20 (signal {signal.SIGKILL}); the store holds:")
        listed = subprocess.run(
            [sys.executable, "-m", "cairn", "list", "--store", "b", "--json"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
        for row in json.loads(listed.stdout)["checkpoints"]:
            print(f"    {row['name']:<22} step {row['epoch']:3d}  {row['id']}")
        shutil_rmtree(Path(tmp) / "b-pointers")  # a new machine: only the store is left
        print("== the same run started again (no pointer files left) ==")
        resumed = run(*argv, cwd=tmp)
        print(resumed.stdout, end="")
        if resumed.returncode != 0:
            print(resumed.stderr, file=sys.stderr)
            return 1
        # Every step either run printed has the uninterrupted run's loss, and together
        # they print every step.
        reference = curve(whole.stdout)
        runs = [curve(killed.stdout), curve(resumed.stdout)]
        same = all(reference.get(step) == loss for c in runs for step, loss in c.items())
        same = same and set(runs[0]) | set(runs[1]) == set(reference)
        same = same and len(reference) == epochs * STEPS_PER_EPOCH
        print("loss curves identical:", same)
        return 0 if same else 1


def shutil_rmtree(path: Path) -> None:
    """Remove a directory tree."""
    import shutil

    shutil.rmtree(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="lightning_train.py",
        description="Train with Lightning, checkpointing through cairn; resume after a crash.",
    )
    parser.add_argument("--store", default="./checkpoints", help="store URL or directory")
    parser.add_argument(
        "--prefix",
        default=None,
        help="checkpoint prefix inside the store (default: the store's root)",
    )
    parser.add_argument(
        "--pointers",
        default="lightning-ckpts",
        help="ModelCheckpoint's directory, where the pointer files go",
    )
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help="epochs to train")
    parser.add_argument(
        "--kill-at", type=int, default=None, help="SIGKILL this process after that step"
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="run uninterrupted, killed and resumed in a temporary directory; compare",
    )
    return parser.parse_args(argv)


def main() -> int:
    """Parse the command line, then train (or run the demo)."""
    args = parse_args()
    if args.demo:
        return demo(args.epochs)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
