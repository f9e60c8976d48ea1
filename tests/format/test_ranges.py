"""Objects of ranges (:mod:`cairn.format.ranges`): one object, many ranges, each verifiable
alone; verified whole through the index the object ends with."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from obstore.store import MemoryStore
from support.backends import make_checkpointer

from cairn import CheckpointData, CheckpointId, InvalidInputError, ObjectStoreCheckpointer
from cairn.errors import (
    IntegrityMismatchError,
    OversizedArtifactError,
    TransientStoreError,
    UndecodableArtifactError,
)
from cairn.format.manifest import PartitionSnapshotEntry, check_entry
from cairn.format.ranges import (
    COMPRESSED_INDEX_MAGIC,
    Range,
    RangeSource,
    decode_index,
    decode_range,
    encode_compressed_index,
    encode_index,
    group_spans,
    index_size,
    is_index_size,
    verify_ranges,
)
from cairn.protocol import _upload
from cairn.stores import ForwardingStore, ObstoreStore, Store, as_store


class Pieces(RangeSource):
    """Ranges of given bytes; counts how often it was opened."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces
        self.opened = 0

    def open(self) -> AsyncIterator[Range]:
        self.opened += 1
        return self._ranges()

    async def _ranges(self) -> AsyncIterator[Range]:
        for piece in self.pieces:
            yield Range(piece, hashlib.sha256(piece).hexdigest())


PIECES = (b"first range", b"", b"x" * 70_000, b"last")


async def test_an_object_of_ranges_saves_loads_and_indexes_every_range(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): Pieces(*PIECES)}))
    [(_, entry)] = manifest.partition_entries()
    data = b"".join(PIECES)
    assert entry.index_size_bytes == index_size(len(PIECES))
    assert entry.size_bytes == len(data) + entry.index_size_bytes and entry.codec is None
    loaded = await ckpt.load(manifest.checkpoint_id)
    stored = bytes(loaded.artifacts[("op", 0)])  # handed out as stored, index included
    assert stored[: len(data)] == data
    ranges = decode_index("x", stored[len(data) :], len(data))
    assert [stored[r.offset : r.offset + r.length] for r in ranges] == list(PIECES)
    assert [r.sha256 for r in ranges] == [hashlib.sha256(p).hexdigest() for p in PIECES]
    assert entry.sha256 == hashlib.sha256(stored[len(data) :]).hexdigest()


def _object() -> tuple[bytes, int, str]:
    data = b"".join(PIECES)
    index = encode_index([(len(p), hashlib.sha256(p).hexdigest()) for p in PIECES])
    return data + index, len(index), hashlib.sha256(index).hexdigest()


def test_a_flipped_byte_anywhere_is_caught_naming_what_it_hit() -> None:
    stored, index_bytes, digest = _object()
    verify_ranges("obj", stored, index_bytes, digest)
    in_range = bytearray(stored)
    in_range[len(PIECES[0]) + 5] ^= 1  # inside the third range (the second is empty)
    with pytest.raises(IntegrityMismatchError, match=r"bytes 11\.\.70011") as info:
        verify_ranges("obj", bytes(in_range), index_bytes, digest)
    assert info.value.path == "obj"
    in_index = bytearray(stored)
    in_index[-3] ^= 1
    with pytest.raises(IntegrityMismatchError, match="range index"):
        verify_ranges("obj", bytes(in_index), index_bytes, digest)


def test_an_index_that_does_not_describe_its_object_is_undecodable() -> None:
    stored, index_bytes, _ = _object()
    data_size = len(stored) - index_bytes
    index = stored[data_size:]
    with pytest.raises(UndecodableArtifactError, match="describes 70015 bytes"):
        decode_index("obj", index, data_size + 1)
    with pytest.raises(UndecodableArtifactError, match="not an index"):
        decode_index("obj", index[:-1], data_size)
    with pytest.raises(UndecodableArtifactError, match="not an index"):
        decode_index("obj", b"cairn-ranges-v2\n", 0)
    # A forged index whose own digest matches still has to add up.
    forged = encode_index([(1, "0" * 64)])
    with pytest.raises(UndecodableArtifactError):
        verify_ranges("obj", b"ab" + forged, len(forged), hashlib.sha256(forged).hexdigest())


