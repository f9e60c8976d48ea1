"""Artifact download: loading checkpoints and chains, and streamed restore to files.

Invariants:

* every byte handed out is verified against the SHA-256 its manifest records (unless
  the caller asks not to), after decompression, in a worker thread;
* at most ``max_concurrent_downloads`` reads are in flight;
* an artifact a chain needs that is gone is a :class:`BrokenChainError` naming it; bytes
  that do not decode or hash as recorded are an :class:`IntegrityMismatchError` naming it;
* a streamed restore to a path holds at most two chunks in memory, and the final name
  appears only once the bytes are fsynced and verified (a mismatch leaves nothing there).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from cairn import _catalog, _chains
from cairn._buffer import Buffer
from cairn._concurrency import bounded_gather
from cairn._context import Context
from cairn._validate import positive_int
from cairn.codecs import StreamDecoder, get_codec
from cairn.data import ArtifactKey, ChainLink, LoadedCheckpoint
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    IntegrityMismatchError,
    InvalidInputError,
    UndecodableArtifactError,
)
from cairn.ids import CheckpointId
from cairn.integrity import verify_integrity
from cairn.layout import validate_name, validate_partition
from cairn.manifest import PartitionSnapshotEntry

__all__ = ["load", "load_artifact", "load_artifact_to", "load_chain"]


async def load(ctx: Context, checkpoint_id: CheckpointId, verify: bool) -> LoadedCheckpoint:
    """A committed checkpoint with every artifact of every chain, verified."""
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    resolved = await _chains.resolve_chains(ctx, manifest)
    flat = [(key, owner, entry) for key, links in resolved.items() for owner, entry in links]
    blobs = await bounded_gather(
        ctx.max_concurrent_downloads,
        [_fetch_link(ctx, owner, entry, verify) for _, owner, entry in flat],
    )
    chains: dict[ArtifactKey, list[ChainLink]] = {}
    for (key, owner, entry), blob in zip(flat, blobs, strict=True):
        chains.setdefault(key, []).append(ChainLink(entry=entry, owner=owner, data=blob))
    return LoadedCheckpoint(
        manifest=manifest,
        artifacts={key: links[-1].data for key, links in chains.items()},
        source_offsets=dict(manifest.source_offsets),
        chains=chains,
    )


async def load_chain(
    ctx: Context, checkpoint_id: CheckpointId, operator: str, partition: int
) -> list[ChainLink]:
    """The verified links that rebuild one partition: base snapshot, then deltas in order."""
    key = (validate_name("operator", operator), validate_partition(partition))
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    resolved = await _chains.resolve_chains(ctx, manifest)
    if key not in resolved:
        raise CheckpointNotFoundError(
            ctx.paths.checkpoint_dir(checkpoint_id), f"partition {key!r} in checkpoint"
        )
    links = resolved[key]
    blobs = await bounded_gather(
        ctx.max_concurrent_downloads,
        [_fetch_link(ctx, owner, entry, True) for owner, entry in links],
    )
    return [
        ChainLink(entry=entry, owner=owner, data=blob)
        for (owner, entry), blob in zip(links, blobs, strict=True)
    ]


async def load_artifact(ctx: Context, path: str, expected_sha256: str | None) -> Buffer:
    """The bytes at store ``path``, verified against ``expected_sha256`` when given."""
    if not isinstance(path, str) or not path:
        raise InvalidInputError(f"artifact path must be a non-empty string, got {path!r}")
    blob = await ctx.store.get(path)
    if expected_sha256 is not None:
        await asyncio.to_thread(verify_integrity, path, blob.data, expected_sha256)
    return blob.data


def _fetch_link(
    ctx: Context, owner: CheckpointId, entry: PartitionSnapshotEntry, verify: bool
) -> Callable[[], Awaitable[Buffer]]:
    path = ctx.paths.resolve(owner, entry.path)

    async def job() -> Buffer:
        try:
            if entry.codec is None:
                expected = entry.sha256 if verify else None
                return await load_artifact(ctx, path, expected)
            codec = get_codec(entry.codec, path=path)
            stored = await load_artifact(ctx, path, None)
        except CheckpointNotFoundError:
            raise BrokenChainError(path, f"artifact of checkpoint {owner} is gone") from None
        try:
            data = await asyncio.to_thread(codec.decompress, stored)
        except Exception as exc:  # the codec's own error type: the bytes are damaged
            raise UndecodableArtifactError(path, entry.codec, str(exc)) from None
        if verify:
            await asyncio.to_thread(verify_integrity, path, data, entry.sha256)
        return data

    return job


async def load_artifact_to(
    ctx: Context,
    path: str,
    dest: os.PathLike[str] | BinaryIO,
    expected_sha256: str | None,
    chunk_size: int,
    codec: str | None,
) -> str:
    """Stream the object at ``path`` into ``dest``; its SHA-256 (see the façade's docs)."""
    positive_int("chunk_size", chunk_size)
    decoder = get_codec(codec, path=path).decoder() if codec is not None else None
    size = (await ctx.store.head(path)).size
    if isinstance(dest, os.PathLike):
        return await write_atomically(
            Path(dest),
            lambda file: _stream_into(ctx, path, size, file, chunk_size, decoder),
            path,
            expected_sha256,
        )
    digest = await _stream_into(ctx, path, size, dest, chunk_size, decoder)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise IntegrityMismatchError(path, expected_sha256, digest)
    return digest


async def _stream_into(
    ctx: Context,
    path: str,
    size: int,
    file: BinaryIO,
    chunk_size: int,
    decoder: StreamDecoder | None = None,
) -> str:
    """Copy ``path`` into ``file`` by ranged reads, one range fetched ahead; its digest."""
    hasher = hashlib.sha256()

    def fetch(start: int) -> asyncio.Future[Buffer] | None:
        if start >= size:
            return None
        end = min(start + chunk_size, size)
        return asyncio.ensure_future(ctx.store.get_range(path, start, end))

    upcoming = fetch(0)
    try:
        for start in range(0, size, chunk_size):
            current, upcoming = upcoming, fetch(start + chunk_size)
            assert current is not None
            chunk = await current
            await asyncio.to_thread(_hash_and_write, hasher, file, chunk, decoder)
    finally:
        if upcoming is not None:
            upcoming.cancel()
    return hasher.hexdigest()


def _hash_and_write(
    hasher: hashlib._Hash, file: BinaryIO, chunk: Buffer, decoder: StreamDecoder | None
) -> None:
    if decoder is not None:
        chunk = decoder.decompress(chunk)
    hasher.update(chunk)
    file.write(chunk)


async def write_atomically(
    target: Path,
    fill: Callable[[BinaryIO], Awaitable[str]],
    source: str,
    expected_sha256: str | None,
) -> str:
    """Fill a temporary file beside ``target``; rename it into place only if it verifies."""
    if await asyncio.to_thread(target.is_dir):
        raise InvalidInputError(f"cannot restore {source!r} into {str(target)!r}: a directory")
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
    file = await asyncio.to_thread(open, partial, "xb")
    try:
        try:
            digest = await fill(file)
            await asyncio.to_thread(file.flush)
            await asyncio.to_thread(os.fsync, file.fileno())
        finally:
            file.close()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise IntegrityMismatchError(source, expected_sha256, digest)
        await asyncio.to_thread(os.replace, partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return digest
