"""The state the DCP tests save, and one rank of the multi-process DCP tests.

:func:`make_state` builds a training state deterministically from a seed (a model of
Linear layers, its Adam state, a tensor sharded across the ranks, and non-tensor items);
:func:`digests` fingerprints one bit-exactly, whatever the topology that holds it.
:func:`run_rank` is one spawned rank (gloo on CPU): it runs the scenarios of the suite
in order, in one process group, and writes what it saw to ``{outdir}/rank-{r}.json``.
With ``spec["suite"] == "cuda"`` (and ``spec["backend"] == "nccl"``) it runs the short
CUDA suite instead: save, load and reshard with a GPU per rank.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.futures import Future

from cairn import SyncCheckpointer
from cairn.torch import CairnReader, CairnWriter, load_latest

PREFIX = "dcp/"
SHARDED_ROWS = 8  # rows of the tensor sharded along dim 0 (divisible by 1 and 2 ranks)
BLANK_SEED = 999  # the state loaded into: every value differs from the saved ones


def make_state(seed: int, mesh: DeviceMesh | None = None) -> dict[str, Any]:
    """A training state: a model, its Adam state, a sharded tensor and plain values.

    Deterministic in ``seed`` (values come from a seeded generator and Adam's step is
    elementwise). ``mesh``: the ``sharded`` tensor is a DTensor sharded along dim 0 over
    it; without one, a plain tensor of the same values.
    """
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.Linear(512, 8))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    for param in model.parameters():
        param.grad = torch.randn(param.shape, generator=gen)
    optim.step()
    model_sd, optim_sd = get_state_dict(model, optim)
    full = torch.randn(SHARDED_ROWS, 300, generator=gen)
    sharded = distribute_tensor(full, mesh, [Shard(0)]) if mesh is not None else full
    return {
        "model": model_sd,
        "optim": optim_sd,
        "sharded": sharded,
        "step": seed * 10,
        "name": f"run-{seed}",
        "extra": {"seed": seed, "tags": ["a", "b"]},
    }


def digests(state: Any, prefix: str = "") -> dict[str, str]:
    """Every leaf of ``state``: a tensor's dtype, shape and SHA-256 of its bytes (a
    DTensor's full tensor, gathered), anything else its repr."""
    out: dict[str, str] = {}
    if isinstance(state, dict):
        for key, value in state.items():
            out.update(digests(value, f"{prefix}{key}."))
        return out
    if isinstance(state, DTensor):
        state = state.full_tensor()
    if isinstance(state, torch.Tensor):
        data = state.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        fingerprint = hashlib.sha256(data).hexdigest()[:16]
        out[prefix[:-1]] = f"{state.dtype}{list(state.shape)}:{fingerprint}"
    else:
        out[prefix[:-1]] = repr(state)
    return out


def open_store(spec: dict[str, Any]) -> Any:
    """The store a spec names: a local directory's path, or an obstore S3Store or GCSStore."""
    if spec["kind"] == "local":
        return spec["root"]
    from obstore.store import GCSStore, S3Store

    if spec["kind"] == "gcs":
        return GCSStore(spec["bucket"], **spec["options"])
    return S3Store(spec["bucket"], **spec["options"])


# -- one rank -------------------------------------------------------------------------


class StallingWriter(CairnWriter):
    """A writer whose rank 1 uploads its first item, says so, then waits to be killed."""

    marker: str = ""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if dist.get_rank() != 1:
            return super().write_data(plan, planner)
        super().write_data(dataclasses.replace(plan, items=plan.items[:1]), planner)
        Path(self.marker).write_text(str(os.getpid()))
        time.sleep(600)
        raise AssertionError("rank 1 should have been killed")


def _failure(exc: BaseException) -> dict[str, Any]:
    """What the test needs of a DCP failure: the types and messages on each rank."""
    failures = getattr(exc, "failures", None)
    inner = {
        str(rank): {"type": type(err).__name__, "message": str(err)}
        for rank, (err, _) in (failures or {}).items()
    }
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "failures": inner}