def test_a_manifest_entry_of_ranges_is_checked() -> None:
    entry = PartitionSnapshotEntry(
        partition_id=0,
        is_delta=False,
        path="operators/op/partition-0.snap",
        size_bytes=100,
        sha256="0" * 64,
        index_size_bytes=index_size(2),
    )
    check_entry("op", entry)
    with pytest.raises(InvalidInputError, match="not the size of a range index"):
        check_entry("op", PartitionSnapshotEntry(**{**_fields(entry), "index_size_bytes": 17}))
    with pytest.raises(InvalidInputError, match="out of range"):
        check_entry("op", PartitionSnapshotEntry(**{**_fields(entry), "index_size_bytes": 136}))
    with pytest.raises(InvalidInputError, match="cannot have a codec or an offset"):
        check_entry("op", PartitionSnapshotEntry(**{**_fields(entry), "codec": "zstd"}))


def test_used_bytes_are_checked_on_a_carried_whole_object_only() -> None:
    owner = CheckpointId.now()
    entry = PartitionSnapshotEntry(
        partition_id=0,
        is_delta=False,
        path="operators/op/partition-0.snap",
        size_bytes=100,
        sha256="0" * 64,
        owner=owner,
        index_size_bytes=index_size(2),
        used_bytes=40,
    )
    check_entry("op", entry)
    with pytest.raises(InvalidInputError, match="used_bytes of .* out of range"):
        check_entry("op", PartitionSnapshotEntry(**{**_fields(entry), "used_bytes": 101}))
    with pytest.raises(InvalidInputError, match="only a whole, uncompressed object carried"):
        check_entry("op", PartitionSnapshotEntry(**{**_fields(entry), "owner": None}))


def _fields(entry: PartitionSnapshotEntry) -> dict[str, Any]:
    return {f: getattr(entry, f) for f in entry.__struct_fields__}


async def test_a_damaged_object_of_ranges_fails_its_load() -> None:
    store = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(store)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): Pieces(*PIECES)}))
    [(_, entry)] = manifest.partition_entries()
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    stored = bytearray((await store.get(path)).data)
    stored[2] ^= 1
    await store.put(path, bytes(stored))
    with pytest.raises(IntegrityMismatchError, match="bytes 0..11"):
        await ckpt.load(manifest.checkpoint_id)


class _FailsOnceMidStream(ForwardingStore):
    """The first ``put_stream`` takes one chunk, then fails as a dropped connection would."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.failed = False

    async def put_stream(self, path: str, open_chunks: Any, *, metadata: Any = None) -> None:
        if not self.failed:
            self.failed = True
            chunks = open_chunks()
            await anext(chunks)
            await chunks.aclose()
            raise TransientStoreError("put_stream", path, "injected: connection reset")
        await super().put_stream(path, open_chunks, metadata=metadata)


async def test_a_retried_upload_opens_the_ranges_again_and_indexes_the_last_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_upload, "JOINED_OBJECT_BYTES", 0)  # streamed, however small
    store = _FailsOnceMidStream(ObstoreStore(MemoryStore()))
    ckpt = make_checkpointer(store)
    source = Pieces(*PIECES)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): source}))
    assert store.failed and source.opened == 2
    [(_, entry)] = manifest.partition_entries()
    assert entry.index_size_bytes == index_size(len(PIECES))
    await ckpt.load(manifest.checkpoint_id)  # verified range by range


async def test_ranges_are_not_written_at_the_references_fixed_names() -> None:
    ckpt = make_checkpointer(ObstoreStore(MemoryStore()))
    with pytest.raises(InvalidInputError, match="save_partitions_concurrent"):
        await ckpt.save_snapshot(CheckpointId.now(), "op", 0, Pieces(b"a"))


class _ChunkCounter(ForwardingStore):
    """Records the size of every chunk a ``put_stream`` is handed."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.sizes: list[int] = []

    async def put_stream(self, path: str, open_chunks: Any, *, metadata: Any = None) -> None:
        def counting() -> AsyncIterator[Any]:
            async def chunks() -> AsyncIterator[Any]:
                async for chunk in open_chunks():
                    self.sizes.append(memoryview(chunk).nbytes)
                    yield chunk

            return chunks()

        await super().put_stream(path, counting, metadata=metadata)


