"""DCP on cairn in one process (``no_dist``): format, verification, refusals, the tools.

The multi-process behaviour (gloo ranks, resharding, async_save, SIGKILL, S3) is in
``test_torch_dist.py``; this module checks, quickly, what one process can show.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it (scripts/test.sh)

import msgspec
import numpy as np
import torch
from obstore.store import LocalStore, MemoryStore
from support.dcp import PREFIX, RankRangeStore, assert_same, item_records, load, save
from support.intents import is_intent_path
from support.recording import RecordingStore
from support.torch_worker import BLANK_SEED, digests, make_state
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from cairn import (
    BrokenChainError,
    CheckpointData,
    CheckpointExistsError,
    CheckpointId,
    CheckpointLocationError,
    CheckpointNotFoundError,
    CheckpointPaths,
    CorruptManifestError,
    FencedError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidInputError,
    RetentionPolicy,
    SyncCheckpointer,
    SyncInAsyncContextError,
)
from cairn.format.integrity import sha256_hex
from cairn.format.manifest import encode_manifest
from cairn.format.ranges import decode_index, encode_index, index_size
from cairn.protocol import _upload
from cairn.stores import ForwardingStore, ObstoreStore, Store
from cairn.torch import (
    METADATA_OPERATOR,
    CairnReader,
    CairnWriter,
    _rankobject,
    _reader,
    _writer,
    load_latest,
)
from cairn.torch._format import tensor_bytes

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)


_TORCH_VERSION = tuple(int(part) for part in torch.__version__.split(".")[:2])


def odd_tensors() -> dict[str, torch.Tensor]:
    """Tensors of every shape of trouble: dtypes numpy lacks, 0-d, empty, strided, big."""
    gen = torch.Generator().manual_seed(7)
    big = torch.randn(512, 1024, generator=gen)  # 2 MiB: an artifact of its own
    return {
        "big": big,
        "bf16": torch.randn(33, 7, generator=gen).to(torch.bfloat16),
        "f16": torch.randn(5, generator=gen).to(torch.float16),
        "i64": torch.arange(-50, 50, dtype=torch.int64),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(4, 3, dtype=torch.complex64, generator=gen),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(64, 48, generator=gen).t(),  # not contiguous
        "strided_big": torch.randn(1024, 600, generator=gen)[:, ::2],  # strided, 1.2 MiB
    }


def odd_state() -> dict[str, Any]:
    return {"tensors": odd_tensors(), "step": 41, "note": "héllo", "cfg": {"lr": 0.1}}


def blank_like(state: Any) -> Any:
    """A state of the same structure whose every value differs (tensors are zeroed
    contiguous copies, except ``big``, kept as a view to check loads into views)."""
    if isinstance(state, dict):
        return {k: blank_like(v) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state.contiguous()) if state.numel() else state.clone()
    if isinstance(state, str):
        return ""
    return 0 if isinstance(state, int) else None


def sync(store: Any) -> SyncCheckpointer:
    return SyncCheckpointer(store, CheckpointPaths(PREFIX))


def flip_byte(root: Path, relative: str, offset: int) -> None:
    path = root / relative
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def failure_of(info: pytest.ExceptionInfo[CheckpointException]) -> BaseException:
    """The one rank's exception inside DCP's CheckpointException."""
    [(error, _)] = info.value.failures.values()
    return error


# -- the format -----------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("kind", ["memory", "local"])
def test_every_kind_of_tensor_and_value_round_trips_bit_exactly(
    kind: str, compression: str | None, tmp_path: Path
) -> None:
    store = MemoryStore() if kind == "memory" else str(tmp_path)
    state = odd_state()
    cid = save(store, state, epoch=3, compression=compression)
    blank = blank_like(state)
    reader = load(store, blank)
    assert reader.checkpoint_id == cid
    assert_same(blank, state)
    manifest = sync(store).load_manifest(cid)
    assert manifest.epoch == 3 and sorted(manifest.operators) == [METADATA_OPERATOR, "rank-0"]
    parts = manifest.operators["rank-0"].partitions
    assert all(p.codec is None for _, p in manifest.partition_entries())
    # One object of ranges holds every item of the rank, each a frame when compressed.
    items = item_records(reader)
    [entry] = parts
    assert entry.index_size_bytes == index_size(len(items), compression)
    assert {r[0] for r in items.values()} == {entry.path}
    assert all((r.stored_length is not None) == (compression is not None) for r in items.values())


def test_contiguous_tensors_are_sent_from_their_own_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    view, owner, copied = tensor_bytes(tensor, "t")
    assert not copied and owner.data_ptr() == tensor.data_ptr()
    assert np.frombuffer(memoryview(view), np.uint8).ctypes.data == tensor.data_ptr()
    strided = torch.arange(100.0)[::2]
    view, owner, copied = tensor_bytes(strided, "t")
    assert copied and bytes(view) == strided.contiguous().numpy().tobytes()
    with pytest.raises(InvalidInputError, match="'sparse'.*dense"):
        tensor_bytes(torch.eye(3).to_sparse(), "'sparse'")
    trained = torch.randn(8, requires_grad=True)  # its memory, without the autograd graph
    view, owner, copied = tensor_bytes(trained, "t")
    assert not copied and owner.data_ptr() == trained.data_ptr() and not owner.requires_grad
    lazy = torch.randn(4, 3, dtype=torch.complex64)
    for tensor in (lazy.conj(), torch.randn(4, 3, dtype=torch.complex64).conj().imag):
        view, owner, copied = tensor_bytes(tensor, "t")  # a lazy conjugate or negative bit
        assert copied and bytes(view) == tensor.resolve_conj().resolve_neg().numpy().tobytes()
    f8 = torch.randn(16).to(torch.float8_e4m3fn)  # no numpy dtype: reinterpreted by torch
    view, owner, copied = tensor_bytes(f8, "t")
    assert not copied and bytes(view) == f8.view(torch.uint8).numpy().tobytes()
    # End to end: a streamed rank object's chunks are views of the tensor's own memory
    # ("big", 1 MiB, made a large item, in an object too large for one PUT).
    monkeypatch.setattr(_writer, "OBJECT_BYTES", 512 << 10)
    monkeypatch.setattr(_upload, "JOINED_OBJECT_BYTES", 512 << 10)
    store = _ChunkStore(ObstoreStore(MemoryStore()))
    big = torch.randn(256, 1024)
    save(store, {"big": big, "small": torch.ones(3)})
    chunks = store.chunks[next(p for p in store.chunks if "/rank-0/" in p)]
    assert chunks[0] == big.data_ptr()


class _ChunkStore(ForwardingStore):
    """Records, per ``put_stream``, the address of each chunk it was handed, and the
    bytes of chunks consumed so far (all streams together)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.chunks: dict[str, list[int]] = {}
        self.consumed = 0

    async def put_stream(self, path: str, open_chunks: Any, *, metadata: Any = None) -> None:
        def recording() -> Any:
            async def chunks() -> Any:
                self.chunks[path] = []
                async for chunk in open_chunks():
                    view = np.frombuffer(memoryview(chunk), np.uint8)
                    self.chunks[path].append(view.ctypes.data)
                    self.consumed += view.nbytes
                    yield chunk

            return chunks()

        await super().put_stream(path, recording, metadata=metadata)


