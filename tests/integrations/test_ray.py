"""Streaming on Ray (``cairn.ray``), on a local Ray of 2 CPUs started once for the module.

The job is the word count of ``examples/ray_wordcount.py`` (its classes, loaded from the
file) over a short stream. Every test ends by comparing the counts of the latest
checkpoint with a single-process count of the whole stream, and checks with
``cairn verify --all`` that every checkpoint the job committed is sound.

Failures are real: partition actors are killed with ``ray.kill`` (Ray restarts them
empty) or SIGKILLed from inside, at the phase of an epoch a test names, by a hook the
coordinator calls at each step of an epoch (``on_event``) or by a store that kills its
own process on a partition's upload.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.cli import cairn
from support.paths import REPO

from cairn import (
    CheckpointId,
    CheckpointPaths,
    FencedError,
    InvalidInputError,
    KeyGroups,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    SyncCheckpointer,
    commit_distributed,
)
from cairn.stores import ForwardingStore, Store, StoreMethod, as_store, open_store

ray = pytest.importorskip("ray", reason="cairn.ray needs ray (the ray extra)")
cairn_ray = pytest.importorskip("cairn.ray", reason="cairn.ray needs ray (the ray extra)")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(240)]

EVENTS = 16 * 120  # 120 words in each of the 16 source partitions
BATCH = 30
SEED = 11
EXAMPLE = REPO / "examples" / "ray_wordcount.py"
LEASE = dt.timedelta(seconds=1)


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ray_wordcount_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


wordcount = _load_example()


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[str]:
    """One local Ray for the module; its address."""
    # Ray's workers import this module's classes by value, and cairn from where we do.
    ray.cloudpickle.register_pickle_by_value(wordcount)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    source = str(REPO / "src")
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (source, path) if p)
    try:
        context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as exc:  # Ray cannot start here: say why
        pytest.skip(f"a local Ray cannot start: {exc}")
    try:
        yield str(context.address_info["gcs_address"])
    finally:
        ray.shutdown()
        os.environ["PYTHONPATH"] = path


def make_job(store: str | Callable[[], Store], workers: int, **options: Any) -> Any:
    return cairn_ray.StreamJob(
        store,
        wordcount.WordCount,
        wordcount.WordSource(SEED, EVENTS),
        workers=workers,
        key_groups=wordcount.KEY_GROUPS,
        operator=wordcount.OPERATOR,
        batch=BATCH,
        **options,
    )


def latest_counts(store: str) -> tuple[dict[str, int], dict[str, str], int]:
    """The counts, source offsets and epoch of the latest checkpoint."""
    with SyncCheckpointer(store, CheckpointPaths("")) as ckpt:
        latest = ckpt.latest_id()
        assert latest is not None
        manifest = ckpt.load_manifest(latest)
        groups = ckpt.load_key_groups(latest, wordcount.OPERATOR, range(128))
    counts: dict[str, int] = {}
    for data in groups.values():
        counts.update(wordcount.decode(data))
    return counts, dict(manifest.source_offsets["words"].offsets), manifest.epoch


def latest_id(store: str) -> str | None:
    with SyncCheckpointer(store, CheckpointPaths("")) as ckpt:
        latest = ckpt.latest_id()
    return None if latest is None else str(latest)


def partitions_of(store: str, checkpoint: str) -> int:
    with SyncCheckpointer(store, CheckpointPaths("")) as ckpt:
        manifest = ckpt.load_manifest(checkpoint)
    return len({e.partition_id for e in manifest.operators[wordcount.OPERATOR].partitions})


def assert_exactly_once(store: str) -> None:
    counts, offsets, _ = latest_counts(store)
    assert counts == wordcount.reference_counts(SEED, EVENTS)
    assert offsets == {str(p): str(EVENTS // 16) for p in range(16)}
    run = cairn("verify", "--all", "--store", store, "--prefix", "", "--json")
    assert run.code == 0, run.explain()
    report = run.json()
    assert report["ok"] and report["checkpoints"]
    assert all(c["status"] == "ok" for c in report["checkpoints"])


def committed_and_uncommitted(store: str) -> tuple[set[str], set[str]]:
    """The committed checkpoints and the uncommitted directories of the store."""
    with SyncCheckpointer(store, CheckpointPaths("")) as ckpt:
        committed = {str(c) for c in ckpt.list_checkpoints()}
        dirs = {str(c) for c in ckpt.list_checkpoint_dirs()}
    return committed, dirs - committed


# -- the hooks that kill, in the coordinator or in a partition actor -----------------------


async def kill_and_wait(actor: Any) -> None:
    """``ray.kill`` a partition actor and wait until Ray has restarted it (empty)."""
    _, before = await actor.ping.remote()
    ray.kill(actor, no_restart=False)
    while True:
        try:
            _, now = await actor.ping.remote()
            if now != before:
                return
        except ray.exceptions.RayError:
            pass
        await asyncio.sleep(0.05)


class KillAt:
    """Kill partition ``worker`` once, when the coordinator reaches ``kind`` of ``epoch``."""

    def __init__(self, kind: str, epoch: int, worker: int) -> None:
        self.kind, self.epoch, self.worker, self.fired = kind, epoch, worker, False

    def __call__(self, event: Any) -> Awaitable[None] | None:
        wanted = (self.kind, self.epoch) == (event.kind, event.epoch)
        if self.fired or not wanted or event.worker not in (None, self.worker):
            return None
        self.fired = True
        return kill_and_wait(event.actors[self.worker])


class ArmedStore(ForwardingStore):
    """Acts (:meth:`act`) at the upload of ``worker``'s partition, once ``armed`` exists
    (the file is taken first, so it acts once)."""

    def __init__(self, inner: Store, armed: Path, worker: int) -> None:
        super().__init__(inner)
        self.armed, self.worker = armed, worker

    async def _around(
        self, operation: StoreMethod, path: str, call: Callable[[], Awaitable[Any]], **_: object
    ) -> Any:
        uploading = operation in ("put", "put_stream") and f"/partition-{self.worker}." in path
        if uploading and self._take():
            await self.act()
        return await call()

    async def act(self) -> None:
        raise NotImplementedError

    def _take(self) -> bool:
        try:
            self.armed.rename(self.armed.with_suffix(".fired"))
        except FileNotFoundError:
            return False
        return True


class SelfKillingStore(ArmedStore):
    """SIGKILLs its own process at the armed upload."""

    async def act(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class HangingStore(ArmedStore):
    """Never returns from the armed upload: the actor hangs, alive."""

    async def act(self) -> None:
        await asyncio.Event().wait()


class OpenArmed:
    """Opens the job's store in each actor, wrapped in ``kind`` (an :class:`ArmedStore`)."""

    def __init__(self, kind: type[ArmedStore], root: Path, armed: Path, worker: int) -> None:
        self.kind, self.root, self.armed, self.worker = kind, root, armed, worker

    def __call__(self) -> Store:
        return self.kind(as_store(open_store(str(self.root))), self.armed, self.worker)