def _stop_background_saver() -> None:
    """End the process DCP keeps for async_save in process mode (it outlives the save)."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    process = executor._CHECKPOINT_PROCESS
    if process is not None:
        executor._CHECKPOINT_PROCESS = None
        process.__del__()


def suite(rank: int, spec: dict[str, Any], out: dict[str, Any], save: Callable[[], None]) -> None:
    """The scenarios, in order, in one process group (results go into ``out``)."""
    store = open_store(spec["store"])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    # 1 -> 2: what one process saved loads into two ranks (the sharded tensor reshards).
    state = make_state(BLANK_SEED, mesh)
    reader = CairnReader(store, checkpoint_id=spec["single_id"], prefix=PREFIX)
    dcp_load(state, storage_reader=reader)
    out["load_1_to_2"] = digests(state)
    save()

    # checkpoint_id as torchtitan and torchtune pass it, then DTensor resharding.
    named_scenarios(spec, out, mesh, store)
    save()
    out["reshard"] = reshard_scenarios(mesh, store, "cpu")
    save()

    # A save from 2 ranks, then 2 -> 2 from the latest checkpoint (no id given).
    saved = make_state(2, mesh)
    writer = CairnWriter(store, epoch=2, prefix=PREFIX)
    dcp_save(saved, storage_writer=writer)
    out["save_2"] = {"id": str(writer.checkpoint_id), "digests": digests(saved)}
    state = make_state(BLANK_SEED, mesh)
    reader = CairnReader(store, prefix=PREFIX)
    dcp_load(state, storage_reader=reader)
    out["load_2_to_2"] = {"id": str(reader.checkpoint_id), "digests": digests(state)}
    save()

    # async_save, with DCP's thread and then its process executor.
    saved = make_state(3, mesh)
    writer = CairnWriter(store, epoch=3, prefix=PREFIX)
    future = async_save(
        saved, storage_writer=writer, async_checkpointer_type=AsyncCheckpointerType.THREAD
    )
    future.result()  # type: ignore[union-attr]
    out["async_thread"] = {"id": str(writer.checkpoint_id), "digests": digests(saved)}
    saved = make_state(4, mesh)
    future = async_save(  # compressed: the setting travels into DCP's background process
        saved,
        storage_writer=CairnWriter(store, epoch=4, prefix=PREFIX, compression="zstd"),
        async_checkpointer_type=AsyncCheckpointerType.PROCESS,
    )
    metadata = future.result()  # type: ignore[union-attr]
    _stop_background_saver()
    out["async_process"] = {
        "id": metadata.storage_meta.checkpoint_id,
        "digests": digests(saved),
    }
    save()

    # Fencing: once rank 0 has taken over as generation 1, generation 0 cannot save.
    generation = [0]
    if rank == 0:
        generation[0] = SyncCheckpointer(store, open_paths()).take_over()
    dist.broadcast_object_list(generation, src=0)
    try:
        dcp_save(make_state(5, mesh), storage_writer=CairnWriter(store, epoch=5, prefix=PREFIX))
        out["fenced"] = {"type": "none"}
    except BaseException as exc:
        out["fenced"] = _failure(exc)
    writer = CairnWriter(store, epoch=6, prefix=PREFIX, writer_generation=generation[0])
    saved = make_state(6, mesh)
    dcp_save(saved, storage_writer=writer)
    out["after_takeover"] = {
        "id": str(writer.checkpoint_id),
        "generation": generation[0],
        "digests": digests(saved),
    }
    save()

    # load_latest past damage: rank 1's shard of the newest checkpoint has a flipped
    # byte; both ranks see the failure and load the one before (async_process), alike.
    damaged_path = ""
    if rank == 0:
        damaged_path = _flip_rank_1_shard(store, writer.checkpoint_id)
    dist.barrier()
    state = make_state(BLANK_SEED, mesh)
    loaded = load_latest(state, store, prefix=PREFIX)
    out["fallback"] = {"id": str(loaded), "digests": digests(state)}
    dist.barrier()
    if rank == 0:
        _flip_rank_1_shard(store, writer.checkpoint_id, damaged_path)  # repaired
    dist.barrier()
    save()

    # Last, as it breaks the process group: rank 1 is killed during write_data.
    StallingWriter.marker = spec["marker"]
    writer = StallingWriter(
        store,
        epoch=7,
        prefix=PREFIX,
        writer_generation=generation[0],
        lease=dt.timedelta(seconds=spec["lease_s"]),
    )
    try:
        dcp_save(make_state(7, mesh), storage_writer=writer)
        out["killed"] = {"type": "none"}
    except BaseException as exc:
        out["killed"] = _failure(exc)


def _id_and_digests(writer_or_reader: Any, state: Any) -> dict[str, Any]:
    return {
        "id": str(writer_or_reader.checkpoint_id),
        "name": writer_or_reader.name,
        "digests": digests(state),
    }


def named_scenarios(spec: dict[str, Any], out: dict[str, Any], mesh: Any, store: Any) -> None:
    """Two saves under one name (a path or URL inside the store, then the bare name), and
    loads by that name (the later wins) and by the earlier's id (it still loads)."""
    store_spec = spec["store"]
    if store_spec["kind"] == "local":
        location = f"{store_spec['root']}/runs/step-8"
    else:  # an object store: its own URL scheme (s3:// or gs://)
        scheme = {"s3": "s3", "gcs": "gs"}[store_spec["kind"]]
        location = f"{scheme}://{store_spec['bucket']}/runs/step-8"
    first = make_state(11, mesh)
    writer = CairnWriter(store, epoch=0, prefix=PREFIX)
    dcp_save(first, storage_writer=writer, checkpoint_id=location)
    out["named_first"] = _id_and_digests(writer, first)
    second = make_state(12, mesh)
    writer = CairnWriter(store, epoch=0, prefix=PREFIX)
    dcp_save(second, storage_writer=writer, checkpoint_id="runs/step-8")
    out["named_second"] = _id_and_digests(writer, second)
    for key, checkpoint_id in (
        ("by_name", "runs/step-8"),
        ("by_location", location),
        ("by_first_id", out["named_first"]["id"]),
    ):
        state = make_state(BLANK_SEED, mesh)
        reader = CairnReader(store, prefix=PREFIX)
        dcp_load(state, storage_reader=reader, checkpoint_id=checkpoint_id)
        out[f"named_{key}"] = _id_and_digests(reader, state)


