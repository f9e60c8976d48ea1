"""DCP metadata stored as a chunk table with one block of item records per rank.

Several ranks are played in one process (``support.dcp``), each saving a real slice of
every global tensor, so every load here is checked bit for bit.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

pytest.importorskip("torch")

import msgspec
import numpy as np
import obstore
import torch
import zstandard
from obstore.store import MemoryStore
from support.dcp import (
    DefaultShardLoadPlanner,
    Shard,
    item_records,
    load_rank,
    plan_and_write,
    plan_rank,
    save_ranks,
    sharded,
)
from support.recording import RecordingStore
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

from cairn import CorruptManifestError, IncompleteCheckpointError, IntegrityMismatchError
from cairn.format.codecs import get_codec
from cairn.format.ids import CheckpointId
from cairn.format.ranges import StoredRange, decode_index
from cairn.stores import as_store
from cairn.sync import SyncCheckpointer
from cairn.torch import METADATA_OPERATOR, CairnReader, CairnWriter, _opendcp
from cairn.torch import _itemtable as itemtable
from cairn.torch import _tableread as tableread
from cairn.torch._finish import distinct_entries

RANKS = 4


def whole_state() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(10, 6, generator=generator),  # 3 rows a rank, the last rank 1
        "b": torch.randn(7, generator=generator),
        # Ranks 2 and 3 hold no row of it: one empty chunk at [2, 0], which DCP keeps once.
        "e": torch.randn(2, 3, generator=generator),
        "step": 12,  # a byte item: DCP keeps one rank's
    }


@dataclasses.dataclass
class Saved:
    raw: MemoryStore
    store: RecordingStore
    cid: CheckpointId
    whole: dict[str, Any]

    def reader(self) -> CairnReader:
        return CairnReader(self.store, checkpoint_id=str(self.cid))

    def metadata_object(self) -> tuple[str, bytes, list[StoredRange]]:
        """The metadata object's path, bytes, and ranges (range 0, then the blocks)."""
        ckpt = SyncCheckpointer(self.store)
        [entry] = ckpt.load_manifest(self.cid).operators[METADATA_OPERATOR].partitions
        assert entry.index_size_bytes is not None
        path = f"{self.cid}/{entry.path}"
        data = bytes(obstore.get(self.raw, path).bytes())
        split = len(data) - entry.index_size_bytes
        return path, data, decode_index(path, data[split:], split)


@pytest.fixture
def saved() -> Saved:
    raw = MemoryStore()
    store = RecordingStore(as_store(raw))
    whole = whole_state()
    cid = save_ranks(store, [sharded(whole, RANKS, r) for r in range(RANKS)])
    return Saved(raw, store, cid, whole)


def assert_loaded(state: dict[str, Any], whole: dict[str, Any], ranks: int, rank: int) -> None:
    expected = sharded(whole, ranks, rank)
    for fqn, value in state.items():
        if isinstance(value, Shard):
            assert torch.equal(value.local, expected[fqn].local), fqn


def test_the_metadata_is_a_table_and_one_block_per_rank(saved: Saved) -> None:
    _, _, ranges = saved.metadata_object()
    assert len(ranges) == 1 + RANKS
    manifest = SyncCheckpointer(saved.store).load_manifest(saved.cid)
    assert sorted(manifest.operators) == sorted(
        [METADATA_OPERATOR, *(f"rank-{r}" for r in range(RANKS))]
    )
    metadata = saved.reader().read_metadata()
    chunks = metadata.state_dict_metadata["w"]
    assert isinstance(chunks, TensorStorageMetadata)
    assert isinstance(chunks.chunks, tableread.ChunkList) and len(chunks.chunks) == RANKS
    assert [list(c.offsets) for c in chunks.chunks] == [[0, 0], [3, 0], [6, 0], [9, 0]]
    assert [list(c.sizes) for c in chunks.chunks] == [[3, 6], [3, 6], [3, 6], [1, 6]]
    # Every item has a record: 4 chunks of w and of b, 3 of e, the byte item.
    records = item_records(saved.reader())
    assert len(records) == 4 + 4 + 3 + 1


