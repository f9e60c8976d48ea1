"""Parts of PyTorch's own DCP tests, with FileSystemWriter/Reader swapped for cairn's.

Each test is a small adaptation (one process, CPU) of one upstream test, from
``test/distributed/checkpoint/`` in pytorch/pytorch:

* ``test_file_system_checkpoint_cpu.py``:
  ``TestDistributedStateDictSaveLoad.test_read_write_only_tensor`` (a module's state
  dict round trip, refused to compare equal before the load),
  ``TestDistributedStateDictSaveLoadRot13.test_read_write_tensor_and_blob`` (a
  ``Stateful`` holding a bytes blob, without the Rot13 stream extension, which cairn
  has no use for), and ``TestDistributedStateDictSaveLoad.test_dtype_mismatch_casting``
  (a float32 checkpoint loads into a bfloat16 template by casting, and a bfloat16 one
  into float32; the strict ``allow_unsafe_types=False`` planner of newer torch is not
  in torch 2.13);
* ``test_format_utils.py`` (``test_dcp_to_torch_save``, ``test_torch_save_to_dcp``): in
  ``test_torch_dcpdir.py``, through export and import;
* ``test_dtensor_resharding.py`` (``test_1d_to_1d_reshard_placement_change``): in
  ``test_torch_dist.py``, on two gloo ranks (and NCCL, where two GPUs are).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it (scripts/test.sh)

import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn.torch import CairnReader, CairnWriter

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)


class MyTestModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = torch.nn.Linear(5, 5)
        self.linear_2 = torch.nn.Linear(5, 1)
        self.emb = torch.nn.EmbeddingBag(5, 10)


class BlobState:
    """A ``Stateful`` holding bytes (DCP saves it through its state_dict)."""

    def __init__(self, value: bytes) -> None:
        self.state = {"blob": value}

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = state_dict

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlobState) and self.state == other.state


def assert_state_dict_equal(one: dict[str, Any], two: dict[str, Any]) -> None:
    assert one.keys() == two.keys(), "state_dict keys do not match"
    for key, value in one.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, two[key]), f"{key}'s tensor does not match"
        else:
            assert value == two[key], key


def save(root: Path, state: dict[str, Any]) -> None:
    dcp_save(state, storage_writer=CairnWriter(str(root), epoch=1), no_dist=True)


def load(root: Path, state: dict[str, Any]) -> None:
    dcp_load(state, storage_reader=CairnReader(str(root)), no_dist=True)


def test_read_write_only_tensor(tmp_path: Path) -> None:
    to_save = MyTestModule().state_dict()
    save(tmp_path, to_save)
    to_load = MyTestModule().state_dict()
    with pytest.raises(AssertionError):
        assert_state_dict_equal(to_load, to_save)
    load(tmp_path, to_load)
    assert_state_dict_equal(to_load, to_save)


def test_read_write_tensor_and_blob(tmp_path: Path) -> None:
    to_save: dict[str, Any] = dict(MyTestModule().state_dict())
    to_save["test_blob"] = BlobState(b"SomeBlobForTesting")
    save(tmp_path, to_save)
    to_load: dict[str, Any] = dict(MyTestModule().state_dict())
    to_load["test_blob"] = BlobState(b"")
    with pytest.raises(AssertionError):
        assert_state_dict_equal(to_load, to_save)
    load(tmp_path, to_load)
    assert_state_dict_equal(to_load, to_save)


def test_dtype_mismatch_casting(tmp_path: Path) -> None:
    fp32 = {"w": torch.rand(4, 3, dtype=torch.float32)}
    save(tmp_path / "narrow", fp32)
    template = {"w": torch.zeros(4, 3, dtype=torch.bfloat16)}
    load(tmp_path / "narrow", template)  # narrowing casts, as DCP's own reader does
    assert template["w"].dtype == torch.bfloat16
    assert torch.equal(template["w"], fp32["w"].to(torch.bfloat16))
    bf16 = {"w": torch.rand(4, 3, dtype=torch.bfloat16)}
    save(tmp_path / "wide", bf16)
    wide = {"w": torch.zeros(4, 3, dtype=torch.float32)}
    load(tmp_path / "wide", wide)
    assert wide["w"].dtype == torch.float32 and torch.equal(wide["w"], bf16["w"].float())
