"""Search schedules of cairn's protocol code with the deterministic simulator.

Each schedule runs cairn's real save, save_async, two-phase saves, GC, take_over,
delete, copy and load_latest as concurrent actors on a simulated store, every store
call a scheduling point, with crashes, lost replies, transient failures, stalls and
clock jumps drawn from the schedule's seed (see ``tests/support/sim``). A schedule that
breaks an invariant prints its seed, its violations and its trace; ``--seed S``
replays it exactly.

    python bench/simulate.py --schedules 1000000          # a long search
    python bench/simulate.py --seed 4242 --trace          # replay one schedule
    python bench/simulate.py --schedules 5000 --mutant gc-local-clock   # a historical bug

A long search runs in worker processes (``--jobs``, default: every core), each taking
a share of the seeds, and prints schedules per second as it goes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the simulator lives beside the tests

from support.sim import Outcome, run  # noqa: E402
from support.sim.mutants import MUTANTS  # noqa: E402


def _search(args: tuple[int, int, int, str | None]) -> tuple[int, int, list[Outcome]]:
    """Run seeds ``first, first + stride, ...`` below ``stop``; (schedules, steps, failures)."""
    first, stop, stride, mutant = args
    failures: list[Outcome] = []
    schedules = steps = 0
    for seed in range(first, stop, stride):
        outcome = run(seed, mutant=mutant)
        schedules += 1
        steps += outcome.steps
        if not outcome.ok:
            failures.append(outcome)
    return schedules, steps, failures


def _chunks(start: int, count: int, jobs: int, size: int) -> Iterator[tuple[int, int, int]]:
    """Seed ranges of ``size`` schedules, each split across ``jobs`` strided workers."""
    for low in range(start, start + count, size):
        high = min(low + size, start + count)
        for job in range(jobs):
            yield low + job, high, jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--trace", action="store_true", help="print the whole trace of --seed")
    parser.add_argument("--mutant", choices=sorted(MUTANTS), help="bring back a historical bug")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--show", type=int, default=3, help="failures to print in full")
    args = parser.parse_args(argv)

    if args.seed is not None:
        outcome = run(args.seed, mutant=args.mutant)
        print(outcome.report(last=len(outcome.trace) if args.trace else 60))
        return 0 if outcome.ok else 1

    began = time.perf_counter()
    schedules = steps = 0
    failures: list[Outcome] = []
    chunk = max(1000, min(50_000, args.schedules // 20))
    work = [
        (*bounds, args.mutant) for bounds in _chunks(args.start, args.schedules, args.jobs, chunk)
    ]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for done, done_steps, found in pool.imap(_search, work):
            schedules += done
            steps += done_steps
            failures.extend(found)
            elapsed = time.perf_counter() - began
            print(
                f"{schedules:>10,} schedules  {steps:>13,} steps  {len(failures):>5} failing  "
                f"{schedules / elapsed:8.0f} schedules/s",
                flush=True,
            )
    elapsed = time.perf_counter() - began
    failures.sort(key=lambda outcome: outcome.seed)
    for outcome in failures[: args.show]:
        print(outcome.report())
    print(
        f"{schedules:,} schedules ({steps:,} store calls) in {elapsed:.0f} s with {args.jobs} "
        f"process(es): {schedules / elapsed:.0f} schedules/s; {len(failures)} with violations"
        + (f" (mutant {args.mutant})" if args.mutant else "")
    )
    if failures:
        print("failing seeds:", " ".join(str(o.seed) for o in failures[:50]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