class CoordinatorSuicide:
    """SIGKILLs the coordinator's process at ``committing`` of ``epoch``, once ``armed``
    exists (so the restarted coordinator does not do it again)."""

    def __init__(self, epoch: int, armed: Path) -> None:
        self.epoch, self.armed = epoch, armed

    def __call__(self, event: Any) -> None:
        if (event.kind, event.epoch) != ("committing", self.epoch):
            return
        try:
            self.armed.rename(self.armed.with_suffix(".fired"))
        except FileNotFoundError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


# -- the tests -----------------------------------------------------------------------------


def test_three_actors_commit_epochs_and_a_new_job_restores_each_its_groups(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "store")
    first = make_job(store, 3, every_rounds=2)
    try:
        started = first.start()
        assert (started.workers, started.latest, started.epoch) == (3, None, 0)
        status = first.run(until=90)  # 3 rounds: a checkpoint after 2, one at the end
        assert status.committed == (1, 2) and status.failures == ()
        assert status.latest == latest_id(store)
        assert partitions_of(store, status.latest) == 3
        _, offsets, epoch = latest_counts(store)
        assert (offsets, epoch) == ({str(p): "90" for p in range(16)}, 2)
        actor = first.actors()[1]
        cid = str(CheckpointId.now())
        with pytest.raises(InvalidInputError, match="barrier of epoch 2 refused"):
            ray.get(actor.barrier.remote(status.generation, 2, cid))
        with pytest.raises(FencedError):
            ray.get(actor.barrier.remote(status.generation - 1, 9, cid))
    finally:
        first.stop()

    second = make_job(store, 5)  # restarts on the latest checkpoint's 3 partitions
    try:
        restarted = second.start()
        assert restarted.generation == status.generation + 1
        assert (restarted.workers, restarted.latest, restarted.epoch) == (3, status.latest, 2)
        total = sum(r["bytes_read"] for r in restarted.restored)
        for restored in restarted.restored:
            groups = wordcount.KEY_GROUPS.groups_of(restored["worker"], 3)
            assert restored["groups"] == [groups.start, groups.stop]
            assert restored["checkpoint"] == status.latest
            assert 0 < restored["bytes_read"] < total / 2  # its own groups only
        final = second.run()
        assert final.failures == () and final.committed == (3,)
    finally:
        second.stop()
    assert_exactly_once(store)