RESHARDS = (("replicate", "shard0"), ("shard0", "replicate"), ("shard0", "shard1"))
"""Placement changes between save and load (from PyTorch's test_dtensor_resharding.py)."""


def reshard_scenarios(mesh: Any, store: Any, device: str) -> dict[str, Any]:
    """Save a 4x4 DTensor with one placement, load it into another, by name; per change,
    whether the loaded tensor is the saved one, whole and in this rank's shard."""
    from torch.distributed.tensor import Placement, Replicate
    from torch.distributed.tensor import zeros as dtensor_zeros

    placements: dict[str, list[Placement]] = {
        "replicate": [Replicate()],
        "shard0": [Shard(0)],
        "shard1": [Shard(1)],
    }
    results: dict[str, Any] = {}
    for saved_as, loaded_as in RESHARDS:
        full = torch.arange(16, dtype=torch.float32, device=device).view(4, 4)
        saved = {"dtensor": distribute_tensor(full, mesh, placements[saved_as])}
        name = f"reshard/{saved_as}-to-{loaded_as}"
        dcp_save(
            saved,
            storage_writer=CairnWriter(store, epoch=0, prefix=PREFIX),
            checkpoint_id=name,
        )
        target = {
            "dtensor": dtensor_zeros([4, 4], device_mesh=mesh, placements=placements[loaded_as])
        }
        dcp_load(target, storage_reader=CairnReader(store, prefix=PREFIX), checkpoint_id=name)
        loaded = target["dtensor"]
        expected = distribute_tensor(full, mesh, placements[loaded_as]).to_local()
        results[f"{saved_as}->{loaded_as}"] = {
            "whole": bool(torch.equal(loaded.full_tensor(), full)),
            "local": bool(torch.equal(loaded.to_local(), expected)),
            "device": loaded.to_local().device.type,
        }
    return results


def cuda_suite(
    rank: int, spec: dict[str, Any], out: dict[str, Any], save: Callable[[], None]
) -> None:
    """Save, load and reshard with CUDA tensors over NCCL (a GPU per rank)."""
    torch.cuda.set_device(rank)
    store = open_store(spec["store"])
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    saved = {"w": torch.randn(64, 32, generator=torch.Generator().manual_seed(5)).cuda()}
    saved["sharded"] = distribute_tensor(saved["w"].clone(), mesh, [Shard(0)])
    writer = CairnWriter(store, epoch=1, prefix=PREFIX)
    dcp_save(saved, storage_writer=writer, checkpoint_id="cuda/step-1")
    target = {"w": torch.zeros(64, 32, device="cuda")}
    target["sharded"] = distribute_tensor(torch.zeros(64, 32, device="cuda"), mesh, [Shard(0)])
    dcp_load(target, storage_reader=CairnReader(store, prefix=PREFIX), checkpoint_id="cuda/step-1")
    out["save_load"] = {"id": str(writer.checkpoint_id), "digests": digests(target)}
    out["saved"] = digests(saved)
    out["reshard"] = reshard_scenarios(mesh, store, "cuda")
    save()


def _flip_rank_1_shard(store: Any, checkpoint_id: Any, path: str = "") -> str:
    """Flip one byte in the middle of rank 1's first artifact (or of ``path``); its path."""
    import obstore

    from cairn.stores import open_store as open_obstore

    raw = open_obstore(store) if isinstance(store, str) else store
    if not path:
        manifest = SyncCheckpointer(store, open_paths()).load_manifest(checkpoint_id)
        entry = manifest.operators["rank-1"].partitions[0]
        path = open_paths().resolve(checkpoint_id, entry.path)
    data = bytearray(obstore.get(raw, path).bytes())
    data[len(data) // 2] ^= 0x01
    obstore.put(raw, path, bytes(data))
    return path


def open_paths() -> Any:
    """The layout the suite saves under."""
    from cairn import CheckpointPaths

    return CheckpointPaths(PREFIX)


def run_rank(rank: int, world_size: int, port: int, spec: dict[str, Any]) -> None:
    """One rank: join the gloo group, run the suite, write ``rank-{rank}.json``."""
    warnings.simplefilter("ignore")  # DCP warns about its own experimental features
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    dist.init_process_group(
        spec.get("backend", "gloo"),
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=60),
    )
    out: dict[str, Any] = {"pid": os.getpid()}
    result = Path(spec["outdir"]) / f"rank-{rank}.json"

    def save() -> None:
        result.write_text(json.dumps(out))

    try:
        (cuda_suite if spec.get("suite") == "cuda" else suite)(rank, spec, out, save)
    except BaseException:
        out["error"] = traceback.format_exc()
    save()
    # The group is broken (rank 1 was killed): skip its teardown, which could wait on it.
    os._exit(0)