@pytest.mark.parametrize("rank", range(RANKS))
def test_a_rank_reads_the_table_and_its_own_block_only(
    saved: Saved, rank: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_opendcp, "WHOLE_METADATA_BYTES", 0)  # as a large one is read
    path, _, _ = saved.metadata_object()
    byte_block = tableread.decode_table("m", table_metadata(saved), RANKS).byte_blocks["step"]
    saved.store.log.clear()
    state = sharded(saved.whole, RANKS, rank, blank=True)
    load_rank(saved.reader(), state)
    assert_loaded(state, saved.whole, RANKS, rank)
    reads = [p for op, p in saved.store.log if op == "get_range" and p == path]
    # The index, range 0 and this rank's block; and the block of the one byte item,
    # which DCP left to one rank.
    assert len(reads) == 3 + (byte_block != rank)


def test_a_small_metadata_object_is_read_in_one_request(saved: Saved) -> None:
    path, _, _ = saved.metadata_object()
    saved.store.log.clear()
    state = sharded(saved.whole, RANKS, 1, blank=True)
    load_rank(saved.reader(), state)
    assert_loaded(state, saved.whole, RANKS, 1)
    assert [op for op, p in saved.store.log if p == path] == ["get_range"]


@pytest.mark.parametrize("ranks", [1, 3, 7])
def test_a_load_over_another_rank_count_is_bit_exact(saved: Saved, ranks: int) -> None:
    for rank in range(ranks):
        state = sharded(saved.whole, ranks, rank, blank=True)
        load_rank(saved.reader(), state)
        assert_loaded(state, saved.whole, ranks, rank)


@pytest.mark.parametrize("ranks", [1, 3, 4, 7])
def test_cairns_plan_is_dcps_default_plan(saved: Saved, ranks: int) -> None:
    """Narrowed to the chunks a rank overlaps, the plan is the one DCP's own planner
    makes over every chunk, storage indices (positions) included."""
    for rank in range(ranks):
        state = sharded(saved.whole, ranks, rank, blank=True)
        _, ours, _ = plan_rank(saved.reader(), state)
        _, dcps, _ = plan_rank(saved.reader(), state, DefaultShardLoadPlanner())
        assert ours.items == dcps.items
        assert [i.storage_index.index for i in ours.items] == [
            i.storage_index.index for i in dcps.items
        ]


def test_a_flipped_byte_in_a_block_is_caught_naming_it(saved: Saved) -> None:
    path, data, ranges = saved.metadata_object()
    block = ranges[1 + 2]
    damaged = bytearray(data)
    damaged[block.offset + block.length // 2] ^= 0x01
    obstore.put(saved.raw, path, bytes(damaged))
    state = sharded(saved.whole, RANKS, 2, blank=True)
    with pytest.raises(IntegrityMismatchError, match="block 2 of item records") as info:
        load_rank(saved.reader(), state)
    assert info.value.path == path
    # Rank 1's block is whole: rank 1 still loads.
    state = sharded(saved.whole, RANKS, 1, blank=True)
    load_rank(saved.reader(), state)
    assert_loaded(state, saved.whole, RANKS, 1)


def test_the_chunk_list_pickles_as_dcps_own_list(saved: Saved) -> None:
    metadata = saved.reader().read_metadata()
    plain = itemtable.with_plain_chunks(metadata)
    md = plain.state_dict_metadata["w"]
    assert isinstance(md, TensorStorageMetadata) and type(md.chunks) is list
    original = metadata.state_dict_metadata["w"]
    assert isinstance(original, TensorStorageMetadata)
    assert pickle.loads(pickle.dumps(original.chunks)) == md.chunks


# -- what the table and a block must be ------------------------------------------------


def table_metadata(saved: Saved) -> Any:
    """Range 0 of the saved metadata object, unpickled (its table not yet decoded)."""
    _, data, ranges = saved.metadata_object()
    head = ranges[0]
    return pickle.loads(data[head.offset : head.offset + head.length])


def test_the_saved_table_decodes_and_places_every_item(saved: Saved) -> None:
    table = tableread.decode_table("m", table_metadata(saved), RANKS)
    assert sum(table.count_in(b) for b in range(RANKS)) == 4 + 4 + 3 + 1
    assert table.block_of(MetadataIndex("w", torch.Size([6, 0]))) == 2
    assert table.block_of(MetadataIndex("w", torch.Size([5, 0]))) is None


def zstd(data: bytes) -> bytes:
    return get_codec("zstd").compress(data)


def unzstd(data: bytes) -> bytes:
    return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(data))


def rows_as(d: dict[str, Any], change: Any) -> None:
    """The table ``d`` with its rows, decoded, changed by ``change``, then compressed."""
    d["rows"] = zstd(change(unzstd(d["rows"])))


