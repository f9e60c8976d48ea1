"""How long a job is blocked by a checkpoint: save_async against save, same run.

    python bench/bench_background.py [--quick] [--json out.json] [--reps N]

Two measurements on a local directory (a fresh temp dir per round, removed after it):

* blocked: the wall time until ``save_async`` returns (the data handed over) against the
  time ``save`` takes, for 256 MiB (32 artifacts of 8 MiB). Target: under 50 ms blocked.
* steps/s: a toy training loop of 40 steps, each 25 ms of work (a sleep, as a GPU step
  leaves the CPU free), that checkpoints 8 MiB every 4 steps with ``save`` (the loop
  waits) or ``save_async`` (it goes on; back-pressure if a save is still running).

Interleaved rounds after a discarded warm-up; medians. The disk sets the pace of the save
itself (see DESIGN.md's notes on measuring here): this measures what the job waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_background.py``
    sys.path.insert(0, str(REPO))

from bench.harness import MiB, table  # noqa: E402
from cairn import CheckpointData, ObjectStoreCheckpointer  # noqa: E402

ARTIFACTS = 32
STEPS, EVERY, STEP_SECONDS = 40, 4, 0.025


async def blocked(parts: list[bytes], background: bool) -> tuple[float, float]:
    """(seconds the caller was blocked, seconds until the checkpoint was committed)."""
    root = tempfile.mkdtemp(prefix="cairn-bench-bg-")
    try:
        ckpt = ObjectStoreCheckpointer(root)
        data = CheckpointData(epoch=1, snapshots={("op", i): p for i, p in enumerate(parts)})
        began = time.perf_counter()
        if background:
            task = await ckpt.save_async(data)
            handed = time.perf_counter() - began
            await task
        else:
            await ckpt.save(data)
            handed = time.perf_counter() - began
        return handed, time.perf_counter() - began
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def steps_per_second(state: bytes, background: bool) -> float:
    root = tempfile.mkdtemp(prefix="cairn-bench-bg-")
    try:
        ckpt = ObjectStoreCheckpointer(root)
        began = time.perf_counter()
        for step in range(1, STEPS + 1):
            await asyncio.sleep(STEP_SECONDS)
            if step % EVERY == 0:
                data = CheckpointData(epoch=step, snapshots={("model", 0): state})
                if background:
                    await ckpt.save_async(data)
                else:
                    await ckpt.save(data)
        await ckpt.wait_for_saves()
        return STEPS / (time.perf_counter() - began)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def run(reps: int) -> dict[str, Any]:
    parts = [os.urandom(8 * MiB) for _ in range(ARTIFACTS)]
    state = os.urandom(8 * MiB)
    results: dict[str, list[float]] = {
        k: [] for k in ("save", "save_async", "loop save", "loop save_async")
    }
    committed: dict[str, list[float]] = {"save": [], "save_async": []}
    for rnd in range(reps + 1):
        order = [False, True] if rnd % 2 else [True, False]
        for background in order:
            os.sync()
            await asyncio.sleep(0.5)
            handed, done = await blocked(parts, background)
            rate = await steps_per_second(state, background)
            if rnd:
                name = "save_async" if background else "save"
                results[name].append(handed)
                committed[name].append(done)
                results[f"loop {name}"].append(rate)
    return {
        "reps": reps,
        "blocked_s": {k: statistics.median(results[k]) for k in ("save", "save_async")},
        "committed_s": {k: statistics.median(v) for k, v in committed.items()},
        "steps_per_s": {k: statistics.median(results[f"loop {k}"]) for k in ("save", "save_async")},
        "raw": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 5, 3 with --quick)")
    args = parser.parse_args()
    out = asyncio.run(run(args.reps or (3 if args.quick else 5)))
    blocked_ms = {k: v * 1000 for k, v in out["blocked_s"].items()}
    print(
        table(
            ["variant", "blocked ms (256 MiB)", "committed after s", "toy loop steps/s"],
            [
                [
                    k,
                    f"{blocked_ms[k]:.1f}",
                    f"{out['committed_s'][k]:.2f}",
                    f"{out['steps_per_s'][k]:.1f}",
                ]
                for k in ("save", "save_async")
            ],
        )
    )
    verdict = "yes" if blocked_ms["save_async"] < 50 else "MISSED"
    print(f"target: save_async blocked < 50 ms: {verdict}")
    text = json.dumps(out, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
