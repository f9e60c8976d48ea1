"""SIGKILL a real checkpointing process at random points, then check what survived.

``crash_child.py crash`` runs in a separate interpreter and saves checkpoints in a loop;
the test kills it with SIGKILL (no clean-up, no ``finally``, uploads cut mid-flight),
20 times per backend, restarting it each time on the same store. After every kill:

* ``load_latest()`` returns the newest committed checkpoint, computed independently as
  the greatest ``(epoch, id)`` over ``list_checkpoints()`` + ``load_manifest()``, and its
  bytes and source offsets are exactly those of its epoch;
* that epoch is >= every epoch the child reported committed, and every checkpoint it
  reported is still listed; nothing once committed disappears;
* epochs never go backwards across kills, and no epoch is committed twice (which would
  mean a restarted child resumed from a stale checkpoint);
* the restarted child's own ``load_latest()`` saw the same newest checkpoint.

The kill plan (what to wait for, how long to sleep) comes from a seeded RNG; set
``CAIRN_KILL_SEED`` to replay it (the timing of the child still varies), and
``CAIRN_KILLS`` for more kills than 20. The stage of a
save each kill landed in is read off the store afterwards and printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import subprocess
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from support.backends import make_store
from support.children import child_store, start_child, wait_for_line
from support.crash_child import (
    OBJECTS_PER_CHECKPOINT,
    Line,
    expected_artifacts,
    expected_offsets,
    parse_lines,
)
from support.killed import staging_files

from cairn import CheckpointId, CheckpointManifest, ObjectStoreCheckpointer

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

T = TypeVar("T")

KILLS_PER_BACKEND = int(os.environ.get("CAIRN_KILLS", "20"))  # more for a soak run
MAX_SLEEP_BEFORE_KILL = 0.6
CHILD_EXIT_TIMEOUT = 10.0  # a SIGKILLed child must be reaped within this
CHECK_TIMEOUT = 60.0  # the checks after one kill must end within this
SETTLE_QUIET = 0.1  # a killed S3 save's objects must stay unchanged this long


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh event loop, failing rather than hanging."""
    return asyncio.run(asyncio.wait_for(coro, CHECK_TIMEOUT))


def reap(proc: subprocess.Popen[bytes]) -> int:
    """Make sure ``proc`` is dead and reaped; its exit code."""
    if proc.poll() is None:
        proc.kill()
    return proc.wait(timeout=CHILD_EXIT_TIMEOUT)


@dataclass
class StoreHistory:
    """What the test knows of the store across kills (manifests are immutable: cached)."""

    manifests: dict[CheckpointId, CheckpointManifest] = field(default_factory=dict)
    newest: CheckpointManifest | None = None
    stages: collections.Counter[str] = field(default_factory=collections.Counter)
    late_writes: int = 0  # kills after which the store still changed (requests in flight)
    check_seconds: float = 0.0


def classify_kill(
    lines: list[Line],
    listed: set[CheckpointId],
    pointer: CheckpointId | None,
    landed: int,
    partial: int,
) -> str:
    """Where in its life the child was when it died, from its output and the store.

    ``landed`` counts the objects of the save in flight that the store lists, ``partial``
    the files a local store was still writing (obstore's ``name#N`` staging files).
    """
    if not lines:
        return "startup or load_latest (nothing printed)"
    last = lines[-1]
    if last.kind == "restored":
        return "after load_latest, before the first save"
    if last.kind == "committed":
        return "between saves (after printing a commit)"
    assert last.kind == "saving", last
    cid = CheckpointId.parse(last.words[1])
    if cid in listed:
        if pointer == cid:
            return "save: after _latest moved, before save returned"
        return "save: after the manifest (commit), before _latest moved"
    cut = f", {partial} cut mid-write" if partial else ""
    if landed == 0:
        return f"save: before any object landed{cut}"
    return f"save: uploading, {landed}/{OBJECTS_PER_CHECKPOINT} objects landed{cut}"


def in_flight_save(lines: list[Line]) -> CheckpointId | None:
    """The checkpoint the child was saving when it died, if it was saving."""
    if lines and lines[-1].kind == "saving":
        return CheckpointId.parse(lines[-1].words[1])
    return None


async def look(reader: ObjectStoreCheckpointer, saving: CheckpointId) -> tuple[object, ...]:
    """What a killed save could still change: its directory, and ``_latest``."""
    directory = await reader.store.list((await reader.resolve_paths()).checkpoint_dir(saving))
    base = await reader.store.list_dir(reader.paths.base_prefix)
    return (
        sorted((i.path, i.size, i.e_tag) for i in directory),
        sorted((i.path, i.e_tag) for i in base.objects),
    )


async def settle(reader: ObjectStoreCheckpointer, saving: CheckpointId, context: str) -> bool:
    """Wait until the objects the killed save could write stop changing; whether they did.

    A request the child had fully sent before it died may still be carried out by the
    server afterwards (S3 does that too). Only the save in flight writes (``load_latest``
    only reads, and a ``save`` that returned has no request left), so its directory and
    ``_latest`` are watched until they stay the same for ``SETTLE_QUIET`` seconds.
    """
    previous = await look(reader, saving)
    for attempt in range(20):
        await asyncio.sleep(SETTLE_QUIET)
        now = await look(reader, saving)
        if now == previous:
            return attempt > 0
        previous = now
    pytest.fail(f"{context}: the store kept changing after the child was reaped")


