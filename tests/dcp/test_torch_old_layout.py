"""DCP checkpoints written in the layout of one object per tensor keep loading,
verifying, exporting, copying and being built upon.

``tests/data/dcp-store-per-tensor`` is a local store that the earlier DCP writer wrote,
with its size thresholds shrunk so the fixture stays small: every tensor of 1 KiB or
more was an object of its own and smaller items were packed into bundles, each object
listed in the manifest with the SHA-256 of its whole bytes. It holds two saves of the
state :func:`state` builds: ``step-1`` (full) and ``step-2`` (incremental on it: the
unchanged tensors carried, ``changing`` and ``step`` uploaded again).
``tests/data/dcp-store-per-tensor-zstd`` holds the same two saves by the earlier writer
with ``compression="zstd"``, which kept that layout after the uncompressed one moved to
an object per rank: each object compressed whole, its records pickled in DCP's
metadata. New saves onto it are compressed too, in the layout of today.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from support.cli import cairn
from support.paths import DATA
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import CheckpointPaths, RetentionPolicy, SyncCheckpointer
from cairn.torch import CairnReader, CairnWriter, export_dcp

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

OLD_STORES = {None: DATA / "dcp-store-per-tensor", "zstd": DATA / "dcp-store-per-tensor-zstd"}
"""Each old store, by the compression its writer used."""
PREFIX = "dcp/"


def state(step: int) -> dict[str, Any]:
    """The state the fixture's ``step-{step}`` holds."""
    return {
        "big": torch.arange(512, dtype=torch.float32),
        "small": torch.arange(16, dtype=torch.float32),
        "changing": torch.full((300,), float(step)),
        "step": step,
    }


def blank() -> dict[str, Any]:
    return {
        "big": torch.zeros(512),
        "small": torch.zeros(16),
        "changing": torch.zeros(300),
        "step": 0,
    }


def assert_state(loaded: dict[str, Any], step: int) -> None:
    expected = state(step)
    assert loaded["step"] == expected["step"]
    for key in ("big", "small", "changing"):
        assert torch.equal(loaded[key], expected[key]), key


@pytest.fixture(params=list(OLD_STORES), ids=["uncompressed", "zstd"])
def compression(request: pytest.FixtureRequest) -> str | None:
    """The compression of the old store under test (and of new saves onto it)."""
    value: str | None = request.param
    return value


@pytest.fixture
def old_store(tmp_path: Path, compression: str | None) -> Path:
    """A copy of the old writer's store (tests change it)."""
    root = tmp_path / "old"
    shutil.copytree(OLD_STORES[compression], root)
    return root


def test_the_compressed_old_store_is_in_the_old_layout() -> None:
    """The fixture is what it claims: objects compressed whole, records pickled whole."""
    ckpt = SyncCheckpointer(OLD_STORES["zstd"].as_uri(), CheckpointPaths(PREFIX))
    for cid in ckpt.list_checkpoints():
        entries = [e for _, e in ckpt.load_manifest(cid).partition_entries()]
        assert entries and all(e.codec == "zstd" and e.index_size_bytes is None for e in entries)


def test_old_per_tensor_checkpoints_load_by_name_and_as_the_latest(old_store: Path) -> None:
    for step in (1, 2):
        loaded = blank()
        reader = CairnReader(old_store.as_uri(), prefix=PREFIX)
        dcp_load(loaded, storage_reader=reader, checkpoint_id=f"step-{step}", no_dist=True)
        assert_state(loaded, step)
    latest = blank()
    dcp_load(latest, storage_reader=CairnReader(old_store.as_uri(), prefix=PREFIX), no_dist=True)
    assert_state(latest, 2)


def test_a_new_incremental_save_builds_on_an_old_one_and_gc_keeps_its_objects(
    old_store: Path, compression: str | None
) -> None:
    writer = CairnWriter(
        old_store.as_uri(), epoch=3, prefix=PREFIX, incremental=True, compression=compression
    )
    dcp_save(state(3), storage_writer=writer, checkpoint_id="step-3", no_dist=True)
    ckpt = SyncCheckpointer(old_store.as_uri(), CheckpointPaths(PREFIX))
    new = writer.checkpoint_id
    assert new is not None
    manifest = ckpt.load_manifest(new)
    carried = {e.owner for _, e in manifest.partition_entries() if e.owner is not None}
    assert carried, "the unchanged tensors are carried from the old checkpoints"
    result = ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.retained == [new] and not result.failures
    loaded = blank()
    reader = CairnReader(old_store.as_uri(), prefix=PREFIX)
    dcp_load(loaded, storage_reader=reader, checkpoint_id="step-3", no_dist=True)
    assert_state(loaded, 3)


def test_old_checkpoints_verify_copy_and_export(old_store: Path, tmp_path: Path) -> None:
    store = ["--store", old_store.as_uri(), "--prefix", PREFIX]
    verified = cairn("verify", "--all", *store)
    assert verified.code == 0, verified.explain()
    target = tmp_path / "copied"
    copied = cairn("copy", "--all", "--to", target.as_uri(), *store)
    assert copied.code == 0, copied.explain()
    loaded = blank()
    reader = CairnReader(target.as_uri(), prefix=PREFIX)
    dcp_load(loaded, storage_reader=reader, checkpoint_id="step-2", no_dist=True)
    assert_state(loaded, 2)
    ckpt = SyncCheckpointer(old_store.as_uri(), CheckpointPaths(PREFIX))
    latest = ckpt.read_latest()
    assert latest is not None
    exported = tmp_path / "exported"
    export_dcp(old_store.as_uri(), latest, exported, prefix=PREFIX)
    from_dir = blank()
    dcp_load(from_dir, storage_reader=FileSystemReader(exported), no_dist=True)
    assert_state(from_dir, 2)
