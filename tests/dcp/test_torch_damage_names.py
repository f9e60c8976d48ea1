"""A damaged item of a DCP checkpoint is named: the rank object's operator and partition,
and the item (its FQN) as the reader knows it; the items around it still load; cairn's
own load and ``cairn verify`` name the partition. Uncompressed and compressed saves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("zstandard")

import torch
from support import dcp as support_dcp
from support.cli import cairn, document
from support.dcp import PREFIX, item_records, load
from torch.distributed.checkpoint.api import CheckpointException

from cairn import (
    CheckpointId,
    CheckpointPaths,
    IntegrityError,
    IntegrityMismatchError,
    SyncCheckpointer,
)
from cairn.torch import METADATA_OPERATOR, CairnReader
from cairn.torch._format import ItemRecord

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

SAVED = {"a": torch.arange(1000.0), "b": torch.arange(1000.0) * 2, "c": torch.ones(1000)}


def blank() -> dict[str, Any]:
    return {key: torch.zeros(1000) for key in SAVED}


def records(store: str, cid: CheckpointId) -> dict[str, ItemRecord]:
    reader = CairnReader(store, checkpoint_id=cid, prefix=PREFIX)
    return {index.fqn: record for index, record in item_records(reader).items()}


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_flipped_byte_in_one_item_names_the_rank_partition_and_the_item(
    tmp_path: Path, compression: str | None
) -> None:
    store = str(tmp_path)
    cid = support_dcp.save(store, SAVED, compression=compression)
    record = records(store, cid)["b"]
    ckpt = SyncCheckpointer(store, CheckpointPaths(PREFIX))
    [(operator, entry)] = [
        (op, e)
        for op, e in ckpt.load_manifest(cid).partition_entries()
        if e.path == record.artifact
    ]
    assert operator == "rank-0"
    path = f"{PREFIX}{cid}/{record.artifact}"
    offset, length = record.extent
    flip(tmp_path / path, offset + length // 2)

    with pytest.raises(CheckpointException) as info:
        load(store, blank())
    [(error, _)] = info.value.failures.values()
    # A flipped byte inside a zstd frame here still decodes, to other bytes.
    assert isinstance(error, IntegrityMismatchError)
    assert (error.operator, error.partition, error.item, error.file) == (
        "rank-0",
        entry.partition_id,
        "b",
        None,
    )
    assert error.path == path
    assert error.expected == record.sha256
    where = f"operator 'rank-0', partition {entry.partition_id}, item 'b': "
    assert str(error).startswith(
        f"{where}sha256 of item 'b' (bytes {offset}..{offset + length}) mismatch at {path!r}: "
    )
    partial = {"a": torch.zeros(1000), "c": torch.zeros(1000)}
    load(store, partial)  # the items around it still load, verified
    assert torch.equal(partial["a"], SAVED["a"]) and torch.equal(partial["c"], SAVED["c"])

    # cairn's own load reads the rank object whole: it names the partition and the range.
    with pytest.raises(IntegrityError) as whole:
        ckpt.load(cid)
    assert (whole.value.operator, whole.value.partition, whole.value.item) == (
        "rank-0",
        entry.partition_id,
        None,
    )
    assert re.search(
        rf"sha256 of range \d+ \(bytes {offset}\.\.{offset + length}\)", str(whole.value)
    )
    assert str(whole.value).startswith(f"operator 'rank-0', partition {entry.partition_id}: ")
    verified = cairn("verify", str(cid), "--store", tmp_path.as_uri(), "--prefix", PREFIX, "--json")
    assert verified.code == 1, verified.explain()
    [checkpoint] = document("verify", verified)["checkpoints"]
    assert [(d["operator"], d["partition"], d["path"]) for d in checkpoint["damaged"]] == [
        ("rank-0", entry.partition_id, path)
    ]


def test_damaged_dcp_metadata_names_its_partition(tmp_path: Path) -> None:
    store = str(tmp_path)
    cid = support_dcp.save(store, SAVED)
    ckpt = SyncCheckpointer(store, CheckpointPaths(PREFIX))
    [entry] = ckpt.load_manifest(cid).operators[METADATA_OPERATOR].partitions
    flip(tmp_path / f"{PREFIX}{cid}/{entry.path}", 3)
    reader = CairnReader(store, checkpoint_id=cid, prefix=PREFIX)
    with pytest.raises(IntegrityError) as info:
        reader.read_metadata()
    assert (info.value.operator, info.value.partition) == (METADATA_OPERATOR, entry.partition_id)
    assert str(info.value).startswith(f"operator {METADATA_OPERATOR!r}, partition 0: ")
