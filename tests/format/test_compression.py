"""Optional zstd compression: recorded per entry, digest over the caller's bytes."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import io
import sys
import weakref
from pathlib import Path

import pytest
from obstore.store import ObjectStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer

from cairn import (
    CheckpointData,
    CodecError,
    IntegrityMismatchError,
    SyncCheckpointer,
    UndecodableArtifactError,
)
from cairn.format.codecs import Decoder, get_codec

STATE = b"count=1;" * 200_000  # compressible, 1.6 MB


def live_decoders() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Decoder)  # no __class__ lookups


async def settled_decoders(expected: int) -> int:
    """Live decoders once the worker threads have let go of their last call.

    A worker thread that ran ``decoder.feed`` drops its work item, and with it the
    decoder, only after the caller has been woken with the result: for a moment after
    a load returns, a busy machine may still show the decoder on that thread. A decoder
    still alive after a second is kept by something else."""
    for _ in range(50):
        if (count := live_decoders()) == expected:
            return count
        await asyncio.sleep(0.02)
    return live_decoders()


class _Pieces(list[bytes]):
    """A sink that can be watched for being freed (a plain list cannot)."""


def test_a_decoder_and_what_it_decoded_are_freed_when_dropped() -> None:
    """A decoder is freed as soon as it is dropped, with what its sink holds: nothing of
    it sits in a cycle through zstandard's writer, which the collector cannot see into."""
    codec = get_codec("zstd")
    stored = codec.compress(STATE)
    pieces = _Pieces()
    decoder = codec.decoder(pieces.append, path="a", limit=None, piece_size=64 * 1024)
    decoder.feed(stored)
    assert decoder.size == len(STATE) and b"".join(pieces) == STATE
    decoder_ref, pieces_ref = weakref.ref(decoder), weakref.ref(pieces)
    del decoder, pieces
    assert decoder_ref() is None and pieces_ref() is None
    before = live_decoders()
    for _ in range(3):
        assert codec.decompress(stored, path="a", size_bytes=len(STATE)) == STATE
    assert live_decoders() == before


async def test_loads_of_compressed_artifacts_leave_no_decoder_behind(
    raw_store: ObjectStore, tmp_path: Path
) -> None:
    ckpt = make_checkpointer(raw_store, compression="zstd")
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): STATE}))
    [entry] = manifest.operators["op"].partitions
    before = live_decoders()
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert bytes(loaded.artifacts[("op", 0)]) == STATE
    sink = io.BytesIO()
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    await ckpt.load_artifact_to(path, sink, expected_sha256=entry.sha256, codec="zstd")
    assert sink.getvalue() == STATE
    del loaded
    assert await settled_decoders(before) == before


async def test_compressed_round_trip(raw_store: ObjectStore, tmp_path: Path) -> None:
    ckpt = make_checkpointer(raw_store, compression="zstd")
    file_path = tmp_path / "state.bin"
    file_path.write_bytes(STATE * 6)  # streamed: over one part
    manifest = await ckpt.save(
        CheckpointData(epoch=1, snapshots={("op", 0): STATE, ("op", 1): file_path})
    )
    small, big = manifest.operators["op"].partitions
    assert (small.codec, small.size_bytes) == ("zstd", len(STATE))
    assert small.sha256 == hashlib.sha256(STATE).hexdigest()
    assert small.stored_size_bytes is not None and small.stored_size_bytes < len(STATE) // 20
    assert big.sha256 == hashlib.sha256(STATE * 6).hexdigest()
    assert big.stored_size_bytes is not None and big.stored_size_bytes < len(STATE) // 5
    stored = await ckpt.store.head(ckpt.paths.resolve(manifest.checkpoint_id, small.path))
    assert stored.size == small.stored_size_bytes
    plain_reader = make_checkpointer(raw_store)  # no codec configured
    loaded = await plain_reader.load(manifest.checkpoint_id)
    assert bytes(loaded.artifacts[("op", 0)]) == STATE
    assert bytes(loaded.artifacts[("op", 1)]) == STATE * 6
    sink = io.BytesIO()
    path = ckpt.paths.resolve(manifest.checkpoint_id, big.path)
    await ckpt.load_artifact_to(path, sink, expected_sha256=big.sha256, codec="zstd")
    assert sink.getvalue() == STATE * 6


async def test_damaged_compressed_bytes_are_an_integrity_error(raw_store: ObjectStore) -> None:
    ckpt = make_checkpointer(raw_store, compression="zstd")
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): STATE}))
    path = artifact_path(ckpt.paths, manifest, "op", 0)
    body = bytearray((await ckpt.store.get(path)).data)
    body[len(body) // 2] ^= 0xFF
    await ckpt.store.put(path, bytes(body))
    # Damage either breaks the zstd frame or decodes to other bytes: both name the artifact.
    with pytest.raises((UndecodableArtifactError, IntegrityMismatchError)) as info:
        await ckpt.load(manifest.checkpoint_id)
    assert isinstance(info.value, UndecodableArtifactError | IntegrityMismatchError)
    assert info.value.path == path


def test_a_reader_without_the_codec_gets_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    writer = SyncCheckpointer(tmp_path.as_uri(), compression="zstd")
    manifest = writer.save(CheckpointData(epoch=1, snapshots={("op", 0): STATE}))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    reader = SyncCheckpointer(tmp_path.as_uri())
    with pytest.raises(CodecError, match="zstandard") as info:
        reader.load(manifest.checkpoint_id)
    assert info.value.codec == "zstd"
    assert info.value.path == artifact_path(reader.paths, manifest, "op", 0)
    with pytest.raises(CodecError, match="not installed"):
        SyncCheckpointer(tmp_path.as_uri(), compression="zstd")


def test_unknown_codecs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CodecError, match="unknown codec"):
        SyncCheckpointer(tmp_path.as_uri(), compression="lz4")
