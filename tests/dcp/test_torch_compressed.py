"""Compressed DCP saves: one object per rank, each item a zstd frame of its own.

A save through a checkpointer with ``compression="zstd"`` lays a rank's items out as an
uncompressed save does (one object of ranges) and compresses each item alone, so a load
still reads one item with one ranged GET, decodes it in memory bounded by its recorded
length and checks it against the digest of its bytes before compression.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("zstandard")

import torch
import zstandard
from obstore.store import MemoryStore
from support import dcp as support_dcp
from support.cli import cairn
from support.dcp import PREFIX, RankRangeStore, assert_same, item_records, load
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import CheckpointPaths, ObjectStoreCheckpointer, SyncCheckpointer
from cairn.errors import IntegrityMismatchError, OversizedArtifactError, UndecodableArtifactError
from cairn.format.ids import CheckpointId
from cairn.format.ranges import COMPRESSED_INDEX_MAGIC, decode_index
from cairn.stores import ObstoreStore
from cairn.torch import CairnReader, export_dcp, import_dcp
from cairn.torch._format import ItemRecord
from cairn.torch._reader import _decoded_item

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)


def state() -> dict[str, Any]:
    """Compressible tensors of several sizes and dtypes, a view, and a byte item."""
    return {
        "zeros": torch.zeros(256, 1024),  # 1 MiB of zeros
        "ramp": torch.arange(50_000, dtype=torch.int64),
        "half": torch.full((300,), 1.5, dtype=torch.bfloat16),
        "strided": torch.arange(4096.0).reshape(64, 64)[:, ::2],
        "empty": torch.zeros(0),
        "note": {"step": 7, "text": "hello" * 100},
    }


def blank() -> dict[str, Any]:
    return {
        "zeros": torch.ones(256, 1024),
        "ramp": torch.zeros(50_000, dtype=torch.int64),
        "half": torch.zeros(300, dtype=torch.bfloat16),
        "strided": torch.zeros(64, 32),
        "empty": torch.zeros(0),
        "note": {"step": 0, "text": ""},
    }


def save(store: Any, saved: Any, **options: Any) -> CheckpointId:
    """A save through a checkpointer that compresses."""
    return support_dcp.save(store, saved, compression="zstd", **options)


def sync(store: Any) -> SyncCheckpointer:
    return SyncCheckpointer(store, CheckpointPaths(PREFIX))


def compressing(store: str) -> ObjectStoreCheckpointer:
    return ObjectStoreCheckpointer(store, CheckpointPaths(PREFIX), compression="zstd")


def records(store: Any, cid: CheckpointId) -> dict[str, ItemRecord]:
    """Each item's record, by fqn."""
    reader = CairnReader(store, checkpoint_id=cid, prefix=PREFIX)
    return {index.fqn: record for index, record in item_records(reader).items()}


def test_a_compressed_save_is_one_object_of_frames_and_round_trips_bit_exactly(
    tmp_path: Path,
) -> None:
    saved = state()
    cid = save(str(tmp_path), saved)
    manifest = sync(str(tmp_path)).load_manifest(cid)
    [entry] = manifest.operators["rank-0"].partitions
    assert entry.codec is None and entry.index_size_bytes is not None
    raw_bytes = sum(
        t.numel() * t.element_size() for t in saved.values() if isinstance(t, torch.Tensor)
    )
    assert entry.size_bytes < raw_bytes // 10, "the zeros and the ramp compress"
    data = (tmp_path / f"{PREFIX}{cid}/{entry.path}").read_bytes()
    index = data[-entry.index_size_bytes :]
    assert index.startswith(COMPRESSED_INDEX_MAGIC)
    ranges = decode_index("x", index, len(data) - len(index))
    by_fqn = records(str(tmp_path), cid)
    assert len(ranges) == len(by_fqn) == 7  # the dict is flattened into two byte items
    for record in by_fqn.values():
        assert record.stored_length is not None
        frame = data[record.offset : record.offset + record.stored_length]
        assert (
            len(zstandard.ZstdDecompressor().decompress(frame, max_output_size=1 << 24))
            == record.length
        )
    loaded = blank()
    load(str(tmp_path), loaded)
    assert_same(loaded, saved)


def test_one_item_is_one_ranged_read_of_its_frame() -> None:
    store = RankRangeStore(ObstoreStore(MemoryStore()))
    saved = {f"t{i}": torch.full((1000, 256), float(i)) for i in range(8)}  # 1000 KiB each
    cid = save(store, saved)
    by_fqn = records(store, cid)
    store.ranges.clear()
    one = {"t5": torch.zeros(1000, 256)}
    load(store, one, cid)
    assert torch.equal(one["t5"], saved["t5"])
    record = by_fqn["t5"]
    assert record.stored_length is not None and record.stored_length < 10_000
    assert store.ranges == [(record.offset, record.offset + record.stored_length)]