async def test_small_ranges_are_coalesced_and_large_ones_sent_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_upload, "JOINED_OBJECT_BYTES", 0)  # streamed, however small
    store = _ChunkCounter(ObstoreStore(MemoryStore()))
    ckpt = make_checkpointer(store)
    small = [bytes([n]) * 1000 for n in range(100)]
    large = b"L" * (2 << 20)
    source = Pieces(*small[:50], large, *small[50:])
    await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): source}))
    # 50 small ranges in one chunk, the large one alone, the other 50 with the index.
    assert store.sizes == [50_000, 2 << 20, 50_000 + index_size(101)]


class _Writes(ForwardingStore):
    """Records every write: ``("put", path)`` or ``("put_stream", path)``."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.writes: list[tuple[str, str]] = []

    async def put(self, path: str, data: Any, **kwargs: Any) -> Any:
        self.writes.append(("put", path))
        return await super().put(path, data, **kwargs)

    async def put_stream(self, path: str, open_chunks: Any, *, metadata: Any = None) -> None:
        self.writes.append(("put_stream", path))
        await super().put_stream(path, open_chunks, metadata=metadata)


def _ranges_writes(store: _Writes) -> list[str]:
    return [kind for kind, path in store.writes if "/operators/op/" in path]


async def test_an_object_of_ranges_up_to_the_single_put_size_is_one_put(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = sum(map(len, PIECES)) + index_size(len(PIECES))
    monkeypatch.setattr(_upload, "JOINED_OBJECT_BYTES", size)
    store = _Writes(ObstoreStore(MemoryStore()))
    ckpt = make_checkpointer(store)
    source = Pieces(*PIECES)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): source}))
    assert _ranges_writes(store) == ["put"] and source.opened == 1
    [(_, entry)] = manifest.partition_entries()
    assert entry.size_bytes == size
    await ckpt.load(manifest.checkpoint_id)  # verified range by range


async def test_a_local_directory_takes_an_object_of_ranges_as_a_stream(tmp_path: Path) -> None:
    store = _Writes(as_store(str(tmp_path)))
    ckpt = make_checkpointer(store)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): Pieces(*PIECES)}))
    assert _ranges_writes(store) == ["put_stream"]
    await ckpt.load(manifest.checkpoint_id)


async def test_a_larger_object_of_ranges_streams_on_from_what_was_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the size: a streamed upload, fed first the chunks already read (the source
    is not opened again), each chunk as a fresh pass would give it."""
    pieces = (b"first range", b"L" * 200_000, b"last")
    monkeypatch.setattr(_upload, "JOINED_OBJECT_BYTES", 12)  # over it with the second chunk
    store = _Writes(ObstoreStore(MemoryStore()))
    counter = _ChunkCounter(store)
    ckpt = make_checkpointer(counter)
    source = Pieces(*pieces)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): source}))
    assert _ranges_writes(store) == ["put_stream"] and source.opened == 1
    assert counter.sizes == [11, 200_000, 4 + index_size(len(pieces))]
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert bytes(loaded.artifacts[("op", 0)]).startswith(b"".join(pieces))


def test_group_spans_cuts_by_size_and_gap_in_offset_order() -> None:
    members = [(50, 10), (0, 10), (10, 10), (25, 5), (100, 40), (141, 1)]
    spans = group_spans(members, lambda m: m, max_bytes=40, max_gap=5)
    # (0..30) fit in 40 bytes with gaps <= 5; 50 is 20 past 30; the 40-byte member
    # fills a span alone; 141 is 1 past 140 but would make the span 41 bytes.
    assert spans == [[(0, 10), (10, 10), (25, 5)], [(50, 10)], [(100, 40)], [(141, 1)]]
    assert group_spans([], lambda m: m, 40, 5) == []
    assert group_spans([(0, 100)], lambda m: m, 40, 5) == [[(0, 100)]]


# -- ranges stored as zstd frames --------------------------------------------------------


