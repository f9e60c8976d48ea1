"""Large state, streamed: files, file objects and iterators in; verified files out."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from obstore.store import MemoryStore, ObjectStore
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore

from cairn import (
    CheckpointData,
    CheckpointId,
    IntegrityMismatchError,
    InvalidCheckpointDataError,
    InvalidInputError,
    ObjectStoreCheckpointer,
)
from cairn.stores import ObstoreStore

BIG = 12 * 1024 * 1024 + 12345  # more than one 8 MiB part, not a multiple of it


def pattern(size: int) -> bytes:
    block = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def chunks(data: bytes, size: int = 1_000_003) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def achunks(data: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks(data, 3_000_017):
        yield chunk


async def test_every_kind_of_source_round_trips(
    ckpt: ObjectStoreCheckpointer, tmp_path: Path
) -> None:
    data = pattern(BIG)
    file_path = tmp_path / "state.bin"
    file_path.write_bytes(data)
    with file_path.open("rb") as handle:
        manifest = await ckpt.save(
            CheckpointData(
                epoch=1,
                snapshots={
                    ("path", 0): file_path,
                    ("file", 0): handle,
                    ("iter", 0): chunks(data),
                    ("aiter", 0): achunks(data),
                    ("bytes", 0): data,
                },
            )
        )
    digest = hashlib.sha256(data).hexdigest()
    for op in ("path", "file", "iter", "aiter", "bytes"):
        [entry] = manifest.operators[op].partitions
        assert (entry.sha256, entry.size_bytes) == (digest, len(data)), op
    loaded = await ckpt.load(manifest.checkpoint_id)
    for key, value in loaded.artifacts.items():
        assert bytes(value) == data, key


async def test_a_file_is_resent_after_a_transient_fault_a_stream_is_not(
    tmp_path: Path,
) -> None:
    data = pattern(BIG)
    file_path = tmp_path / "state.bin"
    file_path.write_bytes(data)
    inner = ObstoreStore(MemoryStore())
    faulty = FaultyStore(inner, FaultPlan(transient_burst=1, transient_ops=frozenset({"put"})))
    ckpt = make_checkpointer(faulty)
    cid = CheckpointId.now()
    [(_, entry)] = await ckpt.save_partitions_concurrent(cid, [("op", 0, False, file_path)])
    assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert faulty.plan.transient_burst == 0, "the fault fired and the file was sent again"
    stored = await ckpt.load_artifact(ckpt.paths.resolve(cid, entry.path))
    assert bytes(stored) == data

    # The stream is sent, then the reply is lost: a retry would have to send it again.
    faulty.plan.lose_put_responses_matching = "partition-1"
    with pytest.raises(InvalidInputError, match="one-shot stream"):
        await ckpt.save_partitions_concurrent(CheckpointId.now(), [("op", 1, False, chunks(data))])


def test_bad_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidCheckpointDataError, match="is a str"):
        CheckpointData(epoch=1, snapshots={("op", 0): "text"})  # type: ignore[dict-item]
    with pytest.raises(InvalidCheckpointDataError, match="no readable file"):
        CheckpointData(epoch=1, snapshots={("op", 0): tmp_path / "missing"})
    with pytest.raises(InvalidCheckpointDataError, match="bytes-like"):
        CheckpointData(epoch=1, snapshots={("op", 0): 42})  # type: ignore[dict-item]


async def test_restore_streams_verified_into_place(raw_store: ObjectStore, tmp_path: Path) -> None:
    ckpt = make_checkpointer(raw_store)
    data = pattern(BIG)
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): data}))
    [entry] = manifest.operators["op"].partitions
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    target = tmp_path / "out" / "partition-0.snap"
    target.parent.mkdir()
    digest = await ckpt.load_artifact_to(
        path, target, expected_sha256=entry.sha256, chunk_size=5_000_000
    )
    assert digest == entry.sha256
    assert target.read_bytes() == data
    sink = io.BytesIO()
    await ckpt.load_artifact_to(path, sink, expected_sha256=entry.sha256)
    assert sink.getvalue() == data

    wrong = tmp_path / "out" / "wrong.snap"
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load_artifact_to(path, wrong, expected_sha256="0" * 64)
    assert info.value.path == path
    assert not wrong.exists()
    assert sorted(os.listdir(target.parent)) == ["partition-0.snap"], "no partial file left"
    with pytest.raises(InvalidInputError, match="directory"):
        await ckpt.load_artifact_to(path, tmp_path / "out")
