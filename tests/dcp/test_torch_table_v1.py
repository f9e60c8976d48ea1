"""DCP checkpoints whose metadata is a chunk table of the first version (its rows and
blocks stored uncompressed) keep loading, verifying, exporting and being built upon.

``tests/data/dcp-store-table-v1`` is a local store that the writer of that version
wrote, playing 4 ranks in one process (``support.dcp``): ``step-1`` (full) and
``step-2`` (incremental on it: ``b`` changed, the rest carried), of the state
:func:`whole_state` builds, each tensor sharded along dim 0 over the 4 ranks.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from support.cli import cairn
from support.dcp import Shard, load_rank, save_ranks, sharded
from support.paths import DATA
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from cairn import CheckpointPaths, SyncCheckpointer
from cairn.torch import METADATA_OPERATOR, CairnReader, export_dcp
from cairn.torch import _itemtable as itemtable

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

OLD_STORE = DATA / "dcp-store-table-v1"
PREFIX = "dcp/"
RANKS = 4


def whole_state(step: int) -> dict[str, Any]:
    """The state the fixture's ``step-{step}`` holds."""
    generator = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(10, 6, generator=generator),
        "b": torch.randn(7, generator=generator) + step,
        "e": torch.randn(2, 3, generator=generator),
        "step": step,
    }


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    """A copy of the old writer's store (tests change it)."""
    root = tmp_path / "old"
    shutil.copytree(OLD_STORE, root)
    return root


def reader(root: Path, name: str) -> CairnReader:
    return CairnReader(str(root), prefix=PREFIX, checkpoint_id=name)


def assert_rank_loads(root: Path, name: str, whole: dict[str, Any], ranks: int) -> None:
    for rank in range(ranks):
        state = sharded(whole, ranks, rank, blank=True)
        load_rank(reader(root, name), state)
        expected = sharded(whole, ranks, rank)
        for fqn, value in state.items():
            if isinstance(value, Shard):
                assert torch.equal(value.local, expected[fqn].local), (name, rank, fqn)


def test_the_fixture_is_a_first_version_chunk_table(old_store: Path) -> None:
    metadata = reader(old_store, "step-2").read_metadata()
    md = metadata.state_dict_metadata["w"]
    assert isinstance(md, TensorStorageMetadata) and isinstance(md.chunks, itemtable.ChunkList)
    ckpt = SyncCheckpointer(str(old_store), CheckpointPaths(PREFIX))
    latest = ckpt.read_latest()
    assert latest is not None
    [entry] = ckpt.load_manifest(latest).operators[METADATA_OPERATOR].partitions
    assert entry.index_size_bytes is not None
    path = old_store / PREFIX / str(latest) / entry.path
    assert b"cairn-dcp-chunk-table-v1" in path.read_bytes()


@pytest.mark.parametrize("ranks", [RANKS, 1, 3])
def test_old_table_checkpoints_load_bit_exact_over_any_rank_count(
    old_store: Path, ranks: int
) -> None:
    for step in (1, 2):
        assert_rank_loads(old_store, f"step-{step}", whole_state(step), ranks)


def test_a_new_incremental_save_builds_on_an_old_table(old_store: Path) -> None:
    whole = whole_state(3)
    states = [sharded(whole, RANKS, r) for r in range(RANKS)]
    new = save_ranks(str(old_store), states, prefix=PREFIX, incremental=True)
    ckpt = SyncCheckpointer(str(old_store), CheckpointPaths(PREFIX))
    manifest = ckpt.load_manifest(new)
    carried = {e.owner for _, e in manifest.partition_entries() if e.owner is not None}
    assert carried, "w and e are carried from the old checkpoints"
    assert_rank_loads(old_store, str(new), whole, RANKS)


def test_old_table_checkpoints_verify_copy_and_export(old_store: Path, tmp_path: Path) -> None:
    store = ["--store", old_store.as_uri(), "--prefix", PREFIX]
    verified = cairn("verify", "--all", *store)
    assert verified.code == 0, verified.explain()
    target = tmp_path / "copied"
    copied = cairn("copy", "--all", "--to", target.as_uri(), *store)
    assert copied.code == 0, copied.explain()
    assert_rank_loads(target, "step-2", whole_state(2), RANKS)
    exported = tmp_path / "exported"
    ckpt = SyncCheckpointer(str(old_store), CheckpointPaths(PREFIX))
    latest = ckpt.read_latest()
    assert latest is not None
    export_dcp(str(old_store), latest, exported, prefix=PREFIX)
    whole = {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0
        for k, v in whole_state(2).items()
    }
    dcp_load(whole, storage_reader=FileSystemReader(exported), no_dist=True)
    expected = whole_state(2)
    assert whole["step"] == 2
    for key in ("w", "b", "e"):
        loaded, saved = whole[key], expected[key]
        assert isinstance(loaded, torch.Tensor) and isinstance(saved, torch.Tensor)
        assert torch.equal(loaded, saved), key
