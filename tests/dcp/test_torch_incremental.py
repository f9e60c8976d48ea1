"""Incremental DCP saves (``CairnWriter(..., incremental=True)``): unchanged items are
carried from the parent by reference; loads, verification, GC and copies see them."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import msgspec
import torch
from support.dcp import item_records
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import (
    CheckpointId,
    CheckpointInUseError,
    CheckpointNotFoundError,
    CheckpointPaths,
    FencedError,
    IntegrityMismatchError,
    InvalidInputError,
    RetentionPolicy,
    SyncCheckpointer,
)
from cairn.format.manifest import encode_manifest
from cairn.torch import CairnReader, CairnWriter, _format

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    ),
    pytest.mark.slow,
    pytest.mark.subprocess,
]

PREFIX = "dcp/"
MIB = 1 << 20


def frozen_base() -> dict[str, torch.Tensor]:
    """A base model of a few MiB: tensors of their own and small ones that are bundled."""
    gen = torch.Generator().manual_seed(1)
    base = {f"layer{i}.weight": torch.randn(512, 512, generator=gen) for i in range(3)}
    base |= {f"layer{i}.bias": torch.randn(512, generator=gen) for i in range(3)}
    return base


def adapter(step: int) -> dict[str, torch.Tensor]:
    """A small trainable adapter whose values change with ``step``."""
    gen = torch.Generator().manual_seed(100 + step)
    return {
        "lora.a": torch.randn(512, 16, generator=gen),
        "lora.b": torch.randn(16, 512, generator=gen),
    }


def state_at(step: int, base: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    return {"base": base or frozen_base(), "adapter": adapter(step), "step": step}


def blank(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: blank(v) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    return 0


def assert_same(loaded: Any, saved: Any) -> None:
    if isinstance(saved, dict):
        assert loaded.keys() == saved.keys()
        for key in saved:
            assert_same(loaded[key], saved[key])
    elif isinstance(saved, torch.Tensor):
        assert loaded.dtype == saved.dtype and torch.equal(
            loaded.reshape(-1).view(torch.uint8), saved.reshape(-1).view(torch.uint8)
        )
    else:
        assert loaded == saved


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in tensors.values())


def save(root: Path, state: Any, epoch: int = 1, **options: Any) -> CheckpointId:
    writer = CairnWriter(str(root), epoch=epoch, prefix=PREFIX, **options)
    dcp_save(state, storage_writer=writer, no_dist=True)
    assert writer.checkpoint_id is not None
    return writer.checkpoint_id


def load(root: Path, state: Any, checkpoint_id: CheckpointId | None = None) -> CairnReader:
    reader = CairnReader(str(root), checkpoint_id=checkpoint_id, prefix=PREFIX)
    dcp_load(state, storage_reader=reader, no_dist=True)
    return reader


def sync(root: Path) -> SyncCheckpointer:
    return SyncCheckpointer(str(root), CheckpointPaths(PREFIX))


def uploaded_bytes(root: Path, cid: CheckpointId) -> int:
    """Bytes of the partition artifacts stored in ``cid``'s own directory."""
    return sum(p.stat().st_size for p in (root / PREFIX / str(cid) / "operators").rglob("*"))


def records_of(root: Path, cid: CheckpointId) -> dict[str, _format.ItemRecord]:
    reader = CairnReader(str(root), checkpoint_id=cid, prefix=PREFIX)
    return {index.fqn: record for index, record in item_records(reader).items()}