@pytest.mark.parametrize(
    "forge",
    [
        lambda d: d.update(blocks=RANKS + 1),
        lambda d: rows_as(d, lambda rows: rows[:-4]),
        lambda d: rows_as(d, lambda rows: rows + rows[-4 * (1 + 2 * d["dims"]) :]),
        lambda d: d.update(tensors={**d["tensors"], "w": (0, 3)}),
        lambda d: d.update(tensors={k: v for k, v in d["tensors"].items() if k != "b"}),
        lambda d: d.update(bytes={}),
        lambda d: d.update(bytes={"step": RANKS}),
        lambda d: d.update(dtype="float32"),
        lambda d: d.pop("dims"),
        lambda d: rows_as(d, lambda rows: rows * 10_000),
        lambda d: d.update(rows=d["rows"][:-3]),
        lambda d: d.update(block_sizes=d["block_sizes"][:-1]),
        lambda d: d.update(block_sizes=[-1] * RANKS),
    ],
    ids=[
        "more-blocks",
        "a-short-row",
        "an-extra-row",
        "rows-shared",
        "a-tensor-missing",
        "a-byte-item-missing",
        "a-block-out-of-range",
        "a-float-table",
        "a-field-missing",
        "rows-that-inflate-past-their-count",
        "rows-cut-short",
        "a-block-size-missing",
        "a-negative-block-size",
    ],
)
def test_a_forged_table_is_refused(saved: Saved, forge: Any) -> None:
    metadata = table_metadata(saved)
    forge(metadata.storage_data)
    with pytest.raises(CorruptManifestError, match="chunk table"):
        tableread.decode_table("m", metadata, RANKS)


@pytest.mark.parametrize(
    "version",
    [
        # The first version of the table (rows and blocks uncompressed, no block sizes),
        # which no release wrote: refused as any version this reader does not know.
        {"format": "cairn-dcp-chunk-table-v1", "block_sizes": None},
        {"format": "cairn-dcp-chunk-table-v3"},
        {"format": 2},
    ],
    ids=["v1", "v3", "not-a-name"],
)
def test_a_table_of_a_version_this_reader_does_not_know_is_refused(
    saved: Saved, version: dict[str, Any]
) -> None:
    metadata = table_metadata(saved)
    stored = metadata.storage_data
    for key, value in version.items():
        if value is None:
            del stored[key]
        else:
            stored[key] = value
    with pytest.raises(CorruptManifestError, match="not one this version of cairn reads") as info:
        tableread.decode_table("m", metadata, RANKS)
    assert info.value.path == "m"
    assert f"format {version['format']!r}" in str(info.value)
    assert "'cairn-dcp-chunk-table-v2'" in str(info.value)


def test_a_block_with_another_ranks_record_is_refused(saved: Saved) -> None:
    _, data, ranges = saved.metadata_object()
    table = tableread.decode_table("m", table_metadata(saved), RANKS)
    one, two = (data[r.offset : r.offset + r.length] for r in ranges[2:4])
    assert tableread.decode_block("m", table, 1, one)
    assert table.block_sizes is not None
    sizes = [*table.block_sizes]
    sizes[1] = len(unzstd(two))  # block 2's bytes, decoding to the size the table says
    forged = dataclasses.replace(table, block_sizes=sizes)
    with pytest.raises(CorruptManifestError, match="places elsewhere"):
        tableread.decode_block("m", forged, 1, two)
    with pytest.raises(CorruptManifestError, match="does not decode to"):
        tableread.decode_block("m", table, 1, two)


def test_a_block_that_inflates_past_its_size_is_refused_unread(saved: Saved) -> None:
    table = tableread.decode_table("m", table_metadata(saved), RANKS)
    bomb = zstd(b"\0" * (64 << 20))  # 64 MiB of zeros in a few KB
    with pytest.raises(CorruptManifestError, match="does not decode to"):
        tableread.decode_block("m", table, 1, bomb)


def test_a_commit_without_one_ranks_results_commits_nothing() -> None:
    store = as_store(MemoryStore())
    whole = whole_state()
    writers, metadata, results = plan_and_write(
        store, [sharded(whole, RANKS, r) for r in range(RANKS)]
    )
    with pytest.raises(
        IncompleteCheckpointError, match="DCP's metadata has 4 chunks, the ranks wrote 3"
    ):
        writers[0].finish(metadata, results[:-1])
    assert SyncCheckpointer(store).list_checkpoints() == []