PHASES = {
    # hook on the coordinator's step, or None for the upload itself
    "before its upload": ("barrier", 2),
    "during its upload": None,
    "after its report": ("reported", 2),
    "during the commit": ("committing", 2),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_an_actor_killed_in_any_phase_of_an_epoch_fails_that_epoch_only(
    phase: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    store = str(root)
    armed = tmp_path / "armed"
    hook = PHASES[phase]
    job = make_job(
        OpenArmed(SelfKillingStore, root, armed, worker=1) if hook is None else store,
        3,
        on_event=None if hook is None else KillAt(hook[0], hook[1], worker=1),
        lease=LEASE,
    )
    try:
        job.start()
        before = job.run(until=60)
        assert before.committed == (1,) and before.failures == ()
        armed.touch()  # the store kills from now on (its hook waits for epoch 2)
        after = job.checkpoint()
        assert after.latest == before.latest == latest_id(store), "epoch 2 committed nothing"
        assert after.committed == (1,) and after.restarts == 1 and len(after.failures) >= 1
        assert all(r["checkpoint"] == before.latest for r in after.restored)
        assert hook is not None or (tmp_path / "armed.fired").exists()
        committed, uncommitted = committed_and_uncommitted(store)
        assert committed == {before.latest} and uncommitted, "epoch 2's uploads, for GC"
        final = job.run()
        assert final.committed == (1, 2) and final.restarts == 1
    finally:
        job.stop()
    assert_exactly_once(store)
    time.sleep(LEASE.total_seconds() * 1.5)  # the failed epoch's lease lapses
    with SyncCheckpointer(store, CheckpointPaths("")) as ckpt:
        swept = ckpt.gc(RetentionPolicy(keep_last=10), min_age=dt.timedelta(0))
    assert swept.deleted == [] and swept.orphans_deleted
    committed, uncommitted = committed_and_uncommitted(store)
    [failed] = uncommitted
    left = sorted(str(p.relative_to(root / failed)) for p in (root / failed).rglob("*"))
    assert len(committed) == 2 and left == ["manifest.json"], "only GC's tombstone is left"
    assert_exactly_once(store)


def test_an_actor_hung_in_its_upload_is_replaced_after_the_actor_timeout(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = str(root)
    armed = tmp_path / "armed"
    opened = OpenArmed(HangingStore, root, armed, worker=1)
    # Well above an epoch's few uploads on a loaded machine; restores are not bounded.
    job = make_job(opened, 3, lease=LEASE, actor_timeout=dt.timedelta(seconds=8))
    try:
        job.start()
        before = job.run(until=60)
        assert before.committed == (1,) and before.failures == ()
        hung = job.actors()[1]
        armed.touch()  # partition 1's next upload never returns
        began = time.monotonic()
        after = job.checkpoint()
        waited = time.monotonic() - began
        assert (tmp_path / "armed.fired").exists(), "the upload hung"
        assert waited >= 8, f"the epoch failed after {waited:.1f} s, before its actor_timeout"
        assert after.latest == before.latest == latest_id(store), "epoch 2 committed nothing"
        assert after.committed == (1,) and after.restarts == 1
        assert after.failures == (
            "ActorTimeoutError: partition 1 did not answer its barrier within 8 s "
            "(actor_timeout): its actor was replaced",
        )
        assert all(r["checkpoint"] == before.latest for r in after.restored)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(hung.ping.remote(), timeout=30)  # killed, not restarted
        final = job.run()
        assert final.committed == (1, 2) and final.restarts == 1
    finally:
        job.stop()
    assert_exactly_once(store)


@pytest.mark.parametrize("value", [dt.timedelta(0), dt.timedelta(seconds=-1), 5])
def test_an_actor_timeout_that_is_not_a_positive_timedelta_is_refused(value: object) -> None:
    with pytest.raises(InvalidInputError) as refused:
        make_job("unused", 1, actor_timeout=value)
    assert str(refused.value) == f"actor_timeout must be a positive timedelta, got {value!r}"


def test_a_coordinator_killed_mid_commit_is_restarted_and_fences_its_predecessor(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "store")
    armed = tmp_path / "armed"
    armed.touch()
    job = make_job(store, 2, every_rounds=1, on_event=CoordinatorSuicide(2, armed))
    try:
        first = job.start()
        status = job.run()  # the coordinator dies at epoch 2; Ray restarts it; run goes on
        assert (tmp_path / "armed.fired").exists()
        assert status.generation == first.generation + 1
        assert status.committed and status.committed[0] == 2, "the new one redid epoch 2"
    finally:
        job.stop()
    assert_exactly_once(store)

    async def predecessor_commits() -> None:
        ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(""))
        ckpt.writer_generation = first.generation  # what the dead coordinator held
        await commit_distributed(ckpt, CheckpointId.now(), 99, [], [])

    with pytest.raises(FencedError):
        asyncio.run(predecessor_commits())


def test_a_zombie_coordinator_can_commit_nothing_once_another_took_over(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    old, new = make_job(store, 2), make_job(store, 2)
    try:
        old.start()
        committed = old.run(until=30)
        new.start()  # takes over: ``old`` is now a zombie, still running
        with pytest.raises(FencedError):
            old.checkpoint()
        assert latest_id(store) == committed.latest
        final = new.run()
        assert final.generation == committed.generation + 1
    finally:
        old.stop()
        new.stop()
    assert_exactly_once(store)


def test_rescaling_4_to_6_and_6_to_3_is_exactly_once(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    job = make_job(store, 4, every_rounds=2)
    try:
        job.start()
        job.run(until=40)
        six = job.rescale(6)
        assert six.workers == 6 and partitions_of(store, str(six.latest)) == 6
        assert [r["groups"] for r in six.restored] == [
            [g.start, g.stop] for g in (wordcount.KEY_GROUPS.groups_of(w, 6) for w in range(6))
        ]
        job.run(until=80)
        three = job.rescale(3)
        assert three.workers == 3 and partitions_of(store, str(three.latest)) == 3
        final = job.run()
        assert final.failures == ()
    finally:
        job.stop()
    assert_exactly_once(store)


def test_the_example_joins_a_cluster_and_prints_its_verdict(local_ray: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = {**os.environ, "RAY_ADDRESS": ""}
    started = time.monotonic()
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--workers", "2", "--events", "3200", "--kill", "1",
         "--rescale-to", "3", "--seed", "7", "--batch", "50", "--interval", "0.1",
         "--store", str(store), "--address", local_ray, "--json"],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["exactly_once"] is True
    assert verdict["final"]["state_sha256"] == verdict["reference_state_sha256"]
    assert verdict["rescale_to"] == 3 and len(verdict["restored"]) == 3
    assert all(r["bytes_read"] > 0 for r in verdict["restored"])
    assert verdict["epochs_committed"] and time.monotonic() - started < 180
    assert KeyGroups(verdict["key_groups"]) == wordcount.KEY_GROUPS
