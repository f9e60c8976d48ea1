"""DCP on cairn with real torch.distributed: two spawned ranks (gloo, CPU), on a local
directory, S3 and GCS.

One spawned run per store (a run costs ~15 s here): the ranks go through the scenarios
of ``torch_worker.suite`` in one process group, and each test below checks one of them
against the store. Before the run this process saves a checkpoint alone (for 1 -> 2);
after it, it loads what the ranks saved alone (2 -> 1). The scenarios include saves
under a ``checkpoint_id`` given as a path or URL inside the store and as a name (as
torchtitan and torchtune call ``dcp.save``), and DTensor placement changes between save
and load (adapted from PyTorch's ``test/distributed/checkpoint/test_dtensor_resharding.py``).
The run ends with rank 1 killed by SIGKILL while it uploads.

The CUDA/NCCL variant (save, load and reshard with a GPU per rank) runs the short CUDA
suite of ``torch_worker`` where two GPUs are available, and is skipped, saying why,
elsewhere.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it (scripts/test.sh)

from support import torch_worker
from support.servers import (
    GcsServer,
    S3Server,
    free_port,
    gcs_store_options,
    s3_store_options,
    unique_name,
)
from support.torch_worker import BLANK_SEED, PREFIX, digests, make_state, open_store
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import (
    CheckpointId,
    CheckpointPaths,
    IntegrityMismatchError,
    RetentionPolicy,
    SyncCheckpointer,
    UndecodableArtifactError,
)
from cairn.format.manifest import StoreRequests
from cairn.format.ranges import COMPRESSED_INDEX_MAGIC
from cairn.protocol import _catalog
from cairn.protocol._blocking import run_blocking
from cairn.torch import METADATA_OPERATOR, CairnReader, CairnWriter

T = TypeVar("T")

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    ),
    pytest.mark.slow,
    pytest.mark.subprocess,
]

LEASE_S = 2  # the killed save's lease: short, so the test can see GC sweep after it


@dataclasses.dataclass
class Run:
    """What one spawned run left: the ranks' reports and the store they wrote."""

    spec: dict[str, Any]
    single_id: str
    single: dict[str, str]
    ranks: list[dict[str, Any]]
    exitcodes: list[int | None]
    killed_at: float

    @property
    def store(self) -> Any:
        return open_store(self.spec["store"])

    def ckpt(self) -> SyncCheckpointer:
        return SyncCheckpointer(self.store, CheckpointPaths(PREFIX))


def _spawn(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int | None], float]:
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=torch_worker.run_rank, args=(r, 2, port, spec)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    marker = Path(spec["marker"])
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert time.monotonic() < deadline, "rank 1 never reached its stalled write_data"
            assert all(p.is_alive() for p in procs), "a rank ended before the kill scenario"
            time.sleep(0.1)
        os.kill(procs[1].pid or 0, signal.SIGKILL)
        killed_at = time.monotonic()
        for proc in procs:
            proc.join(timeout=120)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    outdir = Path(spec["outdir"])
    ranks = [json.loads((outdir / f"rank-{r}.json").read_text()) for r in (0, 1)]
    return ranks, [p.exitcode for p in procs], killed_at


