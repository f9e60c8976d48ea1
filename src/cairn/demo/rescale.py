"""``cairn demo --workers N --rescale-to M``: kill a keyed job on N workers, restore it on M.

The sequence, every step through cairn's public API:

1. start the keyed job (:mod:`cairn.demo.keyed`) on ``N`` workers as a child process,
   with its stream paced over ``--stream-seconds``; SIGKILL it at a random moment (after
   its k-th checkpoint, plus a random part of one interval, as the plain demo does);
2. restart it on ``M`` workers: it plans the restore of the latest checkpoint onto ``M``
   (``restore_plan``), and each new worker reads exactly its key groups
   (``load_assignment``), reporting the bytes it read against the bytes its groups take;
3. the restarted job deals the source splits again to its ``M`` workers, each resuming
   at its recorded offset, and runs to the end, its checkpoints carrying unchanged
   groups by reference;
4. every group of the final checkpoint is read (``load_key_groups``) and compared with
   an uninterrupted single-worker run over the same stream, computed here.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cairn.cli.errors import CliError, ExitCode
from cairn.cli.output import human_size
from cairn.cli.session import open_checkpointer
from cairn.demo.children import (
    PHASE_TIMEOUT,
    ChildRun,
    Kill,
    child_failed,
    finish,
    kill_at_random,
    spawn,
)
from cairn.demo.keyed import (
    KEY_GROUPS,
    OPERATOR,
    SPLITS,
    counts_digest,
    decode_group,
    reference_counts,
)

__all__ = ["RescaleSettings", "rescale_view", "run_rescale_demo"]


@dataclass(frozen=True)
class RescaleSettings:
    """What ``cairn demo --rescale-to`` runs: the stream, the parallelisms, the store."""

    url: str
    prefix: str
    seed: int
    events: int
    checkpoint_every: int
    stream_seconds: float
    workers: int
    rescale_to: int

    @property
    def per_split(self) -> int:
        """Events per source split (the stream is cut into :data:`SPLITS`)."""
        return math.ceil(self.events / SPLITS)

    @property
    def every_ticks(self) -> int:
        """Ticks (one event of every split) between checkpoints."""
        return max(1, self.checkpoint_every // SPLITS)

    @property
    def checkpoints(self) -> int:
        """How many checkpoints an uninterrupted run makes."""
        return math.ceil(self.per_split / self.every_ticks)

    def child_command(self, workers: int, paced: bool) -> list[str]:
        """The command line of the keyed job on ``workers`` workers.

        Args:
            workers: How many workers the job runs.
            paced: Whether its stream is paced over ``stream_seconds``.

        Returns:
            The command line.
        """
        return [
            sys.executable,
            "-m",
            "cairn.demo.keyed",
            "--store",
            self.url,
            "--prefix",
            self.prefix,
            "--seed",
            str(self.seed),
            "--per-split",
            str(self.per_split),
            "--checkpoint-every",
            str(self.every_ticks),
            "--workers",
            str(workers),
            "--stream-seconds",
            str(self.stream_seconds if paced else 0.0),
        ]


async def _run_killed(settings: RescaleSettings, rng: random.Random) -> tuple[ChildRun, Kill]:
    proc = await spawn(settings.child_command(settings.workers, paced=True))
    run_, kill = await kill_at_random(proc, settings.stream_seconds, settings.checkpoints, rng)
    if not kill.killed and run_.returncode != 0:
        child_failed("the keyed demo job", run_)
    return run_, kill


async def run_rescale_demo(settings: RescaleSettings, rng: random.Random) -> dict[str, Any]:
    """Run the rescaling demo and return its report (the ``--json`` document).

    Args:
        settings: What to run.
        rng: Where the kill moment comes from.

    Returns:
        The report.

    Raises:
        CliError: The prefix holds checkpoints, or a job failed.
    """
    began = time.monotonic()
    ckpt = open_checkpointer(settings.url, settings.prefix, create=True)
    if await ckpt.list_checkpoints():
        raise CliError(
            f"prefix {settings.prefix!r} of {settings.url} already holds checkpoints; "
            "the demo needs an empty one",
            ExitCode.USAGE,
        )
    first, kill = await _run_killed(settings, rng)
    proc = await spawn(settings.child_command(settings.rescale_to, paced=False))
    recovery = ChildRun()
    await finish(proc, recovery, time.monotonic() + PHASE_TIMEOUT)
    if recovery.returncode != 0:
        child_failed("the restarted keyed demo job", recovery)
    [start] = recovery.of_type("start")
    latest = await ckpt.latest_id()
    if latest is None:
        raise CliError("the restarted job left no checkpoint", ExitCode.INTEGRITY)
    manifest = await ckpt.load_manifest(latest)
    groups = await ckpt.load_key_groups(latest, OPERATOR, range(KEY_GROUPS.count))
    final = {user: n for data in groups.values() for user, n in decode_group(data).items()}
    reference = reference_counts(settings.seed, settings.per_split)
    offsets = [int(v) for v in manifest.source_offsets["events"].offsets.values()]
    done = recovery.of_type("done")
    exactly_once = (
        final == reference
        and offsets == [settings.per_split] * SPLITS
        and bool(done)
        and done[-1]["state_sha256"] == counts_digest(reference)
    )
    return {
        "exactly_once": exactly_once,
        "store": settings.url,
        "prefix": settings.prefix,
        "seed": settings.seed,
        "events": settings.per_split * SPLITS,
        "source_splits": SPLITS,
        "key_groups": KEY_GROUPS.count,
        "workers": settings.workers,
        "rescale_to": settings.rescale_to,
        "kill": {
            "signal": "SIGKILL",
            "killed": kill.killed,
            "pid": kill.pid,
            "after_checkpoints": kill.after_checkpoints,
            "delay_ms": kill.delay_ms,
            "exit_status": first.returncode,
        },
        "restored": {**(start["restored"] or {}), "reads": start.get("reads", [])}
        if start["restored"]
        else None,
        "checkpoints": [
            {k: m[k] for k in ("id", "epoch", "offset", "workers", "uploaded_bytes")}
            for m in first.of_type("checkpoint") + recovery.of_type("checkpoint")
        ],
        "final": {
            "id": str(latest),
            "epoch": manifest.epoch,
            "keys": len(final),
            "state_sha256": counts_digest(final),
        },
        "reference_state_sha256": counts_digest(reference),
        "elapsed_seconds": round(time.monotonic() - began, 2),
    }


def rescale_view(report: dict[str, Any]) -> RenderableType:
    """The report in words, for a terminal.

    Args:
        report: What :func:`run_rescale_demo` returned.

    Returns:
        What to print.
    """
    kill, restored = report["kill"], report["restored"]
    lines: list[RenderableType] = [
        Text(
            f"cairn demo: events per user in {report['key_groups']} key groups, "
            f"{report['events']:,} events from {report['source_splits']} source splits "
            f"(seed {report['seed']}), on {report['workers']} workers, restored on "
            f"{report['rescale_to']}"
        ),
        Text(f"store {report['store']}, prefix {report['prefix']!r}"),
        Text(f"{len(report['checkpoints'])} checkpoints made"),
    ]
    if kill["killed"]:
        lines.append(
            Text(
                f"killed the job on {report['workers']} workers (pid {kill['pid']}) with "
                f"SIGKILL {kill['delay_ms']} ms after its checkpoint #{kill['after_checkpoints']}"
            )
        )
    else:
        lines.append(Text("the job finished before the kill landed", style="yellow"))
    if restored:
        lines.append(
            Text(
                f"restored checkpoint {restored['id']} (epoch {restored['epoch']}) on "
                f"{report['rescale_to']} workers; the plan read "
                f"{human_size(restored['plan_bytes'])} (manifest and range indexes):"
            )
        )
        for read in restored["reads"]:
            start, stop = read["groups"]
            lines.append(
                Text(
                    f"  worker {read['worker']}: key groups {start}..{stop - 1}, read "
                    f"{human_size(read['read_bytes'])} for {human_size(read['group_bytes'])} "
                    "of state"
                )
            )
    final = report["final"]
    if report["exactly_once"]:
        lines.append(
            Text(
                "exactly-once: YES — the final state on "
                f"{report['rescale_to']} workers equals an uninterrupted single-worker run's "
                f"({final['keys']:,} keys, sha256 {final['state_sha256'][:16]}…)",
                style="bold green",
            )
        )
    else:
        lines.append(
            Text(
                "exactly-once: NO — the final state differs from the uninterrupted run's "
                f"(sha256 {final['state_sha256'][:16]}… vs "
                f"{report['reference_state_sha256'][:16]}…)",
                style="bold red",
            )
        )
    return Group(*lines)