def test_a_frozen_base_is_carried_and_only_the_adapter_is_uploaded(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1), incremental=True)  # no parent yet: a full save
    assert sync(tmp_path).load_manifest(first).parent_id is None
    assert uploaded_bytes(tmp_path, first) >= nbytes(frozen_base())
    state = state_at(2)
    second = save(tmp_path, state, epoch=2, incremental=True)
    manifest = sync(tmp_path).load_manifest(second)
    assert manifest.parent_id == first
    # Only the adapter's bytes (and the metadata) are in the new checkpoint's directory.
    own = uploaded_bytes(tmp_path, second)
    assert own < nbytes(adapter(2)) + 64 * 1024
    carried = [e for _, e in manifest.partition_entries() if e.owner == first]
    assert sum(e.size_bytes for e in carried) >= nbytes(frozen_base())
    assert sync(tmp_path).dependents(first) == [second]
    with pytest.raises(CheckpointInUseError):
        sync(tmp_path).delete_checkpoint(first)
    # It loads bit-exactly, as the latest and by id.
    loaded = blank(state)
    assert load(tmp_path, loaded).checkpoint_id == second
    assert_same(loaded, state)
    again = blank(state)
    load(tmp_path, again, second)
    assert_same(again, state)
    # The parent still loads as it was.
    old = blank(state)
    load(tmp_path, old, first)
    assert_same(old, state_at(1))


def test_a_changed_base_item_is_uploaded_and_the_rest_carried(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1))
    base = frozen_base()
    base["layer1.weight"] = base["layer1.weight"] + 1  # one own-artifact tensor changes
    base["layer2.bias"] = base["layer2.bias"] * 2  # and one bundled tensor
    state = state_at(2, base)
    second = save(tmp_path, state, epoch=2, incremental=True)
    records, parent = records_of(tmp_path, second), records_of(tmp_path, first)
    changed = {"base.layer1.weight", "base.layer2.bias", "adapter.lora.a", "adapter.lora.b", "step"}
    for fqn, record in records.items():
        assert (record == parent[fqn]) == (fqn not in changed), fqn
    own = uploaded_bytes(tmp_path, second)
    assert 512 * 512 * 4 <= own < 512 * 512 * 4 + nbytes(adapter(2)) + 64 * 1024
    loaded = blank(state)
    load(tmp_path, loaded)
    assert_same(loaded, state)


def test_a_flipped_byte_in_a_carried_item_is_caught_naming_it(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1))
    second = save(tmp_path, state_at(2), epoch=2, incremental=True)
    record = records_of(tmp_path, second)["base.layer0.bias"]
    assert record == records_of(tmp_path, first)["base.layer0.bias"]
    path = tmp_path / PREFIX / str(first) / record.artifact
    data = bytearray(path.read_bytes())
    data[record.offset + 3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointException) as info:
        load(tmp_path, blank(state_at(2)), second)
    [(error, _)] = info.value.failures.values()
    assert isinstance(error, IntegrityMismatchError)
    assert "base.layer0.bias" in str(error) and error.path == f"{PREFIX}{first}/{record.artifact}"


def test_gc_keeps_what_the_retained_checkpoint_carries(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1))
    save(tmp_path, state_at(2), epoch=2, incremental=True)
    third_state = state_at(3)
    third = save(tmp_path, third_state, epoch=3, incremental=True)
    assert sync(tmp_path).load_manifest(third).parent_id != first
    result = sync(tmp_path).gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert third not in result.deleted and first in result.deleted
    assert sync(tmp_path).list_checkpoints() == [third]
    loaded = blank(third_state)
    assert load(tmp_path, loaded).checkpoint_id == third
    assert_same(loaded, third_state)
    # Copied without the checkpoints whose uploads it carries, it still loads.
    target = tmp_path.parent / f"{tmp_path.name}-copy"
    cli = [sys.executable, "-m", "cairn.cli", "--store", str(tmp_path), "--prefix", PREFIX]
    copied = subprocess.run(
        [*cli, "copy", str(third), "--to", str(target)], capture_output=True, text=True
    )
    assert copied.returncode == 0, copied.stderr
    loaded = blank(third_state)
    assert load(target, loaded).checkpoint_id == third
    assert_same(loaded, third_state)
    # An incremental save on top of it still carries the base (owned by a deleted one).
    fourth_state = state_at(4)
    fourth = save(tmp_path, fourth_state, epoch=4, incremental=True)
    assert uploaded_bytes(tmp_path, fourth) < nbytes(adapter(4)) + 64 * 1024
    loaded = blank(fourth_state)
    load(tmp_path, loaded, fourth)
    assert_same(loaded, fourth_state)