def test_a_flipped_byte_in_a_frame_fails_that_item_naming_it(tmp_path: Path) -> None:
    saved = {"a": torch.arange(1000.0), "b": torch.arange(1000.0) * 2, "c": torch.ones(1000)}
    cid = save(str(tmp_path), saved)
    by_fqn = records(str(tmp_path), cid)
    record = by_fqn["b"]
    assert record.stored_length is not None
    store = ["--store", tmp_path.as_uri(), "--prefix", PREFIX]
    assert cairn("verify", str(cid), *store).code == 0
    copied = tmp_path.parent / f"{tmp_path.name}-copy"
    assert cairn("copy", str(cid), "--to", copied.as_uri(), *store).code == 0
    from_copy = {k: torch.zeros(1000) for k in saved}
    load(str(copied), from_copy, cid)
    assert all(torch.equal(from_copy[k], saved[k]) for k in saved)
    path = tmp_path / f"{PREFIX}{cid}/{record.artifact}"
    data = bytearray(path.read_bytes())
    data[record.offset + record.stored_length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointException) as info:
        load(str(tmp_path), {k: torch.zeros(1000) for k in saved})
    [(error, _)] = info.value.failures.values()
    assert isinstance(error, (IntegrityMismatchError, UndecodableArtifactError))
    assert error.path == f"{PREFIX}{cid}/{record.artifact}" and "'b'" in str(error)
    partial = {"a": torch.zeros(1000), "c": torch.zeros(1000)}
    load(str(tmp_path), partial)  # the items around it still load, verified
    assert torch.equal(partial["a"], saved["a"]) and torch.equal(partial["c"], saved["c"])
    verified = cairn("verify", str(cid), *store)
    assert verified.code != 0, "cairn's own verification decodes and checks every frame"


async def test_a_frame_decodes_to_exactly_its_recorded_length_or_fails() -> None:
    payload = b"x" * 10_000
    frame = memoryview(zstandard.ZstdCompressor().compress(payload))
    digest = hashlib.sha256(payload).hexdigest()
    exact = ItemRecord("a", 0, len(payload), digest, "", (), frame.nbytes)
    assert bytes(await _decoded_item("p", exact, frame, "sha256 of item 'x'")) == payload
    bomb = ItemRecord("a", 0, 100, digest, "", (), frame.nbytes)  # inflates past 100
    with pytest.raises(OversizedArtifactError):
        await _decoded_item("p", bomb, frame, "sha256 of item 'x'")
    short = ItemRecord("a", 0, 20_000, digest, "", (), frame.nbytes)
    with pytest.raises(IntegrityMismatchError) as info:
        await _decoded_item("p", short, frame, "sha256 of item 'x'")
    assert info.value.expected == "20000" and info.value.actual == "10000"
    with pytest.raises(UndecodableArtifactError) as undecodable:
        await _decoded_item("p", exact, memoryview(b"not a frame"), "sha256 of item 'x'")
    assert "'x'" in str(undecodable.value)


def test_resharding_incremental_export_and_import_work_compressed(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    saved = {"w": torch.arange(4096.0).reshape(64, 64), "frozen": torch.ones(2000)}
    first = save(store, saved)
    # An incremental save carries the unchanged tensor's frame by reference.
    saved["w"] = saved["w"] + 1
    second = save(store, saved, incremental=True)
    manifest = sync(store).load_manifest(second)
    carried = [e for _, e in manifest.partition_entries() if e.owner == first]
    assert len(carried) == 1 and carried[0].used_bytes is not None
    assert carried[0].used_bytes == records(store, first)["frozen"].stored_length
    loaded = {"w": torch.zeros(64, 64), "frozen": torch.zeros(2000)}
    load(store, loaded, second)
    assert torch.equal(loaded["w"], saved["w"]) and torch.equal(loaded["frozen"], saved["frozen"])
    # Out to DCP's own format, every frame decoded and verified, and back in compressed.
    exported = tmp_path / "exported"
    export_dcp(store, second, exported, prefix=PREFIX)
    from_dir = {"w": torch.zeros(64, 64), "frozen": torch.zeros(2000)}
    dcp_load(from_dir, storage_reader=FileSystemReader(exported), no_dist=True)
    assert torch.equal(from_dir["w"], saved["w"])
    imported = import_dcp(compressing(store), exported)
    imported_records = records(store, imported.checkpoint_id)
    assert all(r.stored_length is not None for r in imported_records.values())
    again = {"w": torch.zeros(64, 64), "frozen": torch.zeros(2000)}
    load(store, again, imported.checkpoint_id)
    assert torch.equal(again["w"], saved["w"]) and torch.equal(again["frozen"], saved["frozen"])


def test_a_dcp_directory_imports_into_one_compressed_object_per_file(tmp_path: Path) -> None:
    source = tmp_path / "dcp"
    saved = {"a": torch.zeros(10_000), "b": torch.arange(100)}
    dcp_save(saved, storage_writer=FileSystemWriter(source), no_dist=True)
    store = str(tmp_path / "store")
    imported = import_dcp(compressing(store), source)
    manifest = sync(store).load_manifest(imported.checkpoint_id)
    [entry] = manifest.operators["rank-0"].partitions
    assert entry.size_bytes < 10_000, "compressed, in one object"
    loaded = {"a": torch.ones(10_000), "b": torch.zeros(100, dtype=torch.int64)}
    load(store, loaded, imported.checkpoint_id)
    assert torch.equal(loaded["a"], saved["a"]) and torch.equal(loaded["b"], saved["b"])


def test_a_byte_item_in_a_compressed_save_round_trips(tmp_path: Path) -> None:
    saved = {"blob": {"nested": [1, 2, 3], "name": "x" * 5000}}
    save(str(tmp_path), saved)
    loaded: dict[str, Any] = {"blob": {"nested": [], "name": ""}}
    load(str(tmp_path), loaded)
    assert loaded == saved
