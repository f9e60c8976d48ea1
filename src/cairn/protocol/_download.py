"""Downloads: loading checkpoints and chains, and streamed restore to files.

Each artifact is read as :mod:`cairn.protocol._read` reads one: bounded by what its
entry records, decoded, and verified (see its invariants). Invariants of the downloads:

* a :func:`load` with ``progress`` reads an uncompressed artifact over
  :data:`LOAD_PART_BYTES` in ranged parts of that size, one after the other, the last
  one plus one byte, so that progress advances as they arrive: the same bytes, the same
  checks as one read of its recorded size;
* :func:`load` reads the ranges it needs of one pack with few requests: ranges that lie
  close together (at most :data:`SPAN_GAP_BYTES` apart) are read as one span of at most
  :data:`SPAN_BYTES`, then cut into each entry's bytes, each decoded and verified on its
  own, so a damaged range fails only as itself (a pack that ends inside a span fails
  the ranges it does not hold whole, not the span); a read of one partition
  (:func:`load_chain`) reads its own ranges alone;
* at most ``max_concurrent_downloads`` reads are in flight (a span counts as one);
* an artifact a chain needs that is gone is a :class:`BrokenChainError` naming it; bytes
  that do not hash as recorded are an :class:`IntegrityMismatchError` naming it, bytes
  that do not decode an :class:`UndecodableArtifactError`; each also names the operator
  and partition whose link it is (:meth:`~cairn.errors.IntegrityError.located`);
* damage does not stop a :func:`load`: every link is read and checked, then the first
  damaged partition's error is raised with the others' in its ``others`` (a store
  failure is raised as it comes);
* a streamed restore holds a bounded number of chunks in memory (those fetched ahead,
  one being written, at most two being hashed; compressed, one being decoded and one
  decoded piece of at most ``chunk_size``); to a path, the final name appears only once
  the bytes are fsynced and verified (a mismatch leaves nothing there).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import os
import stat
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from cairn.data import ArtifactKey, ChainLink, LoadedCheckpoint
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidInputError,
)
from cairn.format._buffer import Buffer
from cairn.format._validate import positive_int
from cairn.format.codecs import Codec, get_codec
from cairn.format.ids import CheckpointId
from cairn.format.integrity import StreamHasher, off_loop_if_large
from cairn.format.layout import validate_name, validate_partition
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.format.ranges import group_spans
from cairn.protocol import _catalog, _chains, _read
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context
from cairn.stores._localfs import LinkRefused, atomic_file_at, run_to_end

__all__ = [
    "RESTORE_CHUNK",
    "load",
    "load_artifact_to",
    "load_chain",
    "stream_into",
    "verify",
    "write_atomically",
]


RESTORE_CHUNK = 1024 * 1024
"""Bytes per ranged read of a streamed restore (``load_artifact_to``'s ``chunk_size``).

Smaller than READ_CHUNK on purpose: each range is a fresh buffer the store allocates on
its own threads, and glibc keeps freed 8 MiB blocks in those threads' arenas, so 8 MiB
ranges cost a restore several times the peak memory 1 MiB ranges cost
(``bench/bench_stream.py`` measures both). The price is a store call per MiB, and more
CPU per byte on a local store. The restore fetches several ranges ahead
(:data:`RANGE_BYTES_AHEAD`), so a remote store's latency stays hidden."""


RANGE_BYTES_AHEAD = 4 * 1024 * 1024
"""A streamed restore fetches this many bytes of ranges ahead of the one it writes (at
least one range, at most MAX_RANGES_AHEAD): enough to keep a remote store's latency out of
the way with small ranges, without holding more than needed with large ones."""


MAX_RANGES_AHEAD = 8


SPAN_BYTES = 8 * 1024 * 1024
"""The most bytes :func:`load` reads of a pack in one request (8 MiB, the size of a read
chunk elsewhere): the ranges of many small artifacts, read together."""


SPAN_GAP_BYTES = 64 * 1024
"""The most bytes between two ranges of a pack that :func:`load` reads through, unused,
to read both with one request (a pack carried from an earlier checkpoint may hold ranges
this one does not need): less than the bytes a request costs in time on a remote store."""


LOAD_PART_BYTES = 32 * 1024 * 1024
"""A :func:`load` with ``progress`` reads an uncompressed artifact larger than this in
ranged parts of this size, one after the other (the read counts as one of the
``max_concurrent_downloads``), and reports each part once it arrived: a progress bar
over one large artifact moves while it is read. Large enough that a part's request
costs little beside its bytes on a remote store."""


_Link = tuple[ArtifactKey, CheckpointId, PartitionSnapshotEntry]
"""One link of a restore chain: the partition it rebuilds, its owner, its entry."""


async def load(
    ctx: Context,
    checkpoint_id: CheckpointId,
    verify: bool,
    progress: Callable[[int], None] | None = None,
) -> LoadedCheckpoint:
    """A committed checkpoint with every artifact of every chain, verified; ``progress``
    is called with each artifact's size (decoded) once it is read and verified, or, for
    an uncompressed one over :data:`LOAD_PART_BYTES`, with each part's as it arrives
    (the calls add up to the same total; a part is reported once its read succeeded,
    so a retried read is never counted twice).

    Damaged partitions do not stop the others from being read and checked: the
    :class:`~cairn.errors.IntegrityError` raised is the first damaged partition's (in
    the manifest's order), naming it, with every other one's in its ``others``.
    """
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    resolved = await _chains.resolve_chains(ctx, manifest)
    links = [(key, owner, entry) for key, chain in resolved.items() for owner, entry in chain]
    blobs = await _fetch_links(ctx, links, verify, progress)
    chains: dict[ArtifactKey, list[ChainLink]] = {}
    for (key, owner, entry), blob in zip(links, blobs, strict=True):
        chains.setdefault(key, []).append(ChainLink(entry=entry, owner=owner, data=blob))
    return LoadedCheckpoint(
        manifest=manifest,
        artifacts={key: links[-1].data for key, links in chains.items()},
        source_offsets=dict(manifest.source_offsets),
        chains=chains,
        directories={(d.operator, d.partition_id): list(d.files) for d in manifest.directories},
    )


async def verify(ctx: Context, checkpoint_id: CheckpointId) -> CheckpointManifest:
    """What :func:`load` reads and checks of ``checkpoint_id``, the same reads and the
    same errors, with each artifact's bytes dropped once verified: memory holds the
    reads in flight, not the checkpoint. Returns its manifest."""
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    resolved = await _chains.resolve_chains(ctx, manifest)
    links = [(key, owner, entry) for key, chain in resolved.items() for owner, entry in chain]
    await _fetch_links(ctx, links, True, None, keep=False)
    return manifest


async def load_chain(
    ctx: Context, checkpoint_id: CheckpointId, operator: str, partition: int
) -> list[ChainLink]:
    """The verified links that rebuild one partition: base snapshot, then deltas in order.

    Only this partition's bytes are read (for an artifact in a pack, its range alone),
    so damage elsewhere in the checkpoint, in the same pack too, does not touch it."""
    key = (validate_name("operator", operator), validate_partition(partition))
    manifest = await _catalog.load_partition_manifest(ctx, checkpoint_id, operator, partition)
    resolved = await _chains.resolve_chains(ctx, manifest)
    if key not in resolved:
        raise CheckpointNotFoundError(
            ctx.paths.checkpoint_dir(checkpoint_id), f"partition {key!r} in checkpoint"
        )
    links = resolved[key]
    blobs = await bounded_gather(
        ctx.max_concurrent_downloads,
        [_fetch_link(ctx, (key, owner, entry), True) for owner, entry in links],
    )
    return [
        ChainLink(entry=entry, owner=owner, data=blob)
        for (owner, entry), blob in zip(links, blobs, strict=True)
    ]


async def _fetch_links(
    ctx: Context,
    links: list[_Link],
    verify: bool,
    progress: Callable[[int], None] | None,
    *,
    keep: bool = True,
) -> list[Buffer]:
    """Every link's bytes, verified, in order: the ranges of one pack read in spans
    (:func:`cairn.format.ranges.group_spans`), every other link with a request of its own; all
    of them at most ``max_concurrent_downloads`` at a time. Unless ``keep``, each read's
    bytes are dropped once verified (and empty bytes returned in their place).

    A link whose bytes are damaged or gone does not stop the others: once all are read,
    the first damaged one's :class:`IntegrityError` (naming its partition) is raised,
    the others' in its ``others``. A store failure stops the reads as it comes.
    """
    damage: list[tuple[int, IntegrityError]] = []
    jobs: list[Callable[[], Awaitable[list[tuple[int, Buffer]]]]] = []
    packed: dict[str, list[tuple[int, _Link]]] = {}
    for index, link in enumerate(links):
        _, owner, entry = link
        if entry.offset is None:
            jobs.append(_alone(index, _fetch_link(ctx, link, verify, progress), damage))
        else:
            path = ctx.paths.resolve(owner, entry.path)
            packed.setdefault(path, []).append((index, link))
    for path, members in packed.items():
        spans = group_spans(members, _extent, SPAN_BYTES, SPAN_GAP_BYTES)
        jobs += [_fetch_span(ctx, path, span, verify, progress, damage) for span in spans]
    if not keep:
        jobs = [_dropping(job) for job in jobs]
    found: list[Buffer] = [b""] * len(links)
    for results in await bounded_gather(ctx.max_concurrent_downloads, jobs):
        for index, data in results:
            found[index] = data
    if damage:
        damage.sort(key=lambda failure: failure[0])
        first = damage[0][1]
        first.others = tuple(error for _, error in damage[1:])
        raise first
    return found


def _dropping(
    job: Callable[[], Awaitable[list[tuple[int, Buffer]]]],
) -> Callable[[], Awaitable[list[tuple[int, Buffer]]]]:
    """``job``, its bytes dropped as soon as it ends (its damage is recorded as before)."""

    async def run() -> list[tuple[int, Buffer]]:
        return [(index, b"") for index, _ in await job()]

    return run


def _alone(
    index: int,
    job: Callable[[], Awaitable[Buffer]],
    damage: list[tuple[int, IntegrityError]],
) -> Callable[[], Awaitable[list[tuple[int, Buffer]]]]:
    """``job`` as one of :func:`_fetch_links`: its result at ``index``, or its damage
    added to ``damage``."""

    async def run() -> list[tuple[int, Buffer]]:
        try:
            return [(index, await job())]
        except IntegrityError as exc:
            damage.append((index, exc))
            return []

    return run


def _extent(member: tuple[int, _Link]) -> tuple[int, int]:
    """Where a pack member's stored bytes lie in its pack: (offset, length)."""
    entry = member[1][2]
    return entry.offset or 0, entry.stored_length


def _fetch_span(
    ctx: Context,
    path: str,
    span: list[tuple[int, _Link]],
    verify: bool,
    progress: Callable[[int], None] | None,
    damage: list[tuple[int, IntegrityError]],
) -> Callable[[], Awaitable[list[tuple[int, Buffer]]]]:
    """One read of the pack at ``path`` covering ``span``'s ranges, then each range
    decoded and verified on its own (all of them in one worker thread): the bytes of
    those that verify, while each that does not (damaged, or past the end of a pack
    shorter than its manifest says) is added to ``damage``, naming its partition."""
    start = min(entry.offset or 0 for _, (_, _, entry) in span)
    end = max((entry.offset or 0) + entry.stored_length for _, (_, _, entry) in span)
    keys = {index: key for index, (key, _, _) in span}

    async def job() -> list[tuple[int, Buffer]]:
        try:
            data = await _read.read_at_most(ctx.store, path, start, end - start)
        except CheckpointNotFoundError:
            for index, (key, owner, _) in span:
                gone = BrokenChainError(path, f"artifact of checkpoint {owner} is gone")
                damage.append((index, gone.located(*key)))
            return []
        view = memoryview(data) if data is not None else None
        pieces: list[tuple[int, PartitionSnapshotEntry, memoryview]] = []
        for index, (key, _, entry) in span:
            try:
                pieces.append((index, entry, _read.cut(path, view, start, entry)))
            except IntegrityError as exc:
                damage.append((index, exc.located(*key)))
        found, damaged = await asyncio.to_thread(_read.decode_each, path, pieces, verify)
        damage.extend((index, exc.located(*keys[index])) for index, exc in damaged)
        if progress is not None:
            for _, piece in found:
                progress(memoryview(piece).nbytes)
        return found

    return job


def _fetch_link(
    ctx: Context,
    link: _Link,
    verify: bool,
    progress: Callable[[int], None] | None = None,
) -> Callable[[], Awaitable[Buffer]]:
    """A read of ``link``'s bytes alone, verified when ``verify``; damage to them is an
    :class:`IntegrityError` naming its partition."""
    key, owner, entry = link
    path = ctx.paths.resolve(owner, entry.path)

    in_parts = progress is not None and entry.codec is None and entry.size_bytes > LOAD_PART_BYTES

    async def job() -> Buffer:
        try:
            if in_parts:
                assert progress is not None
                stored = await _read_in_parts(ctx, path, entry.size_bytes, progress)
                return await off_loop_if_large(stored, _read.decoded, path, stored, entry, verify)
            data = await _read.read_entry(ctx.store, path, entry, verify)
        except CheckpointNotFoundError:
            gone = BrokenChainError(path, f"artifact of checkpoint {owner} is gone")
            raise gone.located(*key) from None
        except IntegrityError as exc:
            exc.located(*key)
            raise
        if progress is not None:
            progress(memoryview(data).nbytes)
        return data

    return job


async def _read_in_parts(
    ctx: Context, path: str, size: int, progress: Callable[[int], None]
) -> Buffer:
    """:func:`cairn.protocol._read.read_sized` of ``size`` bytes at ``path``, in ranged
    parts of :data:`LOAD_PART_BYTES` read in turn (the last one asks for one byte more,
    as that function does), ``progress`` called with each part's bytes once it is in
    place. A part the store retries (:class:`~cairn.stores.retry.RetryingStore`) is
    reported once, after its read succeeded."""
    whole = bytearray(size)
    view = memoryview(whole)
    for start in range(0, size, LOAD_PART_BYTES):
        end = min(start + LOAD_PART_BYTES, size)
        if end < size:
            data = await _read.read_range(ctx.store, path, start, end - start)
        else:
            data = await _read.read_sized(ctx.store, path, size, start)
        view[start:end] = memoryview(data).cast("B")
        progress(end - start)
    return whole


async def load_artifact_to(
    ctx: Context,
    path: str,
    dest: os.PathLike[str] | BinaryIO,
    expected_sha256: str | None,
    chunk_size: int,
    codec: str | None,
    progress: Callable[[int], None] | None = None,
) -> str:
    """Stream the object at ``path`` into ``dest``; its SHA-256 (see the façade's docs)."""
    positive_int("chunk_size", chunk_size)
    decoding = get_codec(codec, path=path) if codec is not None else None
    size = (await ctx.store.head(path)).size
    if isinstance(dest, os.PathLike):
        return await write_atomically(
            Path(dest),
            lambda file: _stream_into(ctx, path, size, file, chunk_size, decoding, progress),
            path,
            expected_sha256,
        )
    digest = await _stream_into(ctx, path, size, dest, chunk_size, decoding, progress)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise IntegrityMismatchError(path, expected_sha256, digest)
    return digest


async def _stream_into(
    ctx: Context,
    path: str,
    size: int,
    file: BinaryIO,
    chunk_size: int,
    codec: Codec | None = None,
    progress: Callable[[int], None] | None = None,
) -> str:
    """Copy ``path`` into ``file`` by ranged reads; the digest of what was written.
    ``progress`` is called with the stored bytes of each range once it is handed on.

    Three stages overlap: the next ranges are fetched (RANGE_BYTES_AHEAD of them) while
    the current one is hashed (on the hasher's thread) and written (on another), so a
    restore takes about as long as its slowest stage rather than their sum. Writes stay
    in order, one at a time; none is in flight once this returns or raises (the caller
    closes the file then). With ``codec``, each range is decoded on a worker thread that
    also hashes and writes each decoded piece (at most ``chunk_size`` bytes) as it comes:
    one range can decode to far more than fits in memory.
    """
    hasher = StreamHasher(lag=1)
    decoded = hashlib.sha256()

    def take(piece: bytes) -> None:
        decoded.update(piece)
        file.write(piece)

    decoder = (
        codec.decoder(take, path=path, limit=None, piece_size=chunk_size)
        if codec is not None
        else None
    )
    writing: asyncio.Task[int] | None = None
    starts = iter(range(0, size, chunk_size))
    ahead = max(1, min(MAX_RANGES_AHEAD, RANGE_BYTES_AHEAD // chunk_size))
    upcoming: collections.deque[asyncio.Future[Buffer]] = collections.deque()

    def fetch() -> None:
        for start in itertools.islice(starts, ahead - len(upcoming)):
            end = min(start + chunk_size, size)
            upcoming.append(asyncio.ensure_future(ctx.store.get_range(path, start, end)))

    try:
        fetch()
        while upcoming:
            chunk = await upcoming.popleft()
            fetch()
            if progress is not None:
                progress(memoryview(chunk).nbytes)
            if decoder is not None:
                await asyncio.to_thread(decoder.feed, chunk)
                del chunk
                continue
            await hasher.feed(chunk)
            if writing is not None:
                await writing
            writing = asyncio.ensure_future(asyncio.to_thread(file.write, chunk))
            del chunk
        if writing is not None:
            await writing
        return decoded.hexdigest() if decoder is not None else await hasher.hexdigest()
    finally:
        for future in upcoming:  # reads are safe to drop; a failed one was not this one's cause
            if future.done() and not future.cancelled():
                future.exception()
            future.cancel()
        if writing is not None and not writing.done():
            await asyncio.wait([writing])
        hasher.close()


stream_into = _stream_into
"""Copy an object into an open file by ranged reads; the digest of what was written."""


async def write_atomically(
    target: Path,
    fill: Callable[[BinaryIO], Awaitable[str]],
    source: str,
    expected_sha256: str | None,
) -> str:
    """Fill a temporary file beside ``target``; rename it into place only if it verifies.

    Written as every local file is (:func:`cairn.stores._localfs.atomic_file_at`): relative to
    the descriptor of ``target``'s directory, fsynced before the rename, the directory
    after it. A directory at ``target`` is refused, and so is a symbolic link, which is
    neither followed nor replaced.
    """
    refused = f"cannot restore {source!r} into {str(target)!r}"
    try:
        staged = atomic_file_at(target.parent, [target.name], _partial_name)
        with staged as (file, dirs), os.fdopen(file.fd, "wb", closefd=False) as handle:
            if _is_dir_at(dirs.fds[-1], target.name):
                raise InvalidInputError(f"{refused}: a directory")
            digest = await fill(handle)
            await run_to_end(handle.flush)
            if expected_sha256 is not None and digest != expected_sha256.lower():
                raise IntegrityMismatchError(source, expected_sha256, digest)
            await run_to_end(file.commit, dirs.fds[-1:])
    except LinkRefused:
        raise InvalidInputError(f"{refused}: a symbolic link (never followed)") from None
    return digest


def _partial_name(name: str) -> str:
    return f".{name}.{uuid.uuid4().hex}.partial"


def _is_dir_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False