def test_a_block_naming_a_string_it_lacks_is_refused(saved: Saved) -> None:
    _, data, ranges = saved.metadata_object()
    table = tableread.decode_table("m", table_metadata(saved), RANKS)
    one = unzstd(data[ranges[2].offset : ranges[2].offset + ranges[2].length])
    block = msgspec.msgpack.decode(one)
    block[0] = block[0][:1]  # the names list cut to its first string
    forged = msgspec.msgpack.encode(block)
    assert table.block_sizes is not None
    sizes = [*table.block_sizes]
    sizes[1] = len(forged)
    with pytest.raises(CorruptManifestError, match="names string"):
        tableread.decode_block("m", dataclasses.replace(table, block_sizes=sizes), 1, zstd(forged))


def test_the_table_is_the_same_whatever_order_the_ranks_wrote_their_items_in() -> None:
    """One chunk of every tensor per rank, in the metadata's order, is packed without a
    sort; ranks that listed their tensors in another order get the same table."""
    whole = {k: v for k, v in whole_state().items() if k in ("w", "b")}
    states = [sharded(whole, RANKS, r) for r in range(RANKS)]
    writers, metadata, results = plan_and_write(as_store(MemoryStore()), states)
    per_rank = [r[0].storage_data for r in results]
    assert all(isinstance(r, itemtable.RankItems) for r in per_rank)
    in_order = itemtable.build_table(metadata, per_rank)

    def reordered(rank: itemtable.RankItems) -> itemtable.RankItems:
        width = 1 + 2 * rank.dims
        rows = np.frombuffer(rank.rows, dtype=np.int64).reshape(-1, width)[::-1].copy()
        rows[:, 0] = len(rank.fqns) - 1 - rows[:, 0]  # the fqns listed the other way round
        return dataclasses.replace(rank, fqns=rank.fqns[::-1], rows=rows.tobytes())

    shuffled = itemtable.build_table(metadata, [reordered(r) for r in per_rank])
    assert shuffled.metadata.storage_data == in_order.metadata.storage_data
    assert in_order.metadata.storage_data["tensors"] == {"w": (0, 4), "b": (4, 4)}
    writers[0].reset()  # ends the lease of the save, which was never to commit