async def check_after_kill(
    reader: ObjectStoreCheckpointer,
    history: StoreHistory,
    lines: list[Line],
    context: str,
    local_root: Path | None,
) -> str:
    """Every check of one kill; returns the stage the kill landed in."""
    saving = in_flight_save(lines)
    remote = local_root is None  # a reaped local process has no write left anywhere
    if remote and saving is not None and await settle(reader, saving, context):
        history.late_writes += 1
    settled = await look(reader, saving) if remote and saving is not None else None
    listed = await reader.list_checkpoints()
    missing = set(history.manifests) - set(listed)
    assert not missing, f"{context}: committed checkpoints disappeared: {sorted(missing)}"
    for cid in listed:
        if cid not in history.manifests:
            history.manifests[cid] = await reader.load_manifest(cid)
    manifests = list(history.manifests.values())
    epochs = collections.Counter(m.epoch for m in manifests)
    repeated = sorted(e for e, n in epochs.items() if n > 1)
    assert not repeated, f"{context}: epochs committed twice (a stale resume): {repeated}"

    printed = [line for line in lines if line.kind == "committed"]
    for line in printed:
        cid = CheckpointId.parse(line.words[1])
        assert cid in history.manifests, f"{context}: reported commit {cid} is not listed"
        assert history.manifests[cid].epoch == int(line.words[0]), context
    restored = [line for line in lines if line.kind == "restored"]
    if restored:
        before = history.newest
        expected = (before.epoch, str(before.checkpoint_id)) if before else (-1, "-")
        resumed = (int(restored[0].words[0]), restored[0].words[1])
        assert resumed == expected, (
            f"{context}: the child restored {resumed}, the newest was {expected}"
        )

    newest = max(manifests, key=lambda m: (m.epoch, m.checkpoint_id), default=None)
    latest = await reader.load_latest()
    if newest is None:
        assert latest is None, f"{context}: nothing is committed, yet {latest} loads"
        assert not printed, context
    else:
        assert latest is not None, f"{context}: {newest.checkpoint_id} is committed, none loads"
        assert (latest.epoch, latest.checkpoint_id) == (newest.epoch, newest.checkpoint_id), (
            f"{context}: load_latest gave epoch {latest.epoch} ({latest.checkpoint_id}), "
            f"the newest committed is epoch {newest.epoch} ({newest.checkpoint_id})"
        )
        restored_bytes = {key: bytes(data) for key, data in latest.artifacts.items()}
        assert restored_bytes == expected_artifacts(latest.epoch), f"{context}: wrong bytes"
        assert latest.source_offsets == expected_offsets(latest.epoch), context
        if printed:
            assert latest.epoch >= max(int(line.words[0]) for line in printed), context
        if history.newest is not None:
            assert latest.epoch >= history.newest.epoch, f"{context}: the epoch went backwards"
    history.newest = newest

    if settled is not None and saving is not None:
        assert await look(reader, saving) == settled, f"{context}: a late write during the checks"
    landed = partial = 0
    if saving is not None:
        directory = reader.paths.checkpoint_dir(saving)
        landed = len(await reader.store.list(directory))
        if local_root is not None and (local_root / directory).is_dir():
            partial = len(staging_files(local_root / directory))
    pointer = await reader.read_latest()
    return classify_kill(lines, set(listed), pointer, landed, partial)


@pytest.mark.parametrize("kind", ["local", "s3", "gcs"])
def test_sigkill_at_random_points_never_loses_a_commit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("CAIRN_KILL_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    reader = ObjectStoreCheckpointer(make_store(kind, tmp_path, request))
    where = child_store(kind, tmp_path, request)
    history = StoreHistory()
    local_root = tmp_path / "store" if kind == "local" else None
    logs = tmp_path / "children"
    logs.mkdir()
    began = time.monotonic()
    for kill in range(KILLS_PER_BACKEND):
        # Mostly after a commit (kills then land anywhere in the next saves), sometimes
        # right after the restore, sometimes blind (may land in startup or load_latest).
        wait_for = rng.choices(["committed", "restored", None], weights=[6, 3, 1])[0]
        delay = rng.uniform(0, MAX_SLEEP_BEFORE_KILL)
        context = (
            f"[{kind}] CAIRN_KILL_SEED={seed} kill {kill + 1}/{KILLS_PER_BACKEND} "
            f"(after {wait_for or 'start'} + {delay:.3f}s)"
        )
        out, err = logs / f"{kill}.out", logs / f"{kill}.err"
        proc = start_child(["crash"], where["store"], where["env"], out, err)
        try:
            if wait_for is not None:
                wait_for_line(proc, out, wait_for, context, err)
            time.sleep(delay)
            alive = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
        finally:
            code = reap(proc)
        assert alive and code == -signal.SIGKILL, (
            f"{context}: the child was not killed but exited with {code}; "
            f"stderr:\n{err.read_text()}"
        )
        lines = parse_lines(out.read_bytes())
        checking = time.monotonic()
        stage = run(check_after_kill(reader, history, lines, context, local_root))
        history.check_seconds += time.monotonic() - checking
        history.stages[stage] += 1
    elapsed = time.monotonic() - began
    assert history.newest is not None, f"[{kind}] seed={seed}: nothing was ever committed"
    print(
        f"\n[{kind}] seed={seed}: {KILLS_PER_BACKEND} kills in {elapsed:.1f}s "
        f"({history.check_seconds:.1f}s checking), "
        f"{len(history.manifests)} checkpoints committed, newest epoch {history.newest.epoch}, "
        f"store still changed after {history.late_writes} kills"
    )
    for stage, count in sorted(history.stages.items()):
        print(f"  {count:3d} x {stage}")
    if local_root is not None:
        leftovers = staging_files(local_root)
        print(f"  {len(leftovers)} partial files left behind, invisible to listings")