class _RecordingPlanner(DefaultSavePlanner):
    """Records, at each ``resolve_data``, the bytes ``store`` had consumed by then."""

    def __init__(self, store: _ChunkStore) -> None:
        super().__init__()
        self.store = store
        self.resolved_at: list[int] = []

    def resolve_data(self, write_item: Any) -> Any:
        self.resolved_at.append(self.store.consumed)
        return super().resolve_data(write_item)


@pytest.mark.parametrize(
    ("ahead_runs", "run_items", "ahead_bytes", "run_bytes"),
    [
        (4, 1, 64 << 20, 16 << 20),  # four items ahead
        (8, 64, 5 << 20, 1 << 20),  # bounded by bytes: three items ahead
        (2, 2, 64 << 20, 64 << 20),  # runs of two items, two runs ahead
        (4, 64, 8 << 20, 4 << 20),  # runs of two items by their bytes, two runs ahead
    ],
)
def test_items_are_resolved_a_bounded_distance_ahead_of_the_upload(
    monkeypatch: pytest.MonkeyPatch,
    ahead_runs: int,
    run_items: int,
    ahead_bytes: int,
    run_bytes: int,
) -> None:
    """A rank's copies are not all held at once: item k is resolved only once the items
    of the runs more than the bound ahead of it (AHEAD_RUNS runs, AHEAD_BYTES bytes)
    have gone to the store. (The items are made large ones, which one streamed object
    holds: a small items' object holds at most OBJECT_BYTES, resolved or not.)"""
    monkeypatch.setattr(_writer, "OBJECT_BYTES", 1 << 20)
    monkeypatch.setattr(_upload, "JOINED_OBJECT_BYTES", 0)
    monkeypatch.setattr(_rankobject, "AHEAD_RUNS", ahead_runs)
    monkeypatch.setattr(_rankobject, "AHEAD_BYTES", ahead_bytes)
    monkeypatch.setattr(_rankobject, "RUN_ITEMS", run_items)
    monkeypatch.setattr(_rankobject, "RUN_BYTES", run_bytes)
    store = _ChunkStore(ObstoreStore(MemoryStore()))
    state = {f"t{i}": torch.randn(1024, 1024)[:, ::2] for i in range(12)}  # 2 MiB copies
    planner = _RecordingPlanner(store)
    writer = CairnWriter(store, epoch=1, prefix=PREFIX)
    dcp_save(state, storage_writer=writer, planner=planner, no_dist=True)
    size = 1024 * 512 * 4
    per_run = min(run_items, max(1, run_bytes // size))
    runs_ahead = min(ahead_runs, -(-ahead_bytes // (per_run * size)))
    # Unsent when item k is resolved: the run being sent, the runs ahead, k's own run.
    window = (runs_ahead + 1) * per_run - 1
    assert len(planner.resolved_at) == 12
    for k, consumed in enumerate(planner.resolved_at):
        assert consumed >= max(0, k - window) * size, (k, window, planner.resolved_at)
    blank = {k: torch.zeros(1024, 512) for k in state}
    load(store, blank)
    assert_same(blank, state)


def test_small_items_are_handed_to_worker_threads_in_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Items hashed off the event loop go to a worker thread a run at a time (up to
    RUN_BYTES), not one hand-off each."""
    handed: list[str] = []
    real = asyncio.to_thread

    async def counting(function: Any, /, *args: Any) -> Any:
        handed.append(getattr(function, "__qualname__", ""))
        return await real(function, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    state = {f"t{i:02}": torch.full((128, 1024), float(i)) for i in range(40)}  # 512 KiB
    store = MemoryStore()
    save(store, state)
    # 32 items fill a run of RUN_BYTES (16 MiB), the other 8 make the second.
    assert [h for h in handed if "prepare" in h] == ["ItemRanges._ranges.<locals>.prepare"] * 2
    blank = {k: torch.zeros(128, 1024) for k in state}
    load(store, blank)
    assert_same(blank, state)


@pytest.mark.parametrize("large", [False, True])
def test_a_rank_holding_more_than_the_object_size_gets_one_object_per_that_size(
    monkeypatch: pytest.MonkeyPatch, large: bool
) -> None:
    store = MemoryStore()
    # Items of at most OBJECT_BYTES share objects of that size; larger ones share
    # objects of RANK_OBJECT_BYTES.
    monkeypatch.setattr(_writer, "OBJECT_BYTES", 100 << 10 if large else 3 << 20)
    monkeypatch.setattr(_writer, "RANK_OBJECT_BYTES", 3 << 20)
    state = {f"t{i}": torch.full((1000, 256), float(i)) for i in range(8)}  # 1000 KiB each
    cid = save(store, state)
    parts = sync(store).load_manifest(cid).operators["rank-0"].partitions
    sizes = [p.size_bytes - (p.index_size_bytes or 0) for p in parts]
    assert sizes == [3 * 1000 * 1024, 3 * 1000 * 1024, 2 * 1000 * 1024]
    blank = {k: torch.zeros(1000, 256) for k in state}
    load(store, blank)
    assert_same(blank, state)


def test_small_items_share_objects_of_their_own_beside_one_object_of_the_large_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    monkeypatch.setattr(_writer, "OBJECT_BYTES", 2 << 20)
    big = {f"big{i}": torch.full((768, 1024), float(i)) for i in range(3)}  # 3 MiB each
    small = {f"small{i}": torch.full((256, 1024), -float(i)) for i in range(5)}  # 1 MiB
    order = ["small0", "big0", "small1", "big1", "small2", "big2", "small3", "small4"]
    state = {name: (small | big)[name] for name in order}
    cid = save(store, state)
    reader = load(store, {k: torch.zeros_like(v) for k, v in state.items()})
    parts = sync(store).load_manifest(cid).operators["rank-0"].partitions
    sizes = [p.size_bytes - (p.index_size_bytes or 0) for p in parts]
    assert sizes == [2 << 20, 2 << 20, 1 << 20, 9 << 20]
    holders: dict[str, set[str]] = {}
    for index, record in item_records(reader).items():
        holders.setdefault(record.artifact, set()).add(index.fqn)
    assert {frozenset(held) for held in holders.values()} == {
        frozenset({"small0", "small1"}),
        frozenset({"small2", "small3"}),
        frozenset({"small4"}),
        frozenset(big),
    }
    blank = {k: torch.zeros_like(v) for k, v in state.items()}
    load(store, blank)
    assert_same(blank, state)


@pytest.mark.parametrize("save_objects", [1, 4])
def test_a_rank_past_its_share_of_small_objects_keeps_one_streamed_object(
    monkeypatch: pytest.MonkeyPatch, save_objects: int
) -> None:
    store = MemoryStore()
    """5 MiB of small items fill more than 2 objects of 2 MiB: with a share of 4 they are
    cut, with a share of 1 (or 2, too few) the rank is one object, as a large one is."""
    monkeypatch.setattr(_writer, "OBJECT_BYTES", 2 << 20)
    monkeypatch.setattr(_rankobject, "SAVE_OBJECTS", save_objects)
    state = {f"t{i}": torch.full((256, 1024), float(i)) for i in range(5)}  # 1 MiB each
    cid = save(store, state)
    parts = sync(store).load_manifest(cid).operators["rank-0"].partitions
    sizes = [p.size_bytes - (p.index_size_bytes or 0) for p in parts]
    assert sizes == ([2 << 20, 2 << 20, 1 << 20] if save_objects == 4 else [5 << 20])
    blank = {k: torch.zeros_like(v) for k, v in state.items()}
    load(store, blank)
    assert_same(blank, state)


# -- verification ---------------------------------------------------------------------


def _write_items(mib: list[int]) -> list[Any]:
    """Tensor write items of float32 tensors of these many MiB each."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    items = []
    for n, size in enumerate(mib):
        shape = torch.Size([size, 256 * 1024])  # 1 MiB of float32 a row
        chunk = ChunkStorageMetadata(torch.Size([0, 0]), shape)
        data = TensorWriteData(chunk, TensorProperties(dtype=torch.float32), shape)
        index = MetadataIndex(f"t{n}", torch.Size([0, 0]))
        items.append(WriteItem(index, WriteItemType.SHARD, tensor_data=data))
    return items


@pytest.mark.parametrize(
    ("ranks", "spread", "objects"),
    [
        (1, True, [[0, 1], [2], [3, 5], [4]]),  # small ones by 16 MiB, then the large one
        (16, True, [[0, 1], [2], [3, 5], [4]]),  # a share of 4 holds 48 MiB of small ones
        (32, True, [[0, 1, 2, 3, 4, 5]]),  # a share of 2 does not: one object
        (64, True, [[0, 1, 2, 3, 4, 5]]),  # 64 ranks or more: one object per rank
        (1, False, [[0, 1, 2, 3, 4, 5]]),  # a local directory: one object per rank
    ],
)
def test_a_rank_is_cut_into_objects_by_its_share_of_the_save(
    ranks: int, spread: bool, objects: list[list[int]]
) -> None:
    items = _write_items([8, 8, 16, 12, 20, 4])  # MiB; 20 is larger than OBJECT_BYTES
    cut = _rankobject.split_into_objects(
        items, ranks, _rankobject.OBJECT_BYTES, _rankobject.RANK_OBJECT_BYTES, spread
    )
    assert [[items.index(item) for item in run] for run in cut] == objects


def test_a_local_directory_keeps_one_object_per_rank(tmp_path: Path) -> None:
    """Its files gain nothing from more objects: small tensors within the share, which an
    object store gets in objects of 16 MiB, go into one object here."""
    state = {f"t{i}": torch.full((1024, 1024), float(i)) for i in range(6)}  # 4 MiB each
    cid = save(str(tmp_path), state)
    [part] = sync(str(tmp_path)).load_manifest(cid).operators["rank-0"].partitions
    assert part.size_bytes - (part.index_size_bytes or 0) == 24 << 20
    memory = MemoryStore()
    cid = save(memory, state)
    parts = sync(memory).load_manifest(cid).operators["rank-0"].partitions
    assert [p.size_bytes - (p.index_size_bytes or 0) for p in parts] == [16 << 20, 8 << 20]


def test_a_flipped_byte_in_a_bundled_item_fails_that_item_only(tmp_path: Path) -> None:
    state = {"a": torch.arange(100.0), "b": torch.arange(100.0) * 2, "c": "text"}
    cid = save(str(tmp_path), state)
    reader = CairnReader(str(tmp_path), checkpoint_id=cid, prefix=PREFIX)
    records = {index.fqn: record for index, record in item_records(reader).items()}
    bundle = records["b"].artifact
    assert records["a"].artifact == bundle, "small items share a bundle"
    flip_byte(tmp_path, f"{PREFIX}{cid}/{bundle}", records["b"].offset + 5)
    with pytest.raises(CheckpointException) as info:
        load(str(tmp_path), blank_like(state))
    error = failure_of(info)
    assert isinstance(error, IntegrityMismatchError)
    assert error.path == f"{PREFIX}{cid}/{bundle}" and "'b'" in str(error)
    assert error.expected == records["b"].sha256
    # Per-item digests: the items around it still load, verified.
    partial = {"a": torch.zeros(100), "c": ""}
    load(str(tmp_path), partial)
    assert_same(partial, {"a": state["a"], "c": "text"})
    # cairn's own verification of the whole artifact sees it too.
    with pytest.raises(IntegrityMismatchError):
        sync(str(tmp_path)).load(cid)


def test_a_missing_artifact_is_a_broken_chain_naming_it(tmp_path: Path) -> None:
    cid = save(str(tmp_path), {"big": torch.randn(512, 1024), "small": torch.ones(3)})
    manifest = sync(str(tmp_path)).load_manifest(cid)
    [entry] = [p for p in manifest.operators["rank-0"].partitions if p.size_bytes > 1 << 20]
    (tmp_path / f"{PREFIX}{cid}/{entry.path}").unlink()
    with pytest.raises(CheckpointException) as info:
        load(str(tmp_path), {"big": torch.zeros(512, 1024), "small": torch.zeros(3)})
    error = failure_of(info)
    assert isinstance(error, BrokenChainError) and error.link == f"{PREFIX}{cid}/{entry.path}"


def test_the_metadata_is_verified_before_it_is_unpickled(tmp_path: Path) -> None:
    cid = save(str(tmp_path), {"x": torch.ones(4)})
    [entry] = sync(str(tmp_path)).load_manifest(cid).operators[METADATA_OPERATOR].partitions
    path = f"{PREFIX}{cid}/{entry.path}"
    marker = tmp_path / "pwned"
    # The metadata object is ranges, then their index; the pickle is range 0. A hostile
    # pickle as long as it, the index left as it is: range 0's digest tells it apart.
    stored = (tmp_path / path).read_bytes()
    assert entry.index_size_bytes is not None
    split = len(stored) - entry.index_size_bytes
    head = decode_index(path, stored[split:], split)[0]
    hostile = pickle.dumps(_Exploit(str(marker)))
    assert len(hostile) < head.length
    hostile = hostile.ljust(head.length, b"\0")
    (tmp_path / path).write_bytes(hostile + stored[head.length :])
    reader = CairnReader(str(tmp_path), checkpoint_id=cid, prefix=PREFIX)
    with pytest.raises(IntegrityMismatchError) as info:
        reader.read_metadata()
    assert info.value.path == path and info.value.actual == sha256_hex(hostile)
    assert not marker.exists()
    # Through DCP the same failure arrives as DCP's own AssertionError, which names it
    # from torch 2.12 on (before, DCP's load dropped the reader's error).
    with pytest.raises(CheckpointException) as dcp_info:
        load(str(tmp_path), {"x": torch.zeros(4)}, cid)
    assert isinstance(failure_of(dcp_info), AssertionError)
    if _TORCH_VERSION >= (2, 12):
        assert path in str(failure_of(dcp_info))
    assert not marker.exists()


def test_verified_metadata_may_still_import_only_dcp_types(tmp_path: Path) -> None:
    """A writer with access to the store can forge a consistent manifest; the metadata
    unpickler still imports nothing but DCP's metadata types."""
    cid = save(str(tmp_path), {"x": torch.ones(4)})
    ckpt = sync(str(tmp_path))
    manifest = ckpt.load_manifest(cid)
    [entry] = manifest.operators[METADATA_OPERATOR].partitions
    marker = tmp_path / "pwned"
    hostile = pickle.dumps(_Exploit(str(marker)))
    index = encode_index([(len(hostile), sha256_hex(hostile))])
    # Forged both ways: as a plain metadata object, and as an object of ranges (the
    # hostile pickle as its range 0, with a consistent index).
    forgeries = [
        (
            hostile,
            {"sha256": sha256_hex(hostile), "size_bytes": len(hostile), "index_size_bytes": None},
        ),
        (
            hostile + index,
            {
                "sha256": sha256_hex(index),
                "size_bytes": len(hostile) + len(index),
                "index_size_bytes": len(index),
            },
        ),
    ]
    for body, fields in forgeries:
        forged_entry = msgspec.structs.replace(entry, **fields)
        operators = dict(manifest.operators)
        operators[METADATA_OPERATOR] = msgspec.structs.replace(
            operators[METADATA_OPERATOR], partitions=(forged_entry,)
        )
        forged = msgspec.structs.replace(manifest, operators=operators)
        (tmp_path / f"{PREFIX}{cid}/{entry.path}").write_bytes(body)
        (tmp_path / f"{PREFIX}{cid}/manifest.json").write_bytes(encode_manifest(forged))
        reader = CairnReader(str(tmp_path), checkpoint_id=cid, prefix=PREFIX)
        with pytest.raises(CorruptManifestError, match=r"posix\.system|os\.system"):
            reader.read_metadata()
        assert not marker.exists()


class _Exploit:
    """Unpickles into a call of os.system: what a hostile ``.metadata`` would hold."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


# -- choosing the checkpoint ------------------------------------------------------------


def test_latest_skips_damaged_metadata_and_non_dcp_checkpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path)
    first = make_state(1)
    first_id = save(store, first, epoch=1)
    second_id = save(store, make_state(2), epoch=2)
    plain = sync(store).save(CheckpointData(epoch=3, snapshots={("op", 0): b"not dcp"}))
    [entry] = sync(store).load_manifest(second_id).operators[METADATA_OPERATOR].partitions
    flip_byte(tmp_path, f"{PREFIX}{second_id}/{entry.path}", 3)
    state = make_state(BLANK_SEED)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        reader = load(store, state)
    assert reader.checkpoint_id == first_id
    assert digests(state) == digests(first)
    assert str(second_id) in caplog.text and "trying the next one" in caplog.text
    with pytest.raises(CheckpointNotFoundError, match=METADATA_OPERATOR):
        CairnReader(store, checkpoint_id=plain.checkpoint_id, prefix=PREFIX).read_metadata()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointNotFoundError, match="committed DCP checkpoint"):
        CairnReader(str(empty), prefix=PREFIX).read_metadata()


def test_checkpoint_id_given_to_dcp_chooses_the_id_on_save_and_load(tmp_path: Path) -> None:
    store = str(tmp_path)
    cid = CheckpointId.now()
    state = {"x": torch.arange(10.0)}
    writer = CairnWriter(store, epoch=1, prefix=PREFIX)
    dcp_save(state, storage_writer=writer, checkpoint_id=str(cid), no_dist=True)
    assert writer.checkpoint_id == cid
    dcp_save({"x": torch.zeros(10)}, storage_writer=writer, no_dist=True)  # a later one
    assert writer.checkpoint_id is not None and writer.checkpoint_id > cid, "a new id"
    blank = {"x": torch.zeros(10)}
    reader = CairnReader(store, prefix=PREFIX)
    dcp_load(blank, storage_reader=reader, checkpoint_id=str(cid), no_dist=True)
    assert reader.checkpoint_id == cid and torch.equal(blank["x"], state["x"])
    with pytest.raises(CheckpointException) as info:
        dcp_save(state, storage_writer=writer, checkpoint_id=str(cid), no_dist=True)
    assert isinstance(failure_of(info), CheckpointExistsError)
    with pytest.raises(CheckpointLocationError, match="outside the store"):
        writer.reset("/some/path")  # a location, and not inside this writer's store


def test_ranks_that_opened_different_checkpoints_are_refused(tmp_path: Path) -> None:
    reader = CairnReader(str(tmp_path), prefix=PREFIX)
    plans = [LoadPlan([], storage_data="a"), LoadPlan([], storage_data="b")]
    with pytest.raises(InvalidInputError, match="different checkpoints"):
        reader.prepare_global_plan(plans)
    assert reader.prepare_global_plan(plans[:1] * 2) == plans[:1] * 2


# -- commits, fencing, refusals ---------------------------------------------------------


def test_a_fenced_writer_commits_nothing_and_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    store = RecordingStore(ObstoreStore(LocalStore(tmp_path)), keep_puts=True)
    before = save(store, {"x": torch.ones(3), "y": torch.zeros(2)})
    generation = sync(store).take_over()
    listed = sorted(info.path for info in asyncio.run(store.list("")))
    store.puts.clear()
    store.stream_puts.clear()
    with pytest.raises(CheckpointException) as info:
        save(store, {"x": torch.zeros(3), "y": torch.ones(2)}, epoch=2)
    assert isinstance(failure_of(info), FencedError)
    # The id is generated, so the fence is read beside the rank's upload: the rank did
    # upload, and the refusal removed its object and every intent.
    assert [p for p in store.puts if not is_intent_path(p)] + store.stream_puts, "it uploaded"
    assert sorted(info.path for info in asyncio.run(store.list(""))) == listed
    assert sync(store).list_checkpoints() == [before] and sync(store).read_latest() == before
    after = save(
        store, {"x": torch.zeros(3), "y": torch.ones(2)}, epoch=2, writer_generation=generation
    )
    assert sync(store).list_checkpoints() == [before, after]
    assert sync(store).load_manifest(after).writer_generation == generation


def test_a_fenced_writer_given_an_id_uploads_nothing(tmp_path: Path) -> None:
    store = RecordingStore(ObstoreStore(LocalStore(tmp_path)), keep_puts=True)
    before = save(store, {"x": torch.ones(3)})
    sync(store).take_over()
    store.puts.clear()
    store.stream_puts.clear()
    writer = CairnWriter(store, epoch=2, prefix=PREFIX)
    given = str(CheckpointId.now())
    with pytest.raises(CheckpointException) as info:
        dcp_save({"x": torch.zeros(3)}, storage_writer=writer, checkpoint_id=given, no_dist=True)
    assert isinstance(failure_of(info), FencedError)
    # An id given may be committed, so the save waits for its preconditions: its intent
    # comes first (a takeover must be able to find it), then the fence refuses it before
    # any upload, and the intent is removed.
    uploads = [path for path in store.puts if not is_intent_path(path)]
    assert (uploads, store.stream_puts) == ([], []), "refused before any upload"
    left = asyncio.run(store.list(""))
    assert not [info.path for info in left if is_intent_path(info.path)]
    assert sync(store).list_checkpoints() == [before]


class _TakeOverDuringUpload(CairnWriter):
    """A writer whose store a newer writer takes over once it has uploaded."""

    store_path = ""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        result = super().write_data(plan, planner)
        sync(self.store_path).take_over()
        return result


def test_a_writer_fenced_between_planning_and_commit_commits_nothing(tmp_path: Path) -> None:
    store = str(tmp_path)
    before = save(store, {"x": torch.ones(3)})
    writer = _TakeOverDuringUpload(store, epoch=2, prefix=PREFIX)
    writer.store_path = store
    with pytest.raises(CheckpointException) as info:
        dcp_save({"x": torch.zeros(3)}, storage_writer=writer, no_dist=True)
    # The commit's own fence check refuses it; and the takeover had claimed the id of the
    # save in flight, so its commit could not have landed anyway.
    assert isinstance(failure_of(info), FencedError)
    ckpt = sync(store)
    assert ckpt.list_checkpoints() == [before] and ckpt.read_latest() == before
    manifest = tmp_path / PREFIX / str(writer.checkpoint_id) / "manifest.json"
    assert manifest.read_bytes() == b"", "the claim's tombstone, not a manifest"


def test_what_cannot_make_one_atomic_checkpoint_is_refused(tmp_path: Path) -> None:
    store = str(tmp_path)
    with pytest.raises(InvalidInputError, match="use_collectives=True"):
        dcp_save(  # without collectives DCP calls the writer directly, not via a gather
            {"x": torch.ones(3)},
            storage_writer=CairnWriter(store, epoch=1, prefix=PREFIX),
            no_dist=True,
            use_collectives=False,
        )
    planner = DefaultSavePlanner(enable_plan_caching=True)
    writer = CairnWriter(store, epoch=1, prefix=PREFIX)
    dcp_save({"x": torch.ones(3)}, storage_writer=writer, planner=planner, no_dist=True)
    with pytest.raises(CheckpointException) as info:  # the second save reuses the plan
        dcp_save({"x": torch.ones(3)}, storage_writer=writer, planner=planner, no_dist=True)
    assert "plan caching" in str(failure_of(info))
    with pytest.raises(InvalidInputError, match="epoch"):
        CairnWriter(store, epoch=-1)
    with pytest.raises(InvalidInputError, match="writer_generation"):
        CairnWriter(store, epoch=1, writer_generation=True)


def test_the_writer_pickles_unless_its_store_is_in_memory(tmp_path: Path) -> None:
    writer = CairnWriter(str(tmp_path), epoch=4, prefix=PREFIX, compression="zstd")
    copy = pickle.loads(pickle.dumps(writer))
    state = {"x": torch.arange(5.0)}
    dcp_save(state, storage_writer=copy, no_dist=True)
    manifest = sync(str(tmp_path)).load_manifest(copy.checkpoint_id)
    reader = CairnReader(str(tmp_path), checkpoint_id=copy.checkpoint_id, prefix=PREFIX)
    compressed = [r.stored_length is not None for r in item_records(reader).values()]
    assert manifest.epoch == 4 and compressed == [True]
    for store in (MemoryStore(), "memory://"):
        with pytest.raises(InvalidInputError, match="memory store"):
            pickle.dumps(CairnWriter(store, epoch=1))


def test_cairn_errors_cross_processes_as_themselves() -> None:
    errors = [
        IntegrityMismatchError("p/q", "aa", "bb", what="sha256 of item 'x'"),
        FencedError(1, 2),
        CheckpointNotFoundError("p", "DCP metadata"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert copy.__dict__ == error.__dict__


def test_saving_from_inside_an_event_loop_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(CheckpointException) as info:
            save(str(tmp_path), {"x": torch.ones(2)})
        assert isinstance(failure_of(info), SyncInAsyncContextError)

    asyncio.run(main())


# -- the cairn tools, unchanged -----------------------------------------------------------


def test_cairn_verify_copy_and_gc_work_on_dcp_checkpoints(tmp_path: Path) -> None:
    store, target = tmp_path / "store", tmp_path / "copy"
    store.mkdir()
    old = save(str(store), make_state(1), epoch=1)
    state = make_state(2)
    new = save(str(store), state, epoch=2)
    cli = [sys.executable, "-m", "cairn.cli"]
    common = ["--store", str(store), "--prefix", PREFIX, "--json"]
    verified = subprocess.run(
        [*cli, "verify", "--all", *common], capture_output=True, text=True, check=False
    )
    assert verified.returncode == 0, verified.stderr
    assert str(old) in verified.stdout and str(new) in verified.stdout
    copied = subprocess.run(
        [*cli, "copy", str(new), "--to", str(target), *common],
        capture_output=True,
        text=True,
        check=False,
    )
    assert copied.returncode == 0, copied.stderr
    blank = make_state(BLANK_SEED)
    assert load(str(target), blank).checkpoint_id == new
    assert digests(blank) == digests(state)
    result = sync(str(store)).gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.deleted == [old]
    assert sync(str(store)).list_checkpoints() == [new]
    json.loads(verified.stdout)  # the CLI's JSON stays parseable with DCP checkpoints


def test_load_latest_falls_back_past_a_damaged_shard(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The newest checkpoint's shard is damaged: its load fails as DCP reads it, and
    load_latest loads the one before, whole; with none left, it says so."""
    store = str(tmp_path)
    first = make_state(1)
    first_id = save(store, first, epoch=1)
    second_id = save(store, make_state(2), epoch=2)
    [entry, *_] = sync(store).load_manifest(second_id).operators["rank-0"].partitions
    flip_byte(tmp_path, f"{PREFIX}{second_id}/{entry.path}", 100)
    state = make_state(BLANK_SEED)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        loaded = load_latest(state, store, prefix=PREFIX)
    assert loaded == first_id
    assert digests(state) == digests(first)
    assert str(second_id) in caplog.text and "trying the next one" in caplog.text
    # Damage is the only failure it passes over: no checkpoint left is not found.
    [entry, *_] = sync(store).load_manifest(first_id).operators["rank-0"].partitions
    flip_byte(tmp_path, f"{PREFIX}{first_id}/{entry.path}", 100)
    with pytest.raises(CheckpointNotFoundError, match="committed DCP checkpoint"):
        load_latest(make_state(BLANK_SEED), store, prefix=PREFIX)


def test_load_latest_raises_what_is_not_damage(tmp_path: Path) -> None:
    """A state that asks for a key the checkpoint lacks is DCP's error, not a fallback."""
    store = str(tmp_path)
    save(store, {"a": torch.ones(3)}, epoch=1)
    save(store, {"a": torch.ones(3) * 2}, epoch=2)
    with pytest.raises(CheckpointException) as info:
        load_latest({"a": torch.zeros(3), "missing": torch.zeros(2)}, store, prefix=PREFIX)
    assert not isinstance(failure_of(info), (IntegrityError, CheckpointNotFoundError))


def test_a_load_reads_a_rank_object_in_bounded_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    store = RankRangeStore(ObstoreStore(MemoryStore()))
    state = {f"t{i}": torch.full((1000, 256), float(i)) for i in range(8)}  # 1000 KiB each
    save(store, state)
    monkeypatch.setattr(_reader, "READ_SPAN_BYTES", 3 << 20)
    blank = {k: torch.zeros(1000, 256) for k in state}
    load(store, blank)
    assert_same(blank, state)
    item = 1000 * 1024
    assert sorted(store.ranges) == [(0, 3 * item), (3 * item, 6 * item), (6 * item, 8 * item)]