def test_gc_reports_the_space_a_partly_carried_rank_object_keeps(tmp_path: Path) -> None:
    """Once the parent is deleted, its rank object stays whole for the tensors the child
    carried: GC's space report counts the object against the bytes the child uses."""
    first = save(tmp_path, state_at(1))
    base = frozen_base()
    base["layer1.weight"] = base["layer1.weight"] + 1  # uploaded again; the rest carried
    second = save(tmp_path, state_at(2, base), epoch=2, incremental=True)
    parent_records, records = records_of(tmp_path, first), records_of(tmp_path, second)
    carried = {fqn: r for fqn, r in records.items() if r == parent_records[fqn]}
    assert "base.layer1.weight" not in carried and "base.layer0.weight" in carried
    [(_, entry)] = [
        (op, e) for op, e in sync(tmp_path).load_manifest(second).partition_entries() if e.owner
    ]
    assert entry.owner == first
    assert entry.used_bytes == sum(r.length for r in carried.values())
    object_size = (tmp_path / PREFIX / str(first) / entry.path).stat().st_size
    assert entry.used_bytes < object_size - 512 * 512 * 4

    result = sync(tmp_path).gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.deleted == [first] and result.retained == [second]
    own = [p for p in (tmp_path / PREFIX / str(second) / "operators").rglob("*") if p.is_file()]
    # The second's own objects of ranges (its rank object, its DCP metadata) are used
    # whole; the first's rank object only for what the second carried of it.
    own_bytes = sum(p.stat().st_size for p in own)
    assert result.pack_bytes == own_bytes + object_size
    assert result.pack_range_bytes == own_bytes + entry.used_bytes
    loaded = blank(state_at(2, base))
    load(tmp_path, loaded, second)
    assert_same(loaded, state_at(2, base))


def test_cairn_verify_and_copy_work_on_an_incremental_checkpoint(tmp_path: Path) -> None:
    store, target = tmp_path / "store", tmp_path / "copy"
    store.mkdir()
    save(store, state_at(1))
    state = state_at(2)
    second = save(store, state, epoch=2, incremental=True)
    cli = [sys.executable, "-m", "cairn.cli", "--store", str(store), "--prefix", PREFIX]
    verified = subprocess.run([*cli, "verify", str(second)], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
    copied = subprocess.run(
        [*cli, "copy", str(second), "--to", str(target)], capture_output=True, text=True
    )
    assert copied.returncode == 0, copied.stderr
    loaded = blank(state)
    assert load(target, loaded).checkpoint_id == second
    assert_same(loaded, state)


def test_an_explicit_parent_is_built_upon_and_a_missing_one_refused(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1))
    other = save(tmp_path, {"unrelated": torch.ones(3)}, epoch=5)
    state = state_at(2)
    second = save(tmp_path, state, epoch=6, incremental=True, parent=first)
    assert sync(tmp_path).load_manifest(second).parent_id == first
    assert uploaded_bytes(tmp_path, second) < nbytes(adapter(2)) + 64 * 1024
    assert other not in sync(tmp_path).dependents(first)
    with pytest.raises(CheckpointException) as info:
        save(tmp_path, state, epoch=7, incremental=True, parent=CheckpointId.now())
    [(error, _)] = info.value.failures.values()
    assert isinstance(error, CheckpointNotFoundError)
    with pytest.raises(InvalidInputError):
        CairnWriter(str(tmp_path), epoch=1, prefix=PREFIX, parent=first)


def test_without_incremental_every_item_is_uploaded(tmp_path: Path) -> None:
    save(tmp_path, state_at(1))
    second = save(tmp_path, state_at(2), epoch=2)
    assert sync(tmp_path).load_manifest(second).parent_id is None
    assert uploaded_bytes(tmp_path, second) >= nbytes(frozen_base())


