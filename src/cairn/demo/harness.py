"""``cairn demo``: kill a checkpointing job at a random moment and prove exactly-once.

The sequence, every step through cairn's public API:

1. start the job (:mod:`cairn.demo.job`) as a child process, on a fresh prefix of the store,
   with its stream paced over ``--stream-seconds``;
2. pick the kill moment at random: after the child reports its k-th checkpoint
   (k uniform in 1..n-2 of the n it would make), plus a random part of one checkpoint
   interval, so the kill lands while it processes events or while it uploads; then
   ``SIGKILL`` it;
3. restart the job in a new child process: it restores from ``load_latest`` (every
   digest verified), replays the stream from the restored source offset, and
   checkpoints to the end;
4. load the final checkpoint, rebuild the state from its restore chains, and compare it
   with an uninterrupted run over the same stream computed here: equal means every
   event was counted exactly once, across the crash.

Each run writes under its own prefix, ``demo/<time>-<random>/`` of the store
(``./checkpoints`` by default), so runs never mix. The other commands find the newest
run by themselves when they are given no ``--prefix`` and nothing is under the default
one (:mod:`cairn.cli.session`): after ``cairn demo``, a bare ``cairn list`` shows it.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.text import Text

from cairn import CheckpointId, ObjectStoreCheckpointer
from cairn.cli.catalog import read_manifests
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.limits import at_least, check_seconds, integer
from cairn.cli.output import Col, human_size, make_table
from cairn.cli.progress import Transfer
from cairn.cli.session import (
    DEMO_PREFIX,
    Session,
    newest_demo_run,
    open_checkpointer,
    run,
)
from cairn.cli.views import kind
from cairn.demo.children import (
    PHASE_TIMEOUT,
    ChildRun,
    Kill,
    child_failed,
    finish,
    kill_at_random,
    spawn,
)
from cairn.demo.job import (
    OPERATORS,
    PARTITIONS,
    SOURCE,
    SPLIT,
    reference_pipeline,
    restore_pipeline,
    restored_offset,
)
from cairn.demo.keyed import SPLITS
from cairn.demo.rescale import RescaleSettings, rescale_view, run_rescale_demo
from cairn.protocol.discover import checkpoint_counts, checkpoint_dirs, default_paths, short_ids

__all__ = ["DemoSettings", "demo_command", "run_demo"]


@dataclass(frozen=True)
class DemoSettings:
    """What ``cairn demo`` runs: the stream, the checkpoint cadence, the store."""

    url: str
    prefix: str
    seed: int
    events: int
    checkpoint_every: int
    full_every: int
    stream_seconds: float
    default_store: bool = False

    @property
    def checkpoints(self) -> int:
        """How many checkpoints an uninterrupted run makes (the last at the stream's end)."""
        return math.ceil(self.events / self.checkpoint_every)

    def child_command(self, paced: bool) -> list[str]:
        """The command line of the job's process."""
        return [
            sys.executable,
            "-m",
            "cairn.demo.job",
            "--store",
            self.url,
            "--prefix",
            self.prefix,
            "--seed",
            str(self.seed),
            "--events",
            str(self.events),
            "--checkpoint-every",
            str(self.checkpoint_every),
            "--full-every",
            str(self.full_every),
            "--stream-seconds",
            str(self.stream_seconds if paced else 0.0),
        ]


async def run_killed(settings: DemoSettings, rng: random.Random) -> tuple[ChildRun, Kill]:
    """The first run: started, then SIGKILLed at a random moment."""
    proc = await spawn(settings.child_command(paced=True))
    run_, kill = await kill_at_random(proc, settings.stream_seconds, settings.checkpoints, rng)
    if not kill.killed and run_.returncode != 0:
        child_failed("the demo job", run_)
    return run_, kill


async def run_recovery(settings: DemoSettings) -> ChildRun:
    """The restart: a new process that restores, replays and finishes the stream."""
    proc = await spawn(settings.child_command(paced=False))
    run_ = ChildRun()
    await finish(proc, run_, time.monotonic() + PHASE_TIMEOUT)
    if run_.returncode != 0:
        child_failed("the restarted demo job", run_)
    return run_


async def _checkpoint_rows(
    ckpt: ObjectStoreCheckpointer, first: ChildRun, recovery: ChildRun, restored: str | None
) -> list[dict[str, Any]]:
    recovered_ids = {m["id"] for m in recovery.of_type("checkpoint")}
    reported_first = {m["id"] for m in first.of_type("checkpoint")}
    rows: list[dict[str, Any]] = []
    for listed in await read_manifests(ckpt, await ckpt.list_checkpoints()):
        manifest = listed.manifest
        if manifest is None:
            continue
        cid = str(manifest.checkpoint_id)
        counts = checkpoint_counts(manifest)
        offset = manifest.source_offsets.get(SOURCE)
        if cid in recovered_ids:
            made_by = "restarted job"
        elif cid in reported_first:
            made_by = "first job"
        else:
            made_by = "first job (committed as it was killed)"
        rows.append(
            {
                "id": cid,
                "epoch": manifest.epoch,
                "offset": int(offset.offsets[SPLIT]) if offset else None,
                "kind": kind(manifest),
                "made_by": made_by,
                "uploaded": counts.uploaded_artifacts,
                "carried": counts.unchanged_partitions,
                "uploaded_bytes": counts.uploaded_bytes,
                "artifacts": counts.artifacts,
                "carried_artifacts": counts.carried_artifacts,
                "restored": cid == restored,
            }
        )
    return rows


async def run_demo(settings: DemoSettings, rng: random.Random) -> dict[str, Any]:
    """Run the whole demo and return its report (the ``--json`` document)."""
    began = time.monotonic()
    ckpt = open_checkpointer(settings.url, settings.prefix, create=True)
    if await ckpt.list_checkpoints():
        raise CliError(
            f"prefix {settings.prefix!r} of {settings.url} already holds checkpoints; "
            "the demo needs an empty one",
            ExitCode.USAGE,
        )
    first, kill = await run_killed(settings, rng)
    recovery = await run_recovery(settings)
    [start] = recovery.of_type("start")
    restored = start["restored"]
    final = await ckpt.load_latest()
    if final is None:
        raise CliError("the restarted job left no checkpoint", ExitCode.INTEGRITY)
    recovered = restore_pipeline(final)
    reference = reference_pipeline(settings.seed, settings.events)
    final_offset = restored_offset(final)
    done = recovery.of_type("done")
    exactly_once = (
        recovered.state == reference.state
        and final_offset == settings.events
        and bool(done)
        and done[-1]["state_sha256"] == reference.digest()
    )
    restored_id = restored["id"] if restored else None
    return {
        "exactly_once": exactly_once,
        "store": settings.url,
        "prefix": settings.prefix,
        "seed": settings.seed,
        "events": settings.events,
        "checkpoint_every": settings.checkpoint_every,
        "full_every": settings.full_every,
        "operators": list(OPERATORS),
        "partitions_per_operator": PARTITIONS,
        "kill": {
            "signal": "SIGKILL",
            "killed": kill.killed,
            "pid": kill.pid,
            "after_checkpoints": kill.after_checkpoints,
            "delay_ms": kill.delay_ms,
            "exit_status": first.returncode,
        },
        "restored": restored,
        "replayed_events": settings.events - (restored["offset"] if restored else 0),
        "checkpoints": await _checkpoint_rows(ckpt, first, recovery, restored_id),
        "final": {
            "id": str(final.checkpoint_id),
            "epoch": final.epoch,
            "offset": final_offset,
            "keys": recovered.keys(),
            "state_sha256": recovered.digest(),
        },
        "reference_state_sha256": reference.digest(),
        "elapsed_seconds": round(time.monotonic() - began, 2),
        "inspect": await _inspect_hint(ckpt, settings),
    }


async def _inspect_hint(ckpt: ObjectStoreCheckpointer, settings: DemoSettings) -> str:
    """The shortest ``cairn list`` that shows this run's checkpoints."""
    command = "cairn list"
    if not settings.default_store:
        command += f" --store {settings.url}"
    found_alone = (
        not await checkpoint_dirs(ckpt.store, await default_paths(ckpt.store))
        and await newest_demo_run(ckpt.store) == settings.prefix
    )
    if not found_alone:
        command += f" --prefix {settings.prefix}"
    return command


def _artifacts(artifacts: int, uploaded: int) -> str:
    """As ``cairn list`` says it: ``22 (10 new)``, or ``12`` when all are new."""
    return str(artifacts) + (f" ({uploaded} new)" if uploaded != artifacts else "")


def _report_view(report: dict[str, Any]) -> RenderableType:
    table = make_table(
        "checkpoints made",
        Col(">#", 5),
        Col("ID", whole=True),
        Col("Made by", 4),
        ">Epoch",
        Col(">Offset", 3),
        Col("Kind", 2),
        Col(">Artifacts", 2),
        Col(">Uploaded", 3),
        Col("", 1),
    )
    names = {
        str(c): text
        for c, text in short_ids(CheckpointId(row["id"]) for row in report["checkpoints"]).items()
    }
    for number, row in enumerate(report["checkpoints"], start=1):
        table.add_row(
            Text(str(number)),
            Text(names[row["id"]]),
            Text(row["made_by"]),
            Text(str(row["epoch"])),
            Text(f"{row['offset']:,}"),
            Text(row["kind"]),
            Text(_artifacts(row["artifacts"], row["uploaded"])),
            Text(human_size(row["uploaded_bytes"])),
            Text("◀ restored" if row["restored"] else "", style="bold"),
        )
    kill = report["kill"]
    restored = report["restored"]
    lines: list[RenderableType] = [
        Text(
            f"cairn demo: {len(report['operators'])} operators of "
            f"{report['partitions_per_operator']} partitions each, {report['events']:,} events "
            f"(seed {report['seed']}), a checkpoint every {report['checkpoint_every']:,} events, "
            f"full snapshots every {report['full_every']} checkpoints"
        ),
        Text(f"store {report['store']}, prefix {report['prefix']!r}"),
        table,
    ]
    if kill["killed"]:
        lines.append(
            Text(
                f"killed the job (pid {kill['pid']}) with SIGKILL "
                f"{kill['delay_ms']} ms after its checkpoint #{kill['after_checkpoints']}"
            )
        )
    else:
        lines.append(Text("the job finished before the kill landed", style="yellow"))
    if restored:
        lines.append(
            Text(
                f"restarted: restored checkpoint {restored['id']} (epoch {restored['epoch']}, "
                f"source offset {restored['offset']:,}), replayed {report['replayed_events']:,} "
                "events"
            )
        )
    final = report["final"]
    if report["exactly_once"]:
        verdict = Text(
            f"exactly-once: YES — the recovered final state equals the uninterrupted run's "
            f"({final['keys']:,} keys, sha256 {final['state_sha256'][:16]}…)",
            style="bold green",
        )
    else:
        verdict = Text(
            "exactly-once: NO — the recovered final state differs from the uninterrupted "
            f"run's (sha256 {final['state_sha256'][:16]}… vs "
            f"{report['reference_state_sha256'][:16]}…)",
            style="bold red",
        )
    lines.append(verdict)
    lines.append(
        Text(
            f"inspect it: {report['inspect']} (then show latest, verify --all, restore "
            "latest --to DIR)",
            style="dim",
        )
    )
    return Group(*lines)


def _run_prefix() -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{DEMO_PREFIX}{stamp}-{secrets.token_hex(3)}/"


def demo_command(
    events: Annotated[int, at_least("--events", 3, "Events in the generated stream.")] = 20_000,
    seed: Annotated[
        int,
        typer.Option("--seed", metavar="N", parser=integer(), help="Seed of the generated stream."),
    ] = 42,
    checkpoint_every: Annotated[
        int | None,
        at_least("--checkpoint-every", 1, "Events between checkpoints. \\[default: events/10]"),
    ] = None,
    full_every: Annotated[
        int, at_least("--full-every", 1, "A full snapshot every N checkpoints.")
    ] = 4,
    stream_seconds: Annotated[
        float,
        typer.Option(
            "--stream-seconds",
            metavar="SECONDS",
            min=0.1,
            callback=check_seconds,
            help="How long the stream takes to arrive.",
        ),
    ] = 3.0,
    workers: Annotated[
        int | None,
        at_least(
            "--workers", 1, "Run the keyed job on N workers (see --rescale-to). \\[default: 4]"
        ),
    ] = None,
    rescale_to: Annotated[
        int | None,
        at_least(
            "--rescale-to", 1, "Restart the keyed job on M workers, each reading its key groups."
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            envvar="CAIRN_STORE",
            metavar="URL",
            help="Store URL or local path. \\[default: ./checkpoints]",
            show_default=False,
        ),
    ] = None,
    prefix: Annotated[
        str | None,
        typer.Option(
            "--prefix",
            metavar="PREFIX",
            help="An empty prefix for this run. \\[default: demo/<time>-<random>/]",
            show_default=False,
        ),
    ] = None,
    json_mode: Annotated[
        bool, typer.Option("--json", help="Print one JSON document (a failure included).")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Run a streaming job, SIGKILL it at a random moment, restart it, prove exactly-once.

    The job checkpoints into a fresh prefix of the store (demo/<time>-<random>/ of
    ./checkpoints by default); after it, a bare `cairn list` shows the run. Exits with 0
    when the restarted job's final state equals an uninterrupted run's, 1 otherwise.
    With --workers or --rescale-to, the job counts events per user in key groups on N
    workers and is restarted on M.
    """
    session = Session.create(store, prefix or _run_prefix(), json_mode, debug)

    async def body() -> ExitCode:
        url = session.parse()
        if url.startswith("memory:"):
            raise CliError(
                "the demo restarts its job in a new process: a memory:// store would not "
                "survive; use a directory or a remote store",
                ExitCode.USAGE,
            )
        every = checkpoint_every or max(1, events // 10)
        if workers is not None or rescale_to is not None:
            return await _rescale(url, every, workers or 4, rescale_to or workers or 4)
        settings = DemoSettings(
            url=url,
            prefix=session.prefix,
            seed=seed,
            events=events,
            checkpoint_every=every,
            full_every=full_every,
            stream_seconds=stream_seconds,
            default_store=session.default_store,
        )
        if settings.checkpoints < 3:
            raise CliError(
                f"{events} events with a checkpoint every {every} make fewer than 3 "
                "checkpoints: lower --checkpoint-every",
                ExitCode.USAGE,
            )
        return await _reported(run_demo(settings, random.Random()), _report_view)

    async def _rescale(url: str, every: int, before: int, after: int) -> ExitCode:
        settings = RescaleSettings(
            url=url,
            prefix=session.prefix,
            seed=seed,
            events=events,
            checkpoint_every=every,
            stream_seconds=stream_seconds,
            workers=before,
            rescale_to=after,
        )
        if settings.checkpoints < 3:
            raise CliError(
                f"{events} events with a checkpoint every {every} make fewer than 3 "
                f"checkpoints of the keyed job ({SPLITS} source splits): lower "
                "--checkpoint-every or raise --events",
                ExitCode.USAGE,
            )
        return await _reported(run_rescale_demo(settings, random.Random()), rescale_view)

    async def _reported(
        demo: Awaitable[dict[str, Any]], view: Callable[[dict[str, Any]], RenderableType]
    ) -> ExitCode:
        """Run ``demo`` under a progress line, print its report, and exit by its verdict."""
        async with Transfer(session.output.err, "running the demo job", None, unit=""):
            report = await demo
        session.output.json(report)
        session.output.show(view(report))
        if report["exactly_once"]:
            return ExitCode.OK
        session.output.fail(
            "IntegrityError",
            "the recovered final state differs from the uninterrupted run's",
            ExitCode.INTEGRITY,
        )
        return ExitCode.INTEGRITY

    run(session, body)