@pytest.fixture(scope="module", params=["local", "s3", "gcs"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One spawned 2-rank run of the suite against a fresh local directory, S3 or GCS
    bucket."""
    base = tmp_path_factory.mktemp(f"dcp-{request.param}")
    if request.param == "local":
        (base / "store").mkdir()
        store_spec: dict[str, Any] = {"kind": "local", "root": str(base / "store")}
    elif request.param == "gcs":
        gcs: GcsServer = request.getfixturevalue("gcs_server")
        bucket = unique_name("dcp")
        gcs.create_bucket(bucket)
        store_spec = {"kind": "gcs", "bucket": bucket, "options": dict(gcs_store_options(gcs))}
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        bucket = unique_name("dcp")
        server.create_bucket(bucket)
        store_spec = {"kind": "s3", "bucket": bucket, "options": dict(s3_store_options(server))}
    single = make_state(1)
    writer = CairnWriter(open_store(store_spec), epoch=1, prefix=PREFIX)
    dcp_save(single, storage_writer=writer, no_dist=True)
    spec = {
        "store": store_spec,
        "single_id": str(writer.checkpoint_id),
        "marker": str(base / "stalled"),
        "lease_s": LEASE_S,
        "outdir": str(base),
    }
    ranks, exitcodes, killed_at = _spawn(spec)
    for rank, report in enumerate(ranks):
        assert "error" not in report, f"rank {rank} failed:\n{report['error']}"
    return Run(spec, str(writer.checkpoint_id), digests(single), ranks, exitcodes, killed_at)


def _load_alone(run: Run, checkpoint_id: str | None) -> tuple[dict[str, str], CairnReader]:
    """Load into one process (no process group) what the ranks saved: 2 -> 1."""
    state = make_state(BLANK_SEED)
    reader = CairnReader(run.store, checkpoint_id=checkpoint_id, prefix=PREFIX)
    dcp_load(state, storage_reader=reader, no_dist=True)
    return digests(state), reader


def test_a_save_from_one_process_loads_into_two_ranks(run: Run) -> None:
    for rank in run.ranks:
        assert rank["load_1_to_2"] == run.single
    blank = digests(make_state(BLANK_SEED))
    varying = [k for k in run.single if k.startswith(("model.", "sharded", "step", "name"))]
    assert len(varying) == 9 and all(blank[k] != run.single[k] for k in varying), (
        "the state loaded into differs from the saved one wherever the seed matters"
    )


def test_a_save_from_two_ranks_loads_into_two_ranks_and_into_one(run: Run) -> None:
    saved = run.ranks[0]["save_2"]
    assert run.ranks[1]["save_2"] == saved, "both ranks saved the same checkpoint"
    for rank in run.ranks:
        assert rank["load_2_to_2"] == {"id": saved["id"], "digests": saved["digests"]}
    loaded, reader = _load_alone(run, saved["id"])
    assert loaded == saved["digests"]
    assert str(reader.checkpoint_id) == saved["id"]


def test_each_rank_uploads_its_own_artifacts_under_one_manifest(run: Run) -> None:
    ckpt = run.ckpt()
    cid = CheckpointId.parse(run.ranks[0]["save_2"]["id"])
    manifest = ckpt.load_manifest(cid)
    assert sorted(manifest.operators) == [METADATA_OPERATOR, "rank-0", "rank-1"]
    assert manifest.epoch == 2
    for rank in ("rank-0", "rank-1"):  # one object of ranges per rank
        [entry] = manifest.operators[rank].partitions
        assert entry.index_size_bytes is not None
    loaded = ckpt.load(cid)  # cairn's own verification of every artifact
    assert set(loaded.artifacts) == {
        (op, p.partition_id) for op, e in manifest.operators.items() for p in e.partitions
    }
    assert ckpt.list_checkpoints() == sorted(ckpt.list_checkpoints())


def test_two_saves_under_one_name_load_the_later_and_the_earlier_by_its_id(run: Run) -> None:
    """dcp.save(checkpoint_id=...) as torchtitan calls it: first a location inside the
    store (a path, or an s3:// URL), then the bare name; both are the name runs/step-8."""
    first, second = run.ranks[0]["named_first"], run.ranks[0]["named_second"]
    for rank in run.ranks:
        assert rank["named_first"] == first and rank["named_second"] == second
        assert rank["named_by_name"] == second, "the later save is what the name loads"
        assert rank["named_by_location"] == second
        assert rank["named_by_first_id"] == {**first, "name": "runs/step-8"}
    assert first["id"] != second["id"] and first["digests"] != second["digests"]
    assert first["name"] == second["name"] == "runs/step-8"
    ckpt = run.ckpt()
    for saved in (first, second):
        manifest = ckpt.load_manifest(CheckpointId.parse(saved["id"]))
        assert manifest.name == "runs/step-8"
        assert sorted(manifest.operators) == [METADATA_OPERATOR, "rank-0", "rank-1"]
    loaded, reader = _load_alone(run, "runs/step-8")  # 2 -> 1, by name
    assert loaded == second["digests"] and str(reader.checkpoint_id) == second["id"]


def test_dtensor_placement_changes_load_bit_exact(run: Run) -> None:
    """Adapted from PyTorch's test_dtensor_resharding.py
    (test_1d_to_1d_reshard_placement_change): a 4x4 DTensor saved with one placement
    loads into another, whole and in each rank's shard."""
    expected = {
        f"{a}->{b}": {"whole": True, "local": True, "device": "cpu"}
        for a, b in torch_worker.RESHARDS
    }
    for rank in run.ranks:
        assert rank["reshard"] == expected


def test_async_save_in_thread_and_in_process_mode(run: Run) -> None:
    """Both executors; the process-mode save is compressed (the setting travels into
    DCP's background process): one object of zstd frames per rank, loaded 2 -> 2 (by
    the fallback scenario) and 2 -> 1 here."""
    ckpt = run.ckpt()
    for scenario, epoch in (("async_thread", 3), ("async_process", 4)):
        report = run.ranks[0][scenario]
        assert run.ranks[1][scenario]["id"] == report["id"]
        manifest = ckpt.load_manifest(CheckpointId.parse(report["id"]))
        assert manifest.epoch == epoch
        assert _load_alone(run, report["id"])[0] == report["digests"]
        loaded = ckpt.load(manifest.checkpoint_id)  # every range (frame) verified
        for rank in ("rank-0", "rank-1"):
            [entry] = manifest.operators[rank].partitions
            assert entry.index_size_bytes is not None
            stored = bytes(loaded.artifacts[(rank, entry.partition_id)])
            index = stored[len(stored) - entry.index_size_bytes :]
            assert index.startswith(COMPRESSED_INDEX_MAGIC) == (scenario == "async_process")


def test_every_ranks_requests_are_in_the_statistics_the_coordinator_records(run: Run) -> None:
    """A save by two ranks, and one in DCP's background process: the manifest counts
    what each rank uploaded and asked, and what the save left in the store."""
    ckpt = run.ckpt()
    inner = ckpt.async_checkpointer
    for scenario in ("save_2", "async_process"):
        manifest = ckpt.load_manifest(CheckpointId.parse(run.ranks[0][scenario]["id"]))
        stats = manifest.stats
        assert stats is not None and isinstance(stats.requests, StoreRequests), scenario
        own = [e.stored_length for _, e in manifest.partition_entries() if e.owner is None]
        assert stats.uploaded_bytes == sum(own) and stats.uploaded_artifacts == len(own) == 3
        listed = _sync(inner.store.list(inner.paths.checkpoint_dir(manifest.checkpoint_id)))
        assert stats.stored_bytes == sum(info.size for info in listed), scenario
        # The intent (by the coordinator, and by each rank while it uploads), each rank's
        # object, the metadata and the manifest; a retried put counts once per attempt.
        assert 7 <= stats.requests.put <= 7 + stats.retries, (scenario, stats)
        assert stats.requests.get >= 1 and stats.requests.list >= 1, (scenario, stats)


def test_a_fenced_writer_is_refused_and_the_new_generation_saves(run: Run) -> None:
    for rank in run.ranks:
        fenced = rank["fenced"]
        assert fenced["type"] == "CheckpointException"
        assert fenced["failures"]["0"]["type"] == "FencedError"
        assert "generation 0 is fenced" in fenced["failures"]["0"]["message"]
    ckpt = run.ckpt()
    epochs = [ckpt.load_manifest(cid).epoch for cid in ckpt.list_checkpoints()]
    named = 2 + len(torch_worker.RESHARDS)  # the scenarios by name save with epoch 0
    assert epochs == [1, *[0] * named, 2, 3, 4, 6], "the fenced save (epoch 5) committed nothing"
    after = run.ranks[0]["after_takeover"]
    manifest = ckpt.load_manifest(CheckpointId.parse(after["id"]))
    assert manifest.writer_generation == after["generation"] == 1
    assert _load_alone(run, None)[0] == after["digests"], "the latest is the new generation's"


def test_load_latest_falls_back_past_a_damaged_shard_on_every_rank(run: Run) -> None:
    """Rank 1's shard of the newest checkpoint was damaged: both ranks loaded the one
    before it, each its own shard of it, bit-exactly."""
    before = run.ranks[0]["async_process"]
    for rank in run.ranks:
        assert rank["fallback"]["id"] == before["id"]
        assert rank["fallback"]["digests"] == rank["async_process"]["digests"]


def test_sigkill_of_rank_1_during_write_data_commits_nothing(run: Run) -> None:
    assert run.exitcodes == [0, -signal.SIGKILL]
    assert run.ranks[0]["killed"]["type"] in {"RuntimeError", "CheckpointException"}
    assert "killed" not in run.ranks[1], "rank 1 never finished its save"
    ckpt = run.ckpt()
    committed = ckpt.list_checkpoints()
    after = CheckpointId.parse(run.ranks[0]["after_takeover"]["id"])
    assert committed[-1] == after and ckpt.read_latest() == after
    inner = ckpt.async_checkpointer
    listed = _sync(_catalog.listed_ids(_sync(inner._context())))
    [orphan] = [cid for cid in listed if cid not in committed]
    directory = inner.paths.checkpoint_dir(orphan)
    left = sorted(info.path for info in _sync(inner.store.list(directory)))
    assert inner.paths.manifest(orphan) not in left, "nothing was committed"
    assert any("/operators/rank-0/" in path for path in left), left
    assert any("/operators/rank-1/" in path for path in left), left
    # Once its lease has lapsed by the store's clock (whose stamps may be whole seconds),
    # GC sweeps what the failed save uploaded.
    time.sleep(max(0.0, run.killed_at + LEASE_S + 0.5 - time.monotonic()))
    swept: set[str] = set()
    deadline = time.monotonic() + 10
    while not set(left) <= swept and time.monotonic() < deadline:
        swept.update(ckpt.gc(RetentionPolicy(), min_age=dt.timedelta(0)).orphans_deleted)
        time.sleep(0.25)
    assert set(left) <= swept
    [tombstone] = _sync(inner.store.list(directory))  # GC's claim on the id, and nothing else
    assert tombstone.path == inner.paths.manifest(orphan) and tombstone.size == 0
    assert ckpt.list_checkpoints() == committed and ckpt.read_latest() == after


@pytest.mark.parametrize("scenario", ["save_2", "async_process"], ids=["plain", "zstd"])
def test_a_flipped_byte_in_any_artifact_is_caught(run: Run, scenario: str) -> None:
    ckpt = run.ckpt()
    cid = CheckpointId.parse(run.ranks[0][scenario]["id"])
    paths = CheckpointPaths(PREFIX)
    store = ckpt.async_checkpointer.store
    for operator, entry in ckpt.load_manifest(cid).partition_entries():
        path = paths.resolve(cid, entry.path)
        original = bytes(_sync(store.get(path)).data)
        damaged = bytearray(original)
        damaged[len(damaged) // 2] ^= 0x01
        _sync(store.put(path, bytes(damaged)))
        try:
            with pytest.raises(CheckpointException) as info:
                _load_alone(run, str(cid))
        finally:
            _sync(store.put(path, original))
        [(error, _)] = info.value.failures.values()
        if operator == METADATA_OPERATOR:
            # DCP reports a failed metadata read as an AssertionError with its message.
            assert isinstance(error, AssertionError) and path in str(error)
        else:  # a flipped byte in a zstd frame may also stop it decoding
            assert isinstance(error, (IntegrityMismatchError, UndecodableArtifactError)), error
            assert error.path == path and "of item '" in str(error), error
    assert _load_alone(run, str(cid))[0] == run.ranks[0][scenario]["digests"]


def _sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run an async cairn call from this synchronous test, on cairn's own loop thread."""
    return run_blocking(coro)


# -- CUDA and NCCL: the same save, load and reshard with a GPU per rank -------------------


def _cuda_skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "CUDA is not available here (torch.cuda.is_available() is False)"
    if torch.cuda.device_count() < 2:
        return f"2 GPUs are needed for 2 NCCL ranks, {torch.cuda.device_count()} found"
    if not torch.distributed.is_nccl_available():
        return "this torch build has no NCCL"
    return None


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """One spawned 2-rank NCCL run of the CUDA suite against a local store."""
    reason = _cuda_skip_reason()
    if reason is not None:
        print(f"skipping the CUDA/NCCL DCP tests: {reason}")
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("dcp-cuda")
    (base / "store").mkdir()
    spec = {
        "store": {"kind": "local", "root": str(base / "store")},
        "backend": "nccl",
        "suite": "cuda",
        "outdir": str(base),
    }
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=torch_worker.run_rank, args=(r, 2, port, spec)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
        if proc.is_alive():
            proc.kill()
            proc.join()
    ranks = [json.loads((base / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, report in enumerate(ranks):
        assert "error" not in report, f"rank {rank} failed:\n{report['error']}"
    return ranks


def test_cuda_nccl_save_and_load_bit_exact(cuda_run: list[dict[str, Any]]) -> None:
    for rank in cuda_run:
        assert rank["save_load"]["digests"] == rank["saved"]
    assert cuda_run[0]["save_load"]["id"] == cuda_run[1]["save_load"]["id"]


def test_cuda_nccl_dtensor_placement_changes_load_bit_exact(
    cuda_run: list[dict[str, Any]],
) -> None:
    expected = {
        f"{a}->{b}": {"whole": True, "local": True, "device": "cuda"}
        for a, b in torch_worker.RESHARDS
    }
    for rank in cuda_run:
        assert rank["reshard"] == expected