def test_two_ranks_carry_their_shards_and_load_resharded(tmp_path: Path) -> None:
    from support import incremental_worker
    from support.servers import free_port

    root = tmp_path / "store"
    root.mkdir()
    single = save(root, incremental_worker.full_state(1))
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    args = (port, str(root), str(tmp_path))
    procs = [ctx.Process(target=incremental_worker.run_rank, args=(r, *args)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
        if proc.is_alive():
            proc.kill()
            proc.join()
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        assert "error" not in report, report["error"]
        assert report["resharded"] is True
    sharded = CheckpointId.parse(reports[0]["sharded"])
    trained = CheckpointId.parse(reports[0]["trained"])
    # The single save's whole base has other chunks than the shards: uploaded, not carried.
    manifest = sync(root).load_manifest(sharded)
    assert manifest.parent_id == single
    base = 1024 * 512 * 4
    assert uploaded_bytes(root, sharded) >= base
    # The trained save carries both ranks' base shards (and the bias) from its parent.
    manifest = sync(root).load_manifest(trained)
    assert manifest.parent_id == sharded
    carried = {(op, e.owner) for op, e in manifest.partition_entries() if e.owner is not None}
    assert {("rank-0", sharded), ("rank-1", sharded)} <= carried
    assert uploaded_bytes(root, trained) < 64 * 1024
    # Loaded by one process (2 -> 1), whole and bit-exact.
    state = {k: torch.zeros_like(v) for k, v in incremental_worker.full_state(2).items()}
    load(root, state, trained)
    assert_same(state, incremental_worker.full_state(2))


def test_a_fenced_incremental_writer_uploads_and_commits_nothing(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1))
    generation = sync(tmp_path).take_over()
    with pytest.raises(CheckpointException) as info:
        save(tmp_path, state_at(2), epoch=2, incremental=True)
    [(error, _)] = info.value.failures.values()
    assert isinstance(error, FencedError)
    assert sync(tmp_path).list_checkpoints() == [first]
    dirs = [p.name for p in (tmp_path / PREFIX).iterdir() if p.is_dir()]
    assert dirs == [str(first)]
    second = save(tmp_path, state_at(2), epoch=2, incremental=True, writer_generation=generation)
    assert sync(tmp_path).load_manifest(second).parent_id == first


def test_the_same_bytes_as_another_dtype_or_shape_are_not_carried(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1))
    base = frozen_base()
    base["layer0.weight"] = base["layer0.weight"].view(torch.int32)  # same bytes, dtype
    base["layer1.weight"] = base["layer1.weight"].reshape(1024, 256)  # same bytes, shape
    state = state_at(1, base)
    second = save(tmp_path, state, epoch=2, incremental=True)
    records, parent = records_of(tmp_path, second), records_of(tmp_path, first)
    for fqn in ("base.layer0.weight", "base.layer1.weight"):
        assert records[fqn].artifact != parent[fqn].artifact
        assert records[fqn].sha256 == parent[fqn].sha256
    assert records["base.layer0.weight"].dtype == "int32"
    assert records["base.layer1.weight"].shape == (1024, 256)
    assert records["base.layer2.weight"] == parent["base.layer2.weight"]
    loaded = blank(state)
    load(tmp_path, loaded)
    assert_same(loaded, state)


def test_a_fenced_writers_late_checkpoint_is_not_built_upon(tmp_path: Path) -> None:
    first = save(tmp_path, state_at(1))
    generation = sync(tmp_path).take_over()
    # A checkpoint of the fenced generation that landed after the takeover.
    late = CheckpointId.now()
    shutil.copytree(tmp_path / PREFIX / str(first), tmp_path / PREFIX / str(late))
    manifest = sync(tmp_path).load_manifest(first)
    forged = msgspec.structs.replace(manifest, checkpoint_id=late, epoch=5)
    (tmp_path / PREFIX / str(late) / "manifest.json").write_bytes(encode_manifest(forged))
    with pytest.raises(CheckpointException) as info:
        save(tmp_path, state_at(2), 6, incremental=True, parent=late, writer_generation=generation)
    [(error, _)] = info.value.failures.values()
    assert isinstance(error, InvalidInputError) and "fenced" in str(error)
    # By default the latest admitted checkpoint is the parent.
    second = save(tmp_path, state_at(2), 6, incremental=True, writer_generation=generation)
    assert sync(tmp_path).load_manifest(second).parent_id == first
