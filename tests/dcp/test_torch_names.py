"""DCP ``checkpoint_id`` as torchtitan and torchtune give it: a path, a URL or a name.

One process (``no_dist``); the same with two gloo ranks, on local and S3 stores, is in
``test_torch_dist.py``. The mapping under test is :mod:`cairn.torch._target`'s.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it (scripts/test.sh)

import torch
from obstore.store import MemoryStore, S3Store
from support.torch_worker import BLANK_SEED, digests, make_state
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointLocationError,
    CheckpointNotFoundError,
    CheckpointPaths,
    InvalidInputError,
    SyncCheckpointer,
)
from cairn.torch import METADATA_OPERATOR, CairnReader, CairnWriter, load_latest
from cairn.torch._target import interpret

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

PREFIX = "dcp/"
PATHS = CheckpointPaths(PREFIX)


def save(store: Any, state: Any, checkpoint_id: Any, epoch: int = 1) -> CairnWriter:
    writer = CairnWriter(store, epoch=epoch, prefix=PREFIX)
    dcp_save(state, storage_writer=writer, checkpoint_id=checkpoint_id, no_dist=True)
    return writer


def load(store: Any, checkpoint_id: Any) -> tuple[dict[str, str], CairnReader]:
    state = make_state(BLANK_SEED)
    reader = CairnReader(store, prefix=PREFIX)
    dcp_load(state, storage_reader=reader, checkpoint_id=checkpoint_id, no_dist=True)
    return digests(state), reader


def flip(path: Path, offset: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def files_under(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


# -- the mapping ------------------------------------------------------------------------


def test_what_a_checkpoint_id_names_in_a_local_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (tmp_path / "link").symlink_to(root)
    cid = CheckpointId.now()
    store = str(root)
    cases: list[tuple[Any, Any]] = [
        ("step-100", "step-100"),
        ("./runs//a/step-1/", "runs/a/step-1"),
        (Path("runs/x"), "runs/x"),
        (str(cid), cid),
        (cid, cid),
        (f"{root}/x/step-10", "x/step-10"),
        (root / "x" / "step-10", "x/step-10"),
        (f"file://{root}/x/step-10", "x/step-10"),
        (tmp_path / "link" / "step-3", "step-3"),  # the same place, through a link
        (f"{root}/dcp/{cid}", cid),  # the directory cairn keeps that checkpoint in
        (f"dcp/{cid}/", cid),
        (f"other/{cid}", f"other/{cid}"),
        ("step:1", "step:1"),  # not a store URL's scheme: a name
    ]
    for value, expected in cases:
        assert interpret(value, store, PATHS, "checkpoint_id") == expected, value
    for value in ("/elsewhere/step-1", "s3://bucket/step-1", f"file://{tmp_path}/x"):
        with pytest.raises(CheckpointLocationError, match="outside the store") as info:
            interpret(value, store, PATHS, "checkpoint_id")
        assert info.value.checkpoint_id == value and str(root) in info.value.store
    with pytest.raises(CheckpointLocationError, match="root itself"):
        interpret(str(root), store, PATHS, "checkpoint_id")
    for value, message in (
        ("../x", "climbs out"),
        ("a/../../b", "climbs out"),
        ("", "names no checkpoint"),
        ("./", "names no checkpoint"),
        (b"step-1", "must be a checkpoint id"),
        (7, "must be a checkpoint id"),
        ("tab\tname", "control"),
        ("s3:/bucket/x", "not a usable URL"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            interpret(value, store, PATHS, "checkpoint_id")


def test_what_a_checkpoint_id_names_in_an_object_store() -> None:
    s3 = S3Store("bkt", prefix="jobs/run", aws_region="us-east-1", skip_signature=True)
    assert interpret("s3://bkt/jobs/run/step-1", s3, PATHS, "x") == "step-1"
    assert interpret("s3a://bkt/jobs/run/a/step-1", s3, PATHS, "x") == "a/step-1"
    assert interpret("s3://bkt/jobs/run/step-1", "s3://bkt/jobs/run", PATHS, "x") == "step-1"
    assert interpret("step-1", s3, PATHS, "x") == "step-1"
    for outside in ("s3://other/jobs/run/step-1", "s3://bkt/jobs/runs/step-1", "/jobs/run/x"):
        with pytest.raises(CheckpointLocationError, match="outside the store"):
            interpret(outside, s3, PATHS, "x")
    with pytest.raises(CheckpointLocationError, match="none to compare"):
        interpret("/data/step-1", MemoryStore(), PATHS, "x")
    assert interpret("step-1", MemoryStore(), PATHS, "x") == "step-1"
    error = CheckpointLocationError("/a", "file:///b", "is a location outside the store")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is CheckpointLocationError and copy.__dict__ == error.__dict__


def test_validate_checkpoint_id_answers_as_reset_accepts(tmp_path: Path) -> None:
    store = str(tmp_path)
    values: list[Any] = [
        "step-100",
        "runs/a/step-1",
        Path("runs/b"),
        str(CheckpointId.now()),
        CheckpointId.now(),
        f"{tmp_path}/x/step-2",
        f"file://{tmp_path}/y",
        "../up",
        "",
        b"bytes",
        None.__class__,
        "s3:/malformed",
        "a\\b",
    ]
    storages: list[CairnWriter | CairnReader] = [
        CairnWriter(store, epoch=1, prefix=PREFIX),
        CairnReader(store, prefix=PREFIX),
    ]
    for storage in storages:
        cls = type(storage)
        for value in values:
            try:
                storage.reset(value)
                accepted = True
            except InvalidInputError:
                accepted = False
            assert cls.validate_checkpoint_id(value) is accepted, (cls.__name__, value)
    assert CairnWriter.validate_checkpoint_id("/somewhere/else"), "well formed, for some store"
    with pytest.raises(CheckpointLocationError):
        CairnWriter(store, epoch=1, prefix=PREFIX).reset("/somewhere/else")


# -- saving and loading by name ---------------------------------------------------------


def test_saving_twice_under_one_name_loads_the_later_and_keeps_the_earlier(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = str(root)
    first, second = make_state(1), make_state(2)
    # As torchtitan calls it: a path f"{folder}/step-{n}", the folder being the store.
    earlier = save(store, first, f"{root}/step-10", epoch=10)
    assert earlier.name == "step-10" and earlier.checkpoint_id is not None
    before = files_under(root / PREFIX / str(earlier.checkpoint_id))
    later = save(store, second, root / "step-10", epoch=10)
    assert later.name == "step-10" and later.checkpoint_id != earlier.checkpoint_id
    assert files_under(root / PREFIX / str(earlier.checkpoint_id)) == before, "untouched"
    for checkpoint_id in ("step-10", f"{root}/step-10", f"file://{root}/step-10"):
        loaded, reader = load(store, checkpoint_id)
        assert loaded == digests(second) and reader.checkpoint_id == later.checkpoint_id
        assert reader.name == "step-10"
    loaded, reader = load(store, str(earlier.checkpoint_id))
    assert loaded == digests(first) and reader.name == "step-10"
    ckpt = SyncCheckpointer(store, PATHS)
    manifests = [ckpt.load_manifest(cid) for cid in ckpt.list_checkpoints()]
    assert [(m.checkpoint_id, m.name) for m in manifests] == [
        (earlier.checkpoint_id, "step-10"),
        (later.checkpoint_id, "step-10"),
    ]
    # The writer forgets the name once it has saved: the next save has none.
    dcp_save(make_state(3), storage_writer=later, no_dist=True)
    assert later.name is None
    assert ckpt.load_manifest(later.checkpoint_id).name is None
    # A reader given the name up front, as dcp.load without checkpoint_id uses it.
    state = make_state(BLANK_SEED)
    dcp_load(state, storage_reader=CairnReader(store, checkpoint_id="step-10", prefix=PREFIX))
    assert digests(state) == digests(second)


def test_a_location_outside_the_store_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    elsewhere = tmp_path / "elsewhere" / "step-1"
    with pytest.raises(CheckpointLocationError, match="outside the store"):
        save(str(store), {"x": torch.ones(2)}, str(elsewhere))
    with pytest.raises(CheckpointLocationError, match="outside the store"):
        load(str(store), f"file://{elsewhere}")
    assert not (tmp_path / "elsewhere").exists()
    assert SyncCheckpointer(str(store), PATHS).list_checkpoints() == []


def test_a_name_passes_over_what_does_not_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path)
    good = save(store, make_state(1), "step-1")
    damaged = save(store, make_state(2), "step-1")
    assert damaged.checkpoint_id is not None
    manifest = SyncCheckpointer(store, PATHS).load_manifest(damaged.checkpoint_id)
    [entry] = manifest.operators[METADATA_OPERATOR].partitions
    path = tmp_path / PREFIX / str(damaged.checkpoint_id) / entry.path
    flip(path)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        loaded, reader = load(store, "step-1")
    assert reader.checkpoint_id == good.checkpoint_id and loaded == digests(make_state(1))
    assert str(damaged.checkpoint_id) in caplog.text
    (tmp_path / PREFIX / str(good.checkpoint_id) / "manifest.json").unlink()
    with pytest.raises(CheckpointNotFoundError) as info:
        CairnReader(store, checkpoint_id="step-1", prefix=PREFIX).read_metadata()
    message = str(info.value)
    assert "named 'step-1'" in message and "1 that do not load" in message, message
    assert str(damaged.checkpoint_id) in message


def test_not_found_says_what_was_searched_and_what_was_found(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    with pytest.raises(CheckpointNotFoundError) as info:
        CairnReader(str(empty), prefix=PREFIX).read_metadata()
    message = str(info.value)
    assert "committed DCP checkpoint" in message and f"prefix {PREFIX!r}" in message
    assert f"file://{os.path.realpath(empty)}" in message
    assert "holds no committed checkpoint" in message, message

    plain = tmp_path / "plain"
    ckpt = SyncCheckpointer(str(plain), PATHS)
    for epoch in (1, 2):
        ckpt.save(CheckpointData(epoch=epoch, snapshots={("op", 0): b"not dcp"}))
    with pytest.raises(CheckpointNotFoundError) as info:
        CairnReader(str(plain), prefix=PREFIX).read_metadata()
    assert "2 committed checkpoint(s), 2 not saved by DCP (no 'dcp-metadata' operator)" in str(
        info.value
    )
    with pytest.raises(CheckpointNotFoundError) as info:
        CairnReader(str(plain), checkpoint_id="step-9", prefix=PREFIX).read_metadata()
    assert "none of its 2 committed checkpoint(s) has a name" in str(info.value)

    save(str(plain), {"x": torch.ones(2)}, "step-1")
    save(str(plain), {"x": torch.ones(2)}, "runs/step-2")
    with pytest.raises(CheckpointNotFoundError) as info:
        CairnReader(str(plain), checkpoint_id="step-9", prefix=PREFIX).read_metadata()
    assert "the names there are 'runs/step-2', 'step-1'" in str(info.value)

    # load_latest's own search says what it passed over.
    [dcp_id] = [
        cid
        for cid in ckpt.list_checkpoints()
        if METADATA_OPERATOR in ckpt.load_manifest(cid).operators
        and ckpt.load_manifest(cid).name == "runs/step-2"
    ]
    entry = ckpt.load_manifest(dcp_id).operators["rank-0"].partitions[0]
    path = plain / PREFIX / str(dcp_id) / entry.path
    flip(path)
    other = next(c for c in ckpt.list_checkpoints() if ckpt.load_manifest(c).name == "step-1")
    entry = ckpt.load_manifest(other).operators["rank-0"].partitions[0]
    path = plain / PREFIX / str(other) / entry.path
    flip(path)
    with pytest.raises(CheckpointNotFoundError) as info:
        load_latest({"x": torch.zeros(2)}, str(plain), prefix=PREFIX)
    assert "2 passed over as asked (damaged shards)" in str(info.value), info.value