class Frames(RangeSource):
    """Ranges of given bytes, each stored as a zstd frame; ``decoded`` overrides the
    decoded size a range reports (by position), to forge one."""

    codec = "zstd"

    def __init__(self, *pieces: bytes, decoded: dict[int, int | None] | None = None) -> None:
        self.pieces = pieces
        self.decoded = decoded or {}

    def open(self) -> AsyncIterator[Range]:
        return self._ranges()

    async def _ranges(self) -> AsyncIterator[Range]:
        for number, piece in enumerate(self.pieces):
            frame = zstandard.ZstdCompressor().compress(piece)
            size = self.decoded.get(number, len(piece))
            yield Range(frame, hashlib.sha256(piece).hexdigest(), size)


async def test_ranges_stored_as_frames_save_load_and_decode_alone(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): Frames(*PIECES)}))
    [(_, entry)] = manifest.partition_entries()
    assert entry.index_size_bytes == index_size(len(PIECES), "zstd") and entry.codec is None
    loaded = await ckpt.load(manifest.checkpoint_id)  # every frame decoded and checked
    stored = bytes(loaded.artifacts[("op", 0)])
    split = len(stored) - entry.index_size_bytes
    assert stored[split:].startswith(COMPRESSED_INDEX_MAGIC) and split < len(b"".join(PIECES))
    ranges = decode_index("x", stored[split:], split)
    assert [r.decoded_size for r in ranges] == [len(p) for p in PIECES]
    decoded = [decode_range("x", stored[r.offset : r.offset + r.length], r) for r in ranges]
    assert [bytes(d) for d in decoded] == list(PIECES)


async def test_a_damaged_frame_fails_the_load_naming_the_object() -> None:
    store = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(store)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): Frames(*PIECES)}))
    [(_, entry)] = manifest.partition_entries()
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    stored = bytearray((await store.get(path)).data)
    assert entry.index_size_bytes is not None
    stored[len(stored) - entry.index_size_bytes - 3] ^= 1  # inside the last frame
    await store.put(path, bytes(stored))
    with pytest.raises((IntegrityMismatchError, UndecodableArtifactError)) as info:
        await ckpt.load(manifest.checkpoint_id)
    assert isinstance(info.value, (IntegrityMismatchError, UndecodableArtifactError))
    assert info.value.path == path


@pytest.mark.parametrize(
    ("recorded", "error"), [(10, OversizedArtifactError), (99_999, IntegrityMismatchError)]
)
async def test_a_frame_that_does_not_decode_to_its_recorded_size_fails(
    recorded: int, error: type[Exception]
) -> None:
    ckpt = make_checkpointer(ObstoreStore(MemoryStore()))
    source = Frames(*PIECES, decoded={2: recorded})  # the 70,000-byte range
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): source}))
    with pytest.raises(error):  # a frame inflating past 10 bytes stops there: a bomb
        await ckpt.load(manifest.checkpoint_id)


async def test_a_compressed_source_must_mark_every_range_and_commits_nothing_if_not() -> None:
    ckpt = make_checkpointer(ObstoreStore(MemoryStore()))
    with pytest.raises(InvalidInputError, match="not marked zstd"):
        await ckpt.save(
            CheckpointData(epoch=1, snapshots={("op", 0): Frames(b"a", decoded={0: None})})
        )
    assert await ckpt.list_checkpoints() == []
    with pytest.raises(InvalidInputError, match="has a decoded size"):
        await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): _Marked(b"a")}))
    assert await ckpt.list_checkpoints() == []
    with pytest.raises(InvalidInputError, match="cannot be stored with codec"):
        encode_compressed_index([(1, 1, "0" * 64)], "lz4")


class _Marked(Pieces):
    """An uncompressed source whose ranges claim a decoded size."""

    async def _ranges(self) -> AsyncIterator[Range]:
        for piece in self.pieces:
            yield Range(piece, hashlib.sha256(piece).hexdigest(), len(piece))


def test_a_manifest_entry_of_compressed_ranges_is_checked() -> None:
    entry = PartitionSnapshotEntry(
        partition_id=0,
        is_delta=False,
        path="operators/op/partition-0.snap",
        size_bytes=200,
        sha256="0" * 64,
        index_size_bytes=index_size(3, "zstd"),
    )
    check_entry("op", entry)
    assert not is_index_size(len(COMPRESSED_INDEX_MAGIC) + 47)