def _synthetic_save(
    shapes: dict[str, tuple[int, ...]], ranks: int, reverse: bool, absent: tuple[str, int] | None
) -> tuple[Any, list[itemtable.RankItems]]:
    """DCP metadata and each rank's RankItems for ``shapes`` sharded along dim 0 over
    ``ranks`` (no bytes: the table only places chunks); with ``reverse`` every rank
    lists its tensors backwards, and with ``absent`` (fqn, rank) that rank holds none
    of that tensor: either takes the sorting path."""
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    from cairn.format.manifest import PartitionSnapshotEntry

    chunks: dict[str, list[ChunkStorageMetadata]] = {fqn: [] for fqn in shapes}
    per_rank = []
    for rank in range(ranks):
        items, written = [], []
        entry = PartitionSnapshotEntry(
            partition_id=0, is_delta=False, path=f"r{rank}", size_bytes=1, sha256="0" * 64
        )
        for fqn in reversed(shapes) if reverse else shapes:
            if (fqn, rank) == absent:
                continue
            shape = shapes[fqn]
            rows = -(-shape[0] // ranks)
            start = min(rank * rows, shape[0])
            size = torch.Size([min(rows, shape[0] - start), *shape[1:]])
            offsets = torch.Size([start, *(0 for _ in shape[1:])])
            chunk = ChunkStorageMetadata(offsets, size)
            chunks[fqn].append(chunk)
            data = TensorWriteData(chunk, TensorProperties(dtype=torch.float32), torch.Size(shape))
            index = MetadataIndex(fqn, offsets)
            items.append(WriteItem(index, WriteItemType.SHARD, tensor_data=data))
            record = (f"r{rank}", 0, 0, "0" * 64, "float32", tuple(size))
            written.append((index, record, f"rank-{rank}", entry))
        per_rank.append(itemtable.rank_items(f"rank-{rank}", items, written))
    state: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {
        fqn: TensorStorageMetadata(
            TensorProperties(dtype=torch.float32), torch.Size(shapes[fqn]), chunks[fqn]
        )
        for fqn in shapes
    }
    return Metadata(state), per_rank


@pytest.mark.parametrize(
    ("reverse", "absent"),
    [(False, None), (True, None), (False, ("cube", 1)), (False, ("mat", 1))],
    ids=["in-order", "reversed", "rank-1-is-1-D-and-2-D", "rank-1-lacks-mat"],
)
@pytest.mark.parametrize("rows", [12, 3 << 31], ids=["int32", "int64"])
def test_the_table_places_every_chunk_whatever_its_size_and_dimensions(
    rows: int, reverse: bool, absent: tuple[str, int] | None
) -> None:
    """Offsets past 2**31 make an int64 table; a rank's rows narrower than the widest
    tensor's are padded. Either packing gives back DCP's chunks exactly."""
    shapes = {"flat": (rows,), "cube": (rows, 2, 3), "mat": (5, 4)}
    metadata, per_rank = _synthetic_save(shapes, 3, reverse, absent)
    if absent == ("cube", 1):
        assert per_rank[1].dims == 2  # narrower than the table's 3
    stored = itemtable.build_table(metadata, per_rank)
    assert stored.metadata.storage_data["dtype"] == ("int32" if rows < 2**31 else "int64")
    table = tableread.decode_table("m", stored.metadata, len(per_rank))
    for fqn, md in metadata.state_dict_metadata.items():
        decoded = table.chunk_lists[fqn]
        assert [(list(c.offsets), list(c.sizes)) for c in decoded] == [
            (list(c.offsets), list(c.sizes)) for c in md.chunks
        ]
        holders = [r for r in range(3) if (fqn, r) != absent]
        assert [decoded.block(n) for n in range(len(decoded))] == holders


def test_ranks_carrying_one_object_report_the_sum_of_the_bytes_they_use() -> None:
    """Two ranks that carry tensors of one parent object each count their own bytes of
    it; the manifest gets one entry with the sum. Any other difference is refused."""
    from cairn.format.manifest import PartitionSnapshotEntry

    owner = CheckpointId.now()
    base = PartitionSnapshotEntry(
        partition_id=0,
        is_delta=False,
        path="operators/rank-0/partition-0.snap",
        size_bytes=1000,
        sha256="0" * 64,
        owner=owner,
        index_size_bytes=56,
    )
    one, two = (msgspec.structs.replace(base, used_bytes=n) for n in (300, 200))
    [(operator, merged)] = distinct_entries([("rank-0", one), ("rank-0", two)])
    assert operator == "rank-0" and merged == msgspec.structs.replace(base, used_bytes=500)
    other = msgspec.structs.replace(two, sha256="1" * 64)
    with pytest.raises(IncompleteCheckpointError, match="two different entries"):
        distinct_entries([("rank-0", one), ("rank-0", other)])


def test_each_rank_of_an_incremental_save_reads_its_own_block_of_the_parent(
    saved: Saved, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator opens the parent (index and range 0); each rank reads the block
    of the records it may carry, no other; everything unchanged is carried."""
    monkeypatch.setattr(_opendcp, "WHOLE_METADATA_BYTES", 0)  # as a large one is read
    path, _, _ = saved.metadata_object()
    reads: dict[str, list[int]] = {"prepare_global_plan": [], "write_data": []}

    def counted(name: str) -> None:
        method = getattr(CairnWriter, name)

        def wrapper(self: CairnWriter, *args: Any) -> Any:
            before = len(saved.store.log)
            out = method(self, *args)
            log = saved.store.log[before:]
            reads[name].append(sum(1 for op, p in log if op == "get_range" and p == path))
            return out

        monkeypatch.setattr(CairnWriter, name, wrapper)

    counted("prepare_global_plan")
    counted("write_data")
    states = [sharded(saved.whole, RANKS, r) for r in range(RANKS)]
    writers, metadata, results = plan_and_write(saved.store, states, incremental=True)
    writers[0].finish(metadata, results)
    assert reads == {"prepare_global_plan": [2], "write_data": [3] * RANKS}
    child = writers[0].checkpoint_id
    assert child is not None
    manifest = SyncCheckpointer(saved.store).load_manifest(child)
    assert manifest.parent_id == saved.cid
    ranks = [e for op, e in manifest.partition_entries() if op != METADATA_OPERATOR]
    assert len(ranks) == RANKS and all(e.owner == saved.cid for e in ranks)
    for rank in range(RANKS):
        state = sharded(saved.whole, RANKS, rank, blank=True)
        load_rank(CairnReader(saved.store, checkpoint_id=child), state)
        assert_loaded(state, saved.whole, RANKS, rank)
