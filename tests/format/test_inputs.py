"""Artifact inputs: any C-contiguous buffer is stored as its raw bytes; the rest is refused.

Every buffer is sent zero-copy as flat bytes (whatever its format or dimensions), on each
upload path: plain, compressed, streamed, distributed. Non-contiguous buffers and chunks
that are not bytes-like raise a typed error naming the artifact, and nothing is committed
(a chunk that is an int is refused, never stored as zero bytes).
"""

from __future__ import annotations

import array
import hashlib
import io
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from obstore.store import LocalStore, MemoryStore
from support.backends import make_checkpointer

from cairn import (
    CheckpointData,
    CheckpointId,
    InvalidCheckpointDataError,
    InvalidInputError,
    ObjectStoreCheckpointer,
    commit_distributed,
    upload_partitions,
)
from cairn.data.inputs import as_buffer, check_artifact_data
from cairn.format._buffer import raw_bytes

KEY = ("op", 0)


@pytest.fixture(params=["memory", "local"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """Where the checkpoints go: a memory store or a local directory."""
    return str(request.param)


@pytest.fixture(params=[None, "zstd"], ids=["plain", "zstd"])
def compression(request: pytest.FixtureRequest) -> str | None:
    """Artifacts stored as they are, or zstd-compressed."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def ckpt(store_kind: str, compression: str | None, tmp_path: Path) -> ObjectStoreCheckpointer:
    """An empty checkpointer over ``store_kind``, with ``compression``."""
    if store_kind == "memory":
        return make_checkpointer(MemoryStore(), compression=compression)
    root = tmp_path / "store"
    root.mkdir()
    return make_checkpointer(LocalStore(root), compression=compression)


async def stored_paths(ckpt: ObjectStoreCheckpointer) -> list[str]:
    """Every object in the store, committed or not."""
    return sorted(info.path for info in await ckpt.store.list(""))


async def assert_nothing_committed(ckpt: ObjectStoreCheckpointer) -> None:
    assert await ckpt.list_checkpoints() == []
    assert await ckpt.load_latest() is None
    assert await stored_paths(ckpt) == [], "a failed save leaves no object behind"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- buffers of any format and shape round-trip as their raw bytes ---------------------


def _i_view() -> memoryview:
    return memoryview(bytearray(range(1, 25))).cast("I")


BUFFERS: dict[str, Callable[[], Any]] = {
    "numpy-2d-float32": lambda: np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5,
    # Over the inline-hash limit: hashed in a thread alongside the put.
    "numpy-2d-large": lambda: np.arange(256 * 300, dtype=np.float32).reshape(256, 300),
    "array-i": lambda: array.array("i", [1, -2, 3, 2**31 - 1]),
    "memoryview-I": _i_view,
    "numpy-0d": lambda: np.array(3.25),
    "numpy-empty-2d": lambda: np.zeros((0, 3), dtype=np.float32),
    "numpy-big-endian": lambda: np.arange(5, dtype=">i4"),
    "numpy-complex": lambda: np.array([1 + 2j, -3j]),
    "numpy-1d-fortran-and-c": lambda: np.asfortranarray(np.arange(4.0)),
}


@pytest.mark.parametrize("name", list(BUFFERS))
async def test_any_contiguous_buffer_round_trips_bit_exact(
    ckpt: ObjectStoreCheckpointer, compression: str | None, name: str
) -> None:
    x = BUFFERS[name]()
    raw = x.tobytes()
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={KEY: x}))
    [entry] = manifest.operators["op"].partitions
    assert (entry.size_bytes, entry.sha256) == (len(raw), sha(raw))
    assert entry.codec == compression
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == manifest.checkpoint_id
    assert bytes(loaded.artifacts[KEY]) == raw


async def test_every_partition_of_a_checkpoint_keeps_its_own_bytes(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    values = {("op", i): make() for i, make in enumerate(BUFFERS.values())}
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots=values))
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {
        k: v.tobytes() for k, v in values.items()
    }


async def test_buffer_chunks_of_any_format_stream_as_their_raw_bytes(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    grid: Any = np.arange(24, dtype=np.float64).reshape(4, 6)
    ints = array.array("i", range(-5, 5))

    def gen() -> Iterator[Any]:
        yield ints
        yield grid
        yield _i_view()

    async def agen() -> AsyncIterator[Any]:
        yield grid
        yield np.array(7.5)
        yield ints

    manifest = await ckpt.save(
        CheckpointData(
            epoch=1,
            snapshots={("list", 0): [grid, ints], ("gen", 0): gen(), ("agen", 0): agen()},
        )
    )
    expected = {
        ("list", 0): grid.tobytes() + ints.tobytes(),
        ("gen", 0): ints.tobytes() + grid.tobytes() + _i_view().tobytes(),
        ("agen", 0): grid.tobytes() + np.array(7.5).tobytes() + ints.tobytes(),
    }
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == expected
    for op, partitions in manifest.operators.items():
        [entry] = partitions.partitions
        assert entry.sha256 == sha(expected[(op, 0)]), op


async def test_a_reused_mutable_chunk_is_stored_as_it_was_when_yielded(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    # A reader that refills one buffer per chunk: each chunk must be taken as it was.
    def refill() -> Iterator[bytearray]:
        buf = bytearray(4)
        for fill in (b"aaaa", b"bbbb", b"cccc"):
            buf[:] = fill
            yield buf

    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={KEY: refill()}))
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert bytes(loaded.artifacts[KEY]) == b"aaaabbbbcccc"


async def test_the_distributed_worker_path_stores_raw_bytes(
    store_kind: str, tmp_path: Path
) -> None:
    # Workers hash before sending (the digest travels as metadata where the store has it).
    if store_kind == "memory":
        ckpt = make_checkpointer(MemoryStore())
    else:
        (tmp_path / "store").mkdir()
        ckpt = make_checkpointer(LocalStore(tmp_path / "store"))
    grid = np.arange(20, dtype=np.int16).reshape(4, 5)
    ints = array.array("i", [9, 8, 7])
    cid = CheckpointId.now()
    report = await upload_partitions(
        ckpt, cid, [("op", 0, False, grid), ("op", 1, False, ints)], worker="w0"
    )
    entries = {entry.partition_id: entry for _, entry in report.entries}
    assert entries[0].sha256 == sha(grid.tobytes()) and entries[0].size_bytes == grid.nbytes
    assert entries[1].sha256 == sha(ints.tobytes()) and entries[1].size_bytes == 12
    await commit_distributed(ckpt, cid, 1, [("op", 0), ("op", 1)], [report])
    loaded = await ckpt.load(cid)
    assert bytes(loaded.artifacts[("op", 0)]) == grid.tobytes()
    assert bytes(loaded.artifacts[("op", 1)]) == ints.tobytes()


# -- the buffer handed on is the caller's memory, as flat bytes --------------------------


def test_the_view_handed_on_shares_the_callers_memory() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = as_buffer(x)
    assert view is not None
    assert (view.format, view.ndim, view.nbytes, view.shape) == ("B", 1, 48, (48,))
    assert np.shares_memory(np.frombuffer(view, dtype=np.uint8), x)
    x[0, 0] = 99.0  # no copy was taken: the change shows through the view
    assert bytes(view) == x.tobytes()

    ints = array.array("i", [1, 2, 3])
    ints_view = raw_bytes(ints, "ints")
    assert ints_view is not None and ints_view.obj is ints and ints_view.format == "B"
    buf = bytearray(b"abc")
    buf_view = raw_bytes(buf, "buf")
    assert buf_view is not None and buf_view.obj is buf and not buf_view.readonly
    frozen = raw_bytes(b"abc", "frozen")
    assert frozen is not None and frozen.readonly and bytes(frozen) == b"abc"


def test_views_of_zero_dimensions_and_zero_bytes_are_flat_bytes() -> None:
    scalar = np.array(3.25)
    view = raw_bytes(scalar, "scalar")
    assert view is not None and (view.format, view.ndim, view.nbytes) == ("B", 1, 8)
    assert np.shares_memory(np.frombuffer(view, dtype=np.uint8), scalar)
    empty = raw_bytes(np.zeros((0, 3)), "empty")
    assert empty is not None and (empty.format, empty.ndim, empty.nbytes) == ("B", 1, 0)


def test_what_is_not_a_buffer_is_not_one() -> None:
    assert raw_bytes("text", "s") is None
    assert raw_bytes(42, "n") is None
    assert raw_bytes([b"a"], "list") is None


# -- non-contiguous buffers are refused, with the fix in the message ------------------------


def _strided_memoryview() -> memoryview:
    return memoryview(bytearray(b"abcdefgh"))[::2]


NON_CONTIGUOUS: dict[str, Callable[[], Any]] = {
    "numpy-column-slice": lambda: np.arange(12.0).reshape(3, 4)[:, ::2],
    "numpy-fortran-2d": lambda: np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "memoryview-step": _strided_memoryview,
    "numpy-reversed": lambda: np.arange(4)[::-1],
}


@pytest.mark.parametrize("name", list(NON_CONTIGUOUS))
async def test_a_non_contiguous_buffer_is_refused_before_any_upload(
    ckpt: ObjectStoreCheckpointer, name: str
) -> None:
    x = NON_CONTIGUOUS[name]()
    with pytest.raises(InvalidCheckpointDataError) as info:
        CheckpointData(epoch=1, snapshots={("op", 3): b"fine", KEY: x})
    message = str(info.value)
    assert "snapshots[('op', 0)]" in message and "not a C-contiguous buffer" in message
    assert "numpy.ascontiguousarray" in message and ".tobytes()" in message
    if name == "numpy-fortran-2d":
        assert "Fortran-ordered" in message
    # The lower-level path refuses it too, before the good artifact beside it is sent.
    with pytest.raises(InvalidInputError, match=r"ascontiguousarray") as low:
        await ckpt.save_partitions_concurrent(
            CheckpointId.now(), [("good", 0, False, b"x" * 100), ("op", 0, False, x)]
        )
    assert "('op', 0)" in str(low.value)
    await assert_nothing_committed(ckpt)


async def test_a_non_contiguous_chunk_is_refused(ckpt: ObjectStoreCheckpointer) -> None:
    column: Any = np.arange(12.0).reshape(3, 4)[:, ::2]
    with pytest.raises(InvalidCheckpointDataError, match=r"chunk 1 of snapshots.*ascontiguous"):
        CheckpointData(epoch=1, snapshots={KEY: [b"ok", column]})

    def gen() -> Iterator[Any]:
        yield b"ok"
        yield column

    with pytest.raises(InvalidInputError, match=r"chunk 1 of .*ascontiguousarray"):
        await ckpt.save(CheckpointData(epoch=1, snapshots={KEY: gen()}))
    await assert_nothing_committed(ckpt)


def test_buffers_that_are_not_data_are_refused() -> None:
    with pytest.raises(InvalidCheckpointDataError, match=r"\('op', 0\).*Python objects"):
        CheckpointData(epoch=1, snapshots={KEY: np.array([b"x", 1], dtype=object)})
    with pytest.raises(InvalidCheckpointDataError, match=r"Python objects"):
        CheckpointData(epoch=1, snapshots={KEY: np.zeros(2, dtype="i4,O")})
    with pytest.raises(InvalidCheckpointDataError, match=r"cannot be read as a buffer.*tobytes"):
        CheckpointData(epoch=1, snapshots={KEY: np.zeros(3, dtype="M8[s]")})
    released = memoryview(b"abc")
    released.release()
    with pytest.raises(InvalidCheckpointDataError, match=r"cannot be read as a buffer"):
        CheckpointData(epoch=1, snapshots={KEY: released})


# -- what is not bytes (or chunks of bytes) is refused ----------------------------------


NOT_CHUNKS: dict[str, tuple[Callable[[Path], Any], str]] = {
    "list-of-ints": (lambda _: list(b"abc"), r"chunk 0 of .* type int.*pass the bytes object"),
    "list-of-str": (lambda _: ["a", "b"], r"chunk 0 of .* type str"),
    "tuple-with-none": (lambda _: (b"ab", None), r"chunk 1 of .* type NoneType"),
    "range": (lambda _: range(3), r"chunk 0 of .* type int"),
    "dict": (lambda _: {"k": b"v"}, r"is a mapping \(dict\)"),
    "set": (lambda _: {b"a", b"b"}, r"is a set .*order is arbitrary"),
    "string-io": (lambda _: io.StringIO("text"), r"text mode \(StringIO\).*'rb'"),
}


@pytest.mark.parametrize("name", list(NOT_CHUNKS))
async def test_what_is_not_bytes_is_refused_before_any_upload(
    ckpt: ObjectStoreCheckpointer, tmp_path: Path, name: str
) -> None:
    make, pattern = NOT_CHUNKS[name]
    with pytest.raises(InvalidCheckpointDataError, match=pattern) as info:
        CheckpointData(epoch=1, snapshots={KEY: make(tmp_path)})
    assert "snapshots[('op', 0)]" in str(info.value)
    with pytest.raises(InvalidInputError, match=pattern):
        await ckpt.save_partitions_concurrent(
            CheckpointId.now(), [("good", 0, False, b"x" * 100), ("op", 0, False, make(tmp_path))]
        )
    await assert_nothing_committed(ckpt)


def test_a_file_opened_in_text_mode_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.txt"
    path.write_text("state")
    with path.open() as text, pytest.raises(InvalidInputError, match=r"text mode.*'rb'"):
        check_artifact_data("state", text)
    with path.open("rb") as binary:
        check_artifact_data("state", binary)  # the same file in binary mode is fine


class _OneShot:
    """An iterator that is not a Sequence: only reading it tells what it yields."""

    def __init__(self, *chunks: object) -> None:
        self._chunks = iter(chunks)

    def __iter__(self) -> Iterator[object]:
        return self

    def __next__(self) -> object:
        return next(self._chunks)


def _agen(*chunks: object) -> Callable[[], AsyncIterator[Any]]:
    async def gen() -> AsyncIterator[Any]:
        for chunk in chunks:
            yield chunk

    return gen


ITERATED: dict[str, tuple[Callable[[], Any], str]] = {
    "async-int-after-bytes": (_agen(b"ok" * 1000, 7), r"chunk 1 of .* type int"),
    "async-str": (_agen("text"), r"chunk 0 of .* type str"),
    "sync-int-after-bytes": (lambda: _OneShot(b"ok", 7), r"chunk 1 of .* type int"),
    # None once ended a sync stream silently, committing only what came before it.
    "sync-none-after-bytes": (lambda: _OneShot(b"ok", None, b"more"), r"chunk 1 .*NoneType"),
    "sync-dict-chunk": (lambda: _OneShot({"k": 1}), r"chunk 0 of .* type dict"),
    "async-list-chunk": (_agen([1, 2]), r"chunk 0 of .* type list"),
}


@pytest.mark.parametrize("name", list(ITERATED))
async def test_a_bad_chunk_found_while_reading_fails_the_save_and_commits_nothing(
    ckpt: ObjectStoreCheckpointer, name: str
) -> None:
    make, pattern = ITERATED[name]
    data = CheckpointData(epoch=1, snapshots={("good", 0): b"g" * 1000, KEY: make()})
    with pytest.raises(InvalidInputError, match=pattern):
        await ckpt.save(data)
    await assert_nothing_committed(ckpt)


async def test_a_bad_chunk_error_names_the_artifact() -> None:
    ckpt = make_checkpointer(MemoryStore())
    with pytest.raises(InvalidInputError) as info:
        await ckpt.save(CheckpointData(epoch=1, snapshots={KEY: _agen(b"ok", 7)()}))
    assert re.search(r"operators/op/partition-0\.[0-9a-f]{12}\.snap", str(info.value))
