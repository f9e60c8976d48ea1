"""DCP on cairn, one process: byte items are never unpickled as arbitrary objects, and
signed DCP checkpoints (``signing_key=``) refuse what someone without the key wrote."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the torch extra

import torch
from support.dcp import item_records
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import CheckpointPaths, SignatureError, SyncCheckpointer
from cairn.format.signing import read_signature
from cairn.torch import CairnReader, CairnWriter, SafeLoadPlanner, load_latest

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

PREFIX = "dcp/"
KEY = bytes.fromhex("3c" * 32)
calls: list[str] = []


def record_ran(marker: str) -> str:
    """What the crafted item calls when unpickled: records that it ran (and touches a file)."""
    calls.append(marker)
    Path(marker).touch()
    return "pwned"


class Payload:
    """A value whose pickle calls :func:`record_ran`: what an attacker would store."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (record_ran, (self.marker,))


@pytest.fixture(autouse=True)
def _forget_runs() -> None:
    calls.clear()


def save(store: str, state: dict[str, Any], epoch: int, **options: Any) -> str:
    writer = CairnWriter(store, epoch=epoch, prefix=PREFIX, **options)
    dcp_save(state, storage_writer=writer, no_dist=True)
    assert writer.checkpoint_id is not None
    return str(writer.checkpoint_id)


def stored_item(store: str, fqn: str) -> bytes:
    """The bytes cairn stored for byte item ``fqn`` of the latest checkpoint."""
    ckpt = SyncCheckpointer(store, CheckpointPaths(PREFIX))
    loaded = ckpt.load_latest()
    assert loaded is not None
    reader = CairnReader(store, prefix=PREFIX, checkpoint_id=str(loaded.manifest.checkpoint_id))
    [record] = [r for i, r in item_records(reader).items() if i.fqn == fqn]
    partition = int(record.artifact.rsplit("-", 1)[1].split(".")[0])
    data = bytes(loaded.artifacts[("rank-0", partition)])
    return data[record.offset : record.offset + record.length]


def test_dcps_default_planner_runs_a_crafted_byte_item_cairns_never_does(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    marker = tmp_path / "ran"
    save(store, {"w": torch.ones(4), "evil": Payload(marker)}, epoch=1)
    crafted = stored_item(store, "evil")

    # The threat is real: DCP's own planner unpickles the item with weights_only=False.
    planner = DefaultLoadPlanner(flatten_state_dict=False)
    planner.state_dict = {}
    item = ReadItem(
        LoadItemType.BYTE_IO,
        MetadataIndex("evil"),
        torch.Size([0]),
        MetadataIndex("evil"),
        torch.Size([0]),
        torch.Size([0]),
    )
    planner.load_bytes(item, io.BytesIO(crafted))
    assert calls == [str(marker)] and marker.exists() and planner.state_dict["evil"] == "pwned"
    calls.clear()
    marker.unlink()
    # ... and through DCP's own reader, as a whole dcp.load.
    dcp_save(
        {"evil": Payload(marker)}, storage_writer=FileSystemWriter(tmp_path / "fs"), no_dist=True
    )
    dcp_load({"evil": 0}, storage_reader=FileSystemReader(tmp_path / "fs"), no_dist=True)
    assert calls == [str(marker)]
    calls.clear()
    marker.unlink()

    # cairn: the safe planner refuses it, naming the item; so does the default planner
    # through CairnReader, and load_latest. Nothing of it runs.
    attempts: list[Callable[[dict[str, Any]], object]] = [
        lambda state: dcp_load(
            state,
            storage_reader=CairnReader(store, prefix=PREFIX),
            planner=SafeLoadPlanner(),
            no_dist=True,
        ),
        lambda state: dcp_load(
            state, storage_reader=CairnReader(store, prefix=PREFIX), no_dist=True
        ),
        lambda state: load_latest(state, store, prefix=PREFIX),
    ]
    for attempt in attempts:
        with pytest.raises(CheckpointException) as info:
            attempt({"w": torch.zeros(4), "evil": 0})
        [(error, _)] = info.value.failures.values()
        assert isinstance(error, pickle.UnpicklingError) and "'evil'" in str(error)
    assert calls == [] and not marker.exists()


def test_plain_byte_items_load_with_the_safe_planner(tmp_path: Path) -> None:
    store = str(tmp_path)
    weights = torch.arange(3.0)
    state = {"w": weights, "step": 7, "cfg": {"lr": 0.5, "names": ["a", "b"]}}
    save(store, state, epoch=1)
    blank: dict[str, Any] = {"w": torch.zeros(3), "step": 0, "cfg": {"lr": 0.0, "names": []}}
    dcp_load(
        blank,
        storage_reader=CairnReader(store, prefix=PREFIX),
        planner=SafeLoadPlanner(),
        no_dist=True,
    )
    assert blank["step"] == 7 and blank["cfg"] == state["cfg"]
    assert torch.equal(blank["w"], weights)


def test_signed_dcp_checkpoints_and_a_forged_latest(tmp_path: Path) -> None:
    """The writer signs; a keyed reader loads it and passes over a newer checkpoint
    written without the key; ``load_latest`` with the key does too."""
    store = str(tmp_path)
    signed = save(store, {"w": torch.ones(2), "step": 1}, epoch=1, signing_key=KEY)
    manifest = (tmp_path / PREFIX / signed / "manifest.json").read_bytes()
    assert read_signature(manifest) is not None
    planted = save(store, {"w": torch.full((2,), 9.0), "step": 99}, epoch=2)

    state: dict[str, Any] = {"w": torch.zeros(2), "step": 0}
    reader = CairnReader(store, prefix=PREFIX, signing_key=KEY)
    dcp_load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    assert str(reader.checkpoint_id) == signed and state["step"] == 1

    state = {"w": torch.zeros(2), "step": 0}
    assert str(load_latest(state, store, prefix=PREFIX, signing_key=KEY)) == signed
    assert state["step"] == 1
    state = {"w": torch.zeros(2), "step": 0}
    assert str(load_latest(state, store, prefix=PREFIX)) == planted  # without the key
    with pytest.raises(SignatureError, match="not signed"):
        CairnReader(store, prefix=PREFIX, checkpoint_id=planted, signing_key=KEY).read_metadata()

    # The key travels with a writer pickled into dcp.async_save's process.
    writer = pickle.loads(pickle.dumps(CairnWriter(store, epoch=3, prefix=PREFIX, signing_key=KEY)))
    dcp_save({"w": torch.ones(2), "step": 3}, storage_writer=writer, no_dist=True)
    state = {"w": torch.zeros(2), "step": 0}
    assert load_latest(state, store, prefix=PREFIX, signing_key=KEY) == writer.checkpoint_id
    assert state["step"] == 3
