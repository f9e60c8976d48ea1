"""Artifact upload: every snapshot, delta and source offset of an uncommitted checkpoint.

A one-phase save (:func:`cairn.protocol._save.save`) merges small artifacts into packs
(:func:`plan_packs`): every artifact whose data is a buffer of fewer than
:data:`PACK_ENTRY_BYTES` goes, in the order of the save's uploads, into a pack of at most
:data:`PACK_BYTES` of the caller's bytes, one object
(:meth:`cairn.format.layout.CheckpointPaths.relative_pack`) whose entries each record their
``offset`` in it. Streams, files and larger buffers keep an object each, and so does
every artifact of the two-phase and reference calls (``save_partitions_concurrent``,
``save_snapshot``, ``save_delta``). So a save of 100,000 partitions of 1 KiB writes two
packs (and its manifest), not 100,000 objects.

Invariants:

* each artifact is hashed exactly once, over the caller's own bytes (before any
  compression), and the digest and size recorded in its entry are those of those bytes;
  buffers are hashed in a worker thread while they travel, streams chunk by chunk; a
  pack's members are hashed one by one in the worker thread that builds the pack (a pack
  has no digest of its own: each range has its own); an object of ranges
  (:mod:`cairn.format.ranges`) is not hashed here: its ranges come with their digests, and its
  entry records the digest of the index written after them;
* a pack is its members' stored bytes one after the other, without gaps or framing;
  with a codec each member is compressed on its own, so each stays readable, and
  verifiable, by one ranged read of its own range; a pack holds at least two members
  (a lone small artifact keeps its own object);
* at most ``max_concurrent_uploads`` uploads are in flight, a pack counting as one (and
  built only once its upload may start, so at most that many packs are held in
  memory); on the first failure no further upload starts, and the failure is raised
  once those in flight have ended;
* nothing here writes a manifest or an intent: an upload is invisible to every reader
  until :mod:`cairn.protocol._commit` commits it, and it runs inside a save that
  :mod:`cairn.protocol._save` began, which holds the checkpoint's lease
  (:mod:`cairn.protocol._lease`);
* no upload replaces an object another save attempt wrote: every name written here
  carries the attempt's own token (:func:`cairn.format.layout.new_attempt`), except the
  reference's ``save_snapshot``/``save_delta`` names, which are written create-only
  (:func:`put_write_once`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from cairn.data.inputs import READ_CHUNK, ArtifactData, StreamSource, as_buffer, check_artifact_data
from cairn.data.keyed import KeyedSnapshot, KeyedUpload, check_keyed
from cairn.errors import (
    ArtifactExistsError,
    CheckpointerError,
    InvalidInputError,
    ObjectExistsError,
)
from cairn.format._buffer import Buffer
from cairn.format.codecs import Codec
from cairn.format.ids import CheckpointId
from cairn.format.integrity import INLINE_HASH_LIMIT, sha256_hex, sha256_hex_async
from cairn.format.layout import CheckpointPaths, validate_name, validate_partition
from cairn.format.manifest import PartitionSnapshotEntry
from cairn.format.ranges import RangeSource, encode_compressed_index, encode_index
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context
from cairn.stores import OpenChunks, capabilities_of

__all__ = [
    "PACK_BYTES",
    "PACK_ENTRY_BYTES",
    "Announce",
    "Entry",
    "PackPlan",
    "PartitionUpload",
    "WriteOnce",
    "check_uploads",
    "discard_attempt",
    "encode_write_once",
    "pack_job",
    "plan_packs",
    "put_write_once",
    "upload_job",
    "upload_partitions",
]

PACK_ENTRY_BYTES = 1024 * 1024
"""A save merges an artifact into a pack when its data is a buffer of fewer bytes than
this (1 MiB): below it, a request per artifact costs more than its bytes take to send."""

PACK_BYTES = 64 * 1024 * 1024
"""The most bytes of the caller's (before compression) one pack holds: 64 MiB. Large
enough that 100,000 artifacts of 1 KiB make two objects, small enough that a pack is
sent as one multipart upload and held in memory, at most ``max_concurrent_uploads`` of
them at a time. Stored compressed, a pack is smaller (by a few bytes of framing per
member larger, for bytes that do not compress)."""

PartitionUpload = tuple[str, int, bool, ArtifactData]
"""``(operator, partition, is_delta, data)`` for ``save_partitions_concurrent``."""

Entry = tuple[str, PartitionSnapshotEntry]
"""``(operator, entry)``: one artifact of a checkpoint, as its manifest lists it."""

Announce = Callable[[int, Entry], None]
"""Told each upload's index and entry as soon as the entry is final (see
:func:`upload_partitions`)."""

log = logging.getLogger("cairn")


async def upload_partitions(
    ctx: Context,
    checkpoint_id: CheckpointId,
    uploads: Sequence[PartitionUpload],
    attempt: str,
    metadata_key: str | None = None,
    announce: Announce | None = None,
) -> list[Entry]:
    """Upload checked ``uploads`` of ``checkpoint_id`` as ``attempt``, at most
    ``max_concurrent_uploads`` at a time; their entries, in order.

    ``announce`` is told each upload's index in ``uploads`` and its entry as soon as the
    entry is final: for an object of ranges put whole (:data:`JOINED_OBJECT_BYTES`), once
    its bytes are joined and before its put is sent; for every other upload, once it has
    ended. An entry announced early names an object that may not be in the store yet,
    or ever (its upload may still fail): whoever commits it waits for the upload first.
    """
    jobs = [
        upload_job(
            ctx,
            checkpoint_id,
            op,
            part,
            is_delta,
            data,
            attempt,
            metadata_key,
            None if announce is None else functools.partial(announce, index),
        )
        for index, (op, part, is_delta, data) in enumerate(uploads)
    ]
    return await bounded_gather(ctx.max_concurrent_uploads, jobs)


@dataclass(frozen=True)
class PackPlan:
    """How a save stores its uploads: ``alone``, each its own object, and ``packs``,
    each a list of members merged into one object (:func:`plan_packs`)."""

    alone: list[PartitionUpload]
    packs: list[list[tuple[PartitionUpload, memoryview]]]


def plan_packs(uploads: Sequence[PartitionUpload]) -> PackPlan:
    """Split checked ``uploads`` into those stored alone and packs (see the module
    docstring): buffers under :data:`PACK_ENTRY_BYTES`, in order, at most
    :data:`PACK_BYTES` per pack; a pack of one member is stored alone."""
    alone: list[PartitionUpload] = []
    packs: list[list[tuple[PartitionUpload, memoryview]]] = []
    current: list[tuple[PartitionUpload, memoryview]] = []
    held = 0
    for upload in uploads:
        buffer = as_buffer(upload[3], f"data for ({upload[0]!r}, {upload[1]})")
        if buffer is None or buffer.nbytes >= PACK_ENTRY_BYTES:
            alone.append(upload)
            continue
        if current and held + buffer.nbytes > PACK_BYTES:
            packs.append(current)
            current, held = [], 0
        current.append((upload, buffer))
        held += buffer.nbytes
    if current:
        packs.append(current)
    alone += [members[0][0] for members in packs if len(members) == 1]
    return PackPlan(alone, [members for members in packs if len(members) > 1])


def pack_job(
    ctx: Context,
    cid: CheckpointId,
    index: int,
    members: Sequence[tuple[PartitionUpload, memoryview]],
    attempt: str,
) -> Callable[[], Awaitable[list[Entry]]]:
    """The upload of pack ``index`` of ``attempt`` holding ``members``, to run under
    :func:`bounded_gather`; the members' entries, in order, each with its offset."""
    relative = CheckpointPaths.relative_pack(index, attempt)
    path = ctx.paths.resolve(cid, relative)
    codec = ctx.codec

    async def job() -> list[Entry]:
        body, entries = await asyncio.to_thread(_build_pack, codec, relative, members)
        await ctx.store.put(path, body)
        return entries

    return job


def _build_pack(
    codec: Codec | None,
    relative: str,
    members: Sequence[tuple[PartitionUpload, memoryview]],
) -> tuple[bytes, list[Entry]]:
    """A pack's bytes and its members' entries: each hashed once, compressed on its own."""
    parts: list[bytes | memoryview] = []
    entries: list[Entry] = []
    offset = 0
    for (operator, partition, is_delta, _), buffer in members:
        stored = codec.compress(buffer) if codec is not None else buffer
        length = memoryview(stored).nbytes
        entry = PartitionSnapshotEntry(
            partition_id=partition,
            is_delta=is_delta,
            path=relative,
            size_bytes=buffer.nbytes,
            sha256=sha256_hex(buffer),
            codec=codec.name if codec is not None else None,
            stored_size_bytes=length if codec is not None else None,
            offset=offset,
        )
        entries.append((operator, entry))
        parts.append(stored)
        offset += length
    return b"".join(parts), entries


async def discard_attempt(
    ctx: Context,
    checkpoint_id: CheckpointId,
    uploads: Sequence[PartitionUpload],
    attempt: str,
    packs: int = 0,
    intent: str | None = None,
) -> None:
    """Best effort: delete the objects ``attempt`` may have written for ``uploads`` (each
    its own object), its ``packs`` packs, and ``intent``, its save's intent (the lease
    ends with the attempt).

    Only names that carry a token of this save's own: no other writer's object can be
    among them.
    """
    paths = [
        ctx.paths.resolve(checkpoint_id, ctx.paths.relative_artifact(op, p, delta, attempt))
        for op, p, delta, _ in uploads
    ]
    paths += [
        ctx.paths.resolve(checkpoint_id, CheckpointPaths.relative_pack(index, attempt))
        for index in range(packs)
    ]
    if intent is not None:
        paths.append(intent)
    try:
        await ctx.store.delete(paths)
    except (CheckpointerError, asyncio.CancelledError) as exc:
        log.info("could not clean up after a failed upload to %s: %s", checkpoint_id, exc)


@dataclass(frozen=True)
class WriteOnce:
    """One partition encoded for the reference's attempt-less name: where it goes, the
    bytes stored there, and its manifest entry."""

    path: str
    stored: bytes | memoryview
    entry: PartitionSnapshotEntry


async def encode_write_once(
    ctx: Context, checkpoint_id: CheckpointId, upload: PartitionUpload
) -> WriteOnce:
    """Hash (and compress) one partition for :func:`put_write_once`, whole in memory: a
    create-only write is one request."""
    operator, partition, is_delta, data = upload
    relative = ctx.paths.relative_artifact(operator, partition, is_delta)
    path = ctx.paths.resolve(checkpoint_id, relative)
    if isinstance(data, RangeSource):
        raise InvalidInputError(
            f"{path!r}: an object of ranges is saved by save_partitions_concurrent, not at "
            "the reference's fixed names"
        )
    codec = ctx.codec
    buffer = as_buffer(data, f"artifact {path!r}")
    if buffer is None:
        encoder = codec.encoder if codec is not None else None
        source = StreamSource(data, encoder=encoder, what=f"artifact {path!r}")
        stored: bytes | memoryview = b"".join([bytes(c) async for c in source.open()])
        digest, size = source.sha256, source.size
    else:
        digest, size = await sha256_hex_async(buffer), buffer.nbytes
        stored = await asyncio.to_thread(codec.compress, buffer) if codec is not None else buffer
    entry = _entry(ctx, partition, is_delta, relative, size, digest, memoryview(stored).nbytes)
    return WriteOnce(path, stored, entry)


async def put_write_once(
    ctx: Context, checkpoint_id: CheckpointId, encoded: WriteOnce
) -> PartitionSnapshotEntry:
    """Write one partition to the reference's attempt-less name, create-only.

    The name is fixed (``paths.snapshot``/``paths.delta``), so it is written only if
    absent: a second writer of the same id cannot replace bytes a committed manifest
    names. A name that already holds exactly these bytes (a retried write whose reply
    was lost) counts as written, other bytes raise :class:`ArtifactExistsError`.
    """
    try:
        await ctx.store.put(encoded.path, encoded.stored, mode="create")
    except ObjectExistsError:
        existing = await ctx.store.get(encoded.path)
        if bytes(existing.data) != bytes(encoded.stored):
            raise ArtifactExistsError(str(checkpoint_id), encoded.path) from None
    return encoded.entry


def _entry(
    ctx: Context,
    partition: int,
    is_delta: bool,
    relative: str,
    size: int,
    digest: str,
    stored_size: int | None,
) -> PartitionSnapshotEntry:
    """The manifest entry of one uploaded artifact (stored size only when compressed)."""
    codec = ctx.codec
    return PartitionSnapshotEntry(
        partition_id=partition,
        is_delta=is_delta,
        path=relative,
        size_bytes=size,
        sha256=digest,
        codec=codec.name if codec is not None else None,
        stored_size_bytes=stored_size if codec is not None else None,
    )


def upload_job(
    ctx: Context,
    cid: CheckpointId,
    operator: str,
    partition: int,
    is_delta: bool,
    data: ArtifactData,
    attempt: str,
    metadata_key: str | None = None,
    announce: Callable[[Entry], None] | None = None,
) -> Callable[[], Awaitable[Entry]]:
    """The upload of one partition's artifact, to run under :func:`bounded_gather`.

    Its name carries ``attempt``, the token of the save attempt it belongs to.
    ``announce`` is told its entry once it is final (see :func:`upload_partitions`).
    """
    relative = ctx.paths.relative_artifact(operator, partition, is_delta, attempt)
    path = ctx.paths.resolve(cid, relative)
    if isinstance(data, KeyedSnapshot):
        data = data.uploaded_in(cid)  # less the groups this save carries from its parent
    if isinstance(data, RangeSource):
        return _ranges_job(
            ctx, path, operator, partition, is_delta, relative, data, metadata_key, announce
        )
    buffer = as_buffer(data, f"artifact {path!r}")
    codec = ctx.codec

    async def job() -> Entry:
        stored_size: int | None = None
        if buffer is None:
            encoder = codec.encoder if codec is not None else None
            source = StreamSource(data, encoder=encoder, what=f"artifact {path!r}")
            digest = await _upload_stream(ctx, path, source, metadata_key)
            size, stored_size = source.size, source.stored_size
        elif codec is not None:
            digest, stored_size = await _upload_compressed(ctx, path, buffer, metadata_key)
            size = buffer.nbytes
        else:
            digest, size = await _upload_buffer(ctx, path, buffer, metadata_key), buffer.nbytes
        made = operator, _entry(ctx, partition, is_delta, relative, size, digest, stored_size)
        if announce is not None:
            announce(made)
        return made

    return job


COALESCE_BELOW = 128 * 1024
"""Ranges smaller than this are copied together into chunks of up to READ_CHUNK bytes;
larger ones are sent from their own memory. Each chunk handed to obstore has a fixed
cost, so below this size a copy is cheaper than a chunk of its own, and above it the
copy costs more (``bench/bench_range_chunks.py`` measures both)."""


def _ranges_job(
    ctx: Context,
    path: str,
    operator: str,
    partition: int,
    is_delta: bool,
    relative: str,
    source: RangeSource,
    metadata_key: str | None,
    announce: Callable[[Entry], None] | None,
) -> Callable[[], Awaitable[Entry]]:
    """The upload of an object of ranges (:mod:`cairn.format.ranges`): its ranges, then their
    index, in one write (see :func:`_put_ranges`); stored as the source gives them (each
    range a frame of the source's codec, if it has one), whatever the checkpointer's.
    Its entry is final, and told to ``announce``, once the pass that is sent has ended:
    before the put of a joined object, after the upload of a streamed one."""
    # ``metadata_key`` is not used: an object of ranges carries no digest of its whole
    # bytes; its entry's digest is its index's, and a two-phase commit checks the index
    # (see cairn.integrations.distributed).
    del metadata_key
    if is_delta and isinstance(source, KeyedUpload):
        raise InvalidInputError(f"{path!r}: a KeyedSnapshot is saved as a snapshot, not a delta")
    recorded: list[tuple[int, int, str]] = []  # stored length, decoded length, digest
    codec = source.codec

    def index() -> bytes:
        if codec is None:
            return encode_index([(length, digest) for length, _, digest in recorded])
        return encode_compressed_index(recorded, codec)

    async def chunks() -> AsyncIterator[Buffer]:
        recorded.clear()  # what the last attempt sent is what the index describes
        small = bytearray()  # small ranges, coalesced: a chunk per range would cost a call each
        async for piece in source.open():
            view = memoryview(piece.data).cast("B")
            if (piece.decoded_size is None) != (codec is None):
                raise InvalidInputError(
                    f"{path!r}: a range of {view.nbytes} bytes "
                    + ("has a decoded size" if codec is None else f"is not marked {codec}")
                    + f" in an object of {codec or 'uncompressed'} ranges"
                )
            decoded = view.nbytes if piece.decoded_size is None else piece.decoded_size
            recorded.append((view.nbytes, decoded, piece.sha256))
            if view.nbytes < COALESCE_BELOW:
                small += view
                if len(small) < READ_CHUNK:
                    continue
            if small:
                # Handed on, never refilled: the store may still hold it after the next ask.
                coalesced, small = small, bytearray()
                yield coalesced
                del coalesced
                if view.nbytes < COALESCE_BELOW:
                    continue
            for start in range(0, view.nbytes, READ_CHUNK):
                yield view[start : start + READ_CHUNK]
            del view, piece
        yield small + index()

    def entry() -> Entry:
        encoded = index()
        return operator, PartitionSnapshotEntry(
            partition_id=partition,
            is_delta=is_delta,
            path=relative,
            size_bytes=sum(length for length, _, _ in recorded) + len(encoded),
            sha256=sha256_hex(encoded),
            index_size_bytes=len(encoded),
            key_groups=source.record if isinstance(source, KeyedUpload) else None,
        )

    async def job() -> Entry:
        final: list[Entry] = []

        def joined() -> None:
            final.append(entry())
            if announce is not None:
                announce(final[0])

        await _put_ranges(ctx, path, chunks, joined)
        if not final:  # streamed: its last pass is the one stored
            joined()
        return final[0]

    return job


JOINED_OBJECT_BYTES = 24 << 20
"""An object of ranges of at most this many bytes is joined in memory and written with
the store's ``put``; a larger one streams (``put_stream``: a multipart upload of 8 MiB
parts, as many in flight as the adapter's controller allows). A small object is then
one request, where a stream begins and completes a multipart upload around its one part
(two more requests, and two more round trips one after another); obstore sends a
``put`` of more than 5 MiB as a multipart upload of 5 MiB parts, all in flight at once.
With a save's objects going several at once (``max_concurrent_uploads``), that keeps
more connections busy than one object's parts would (``bench/bench_link.py``)."""


async def _put_ranges(
    ctx: Context, path: str, open_chunks: OpenChunks, joined: Callable[[], None]
) -> None:
    """Store the chunks ``open_chunks`` gives at ``path``: joined, with one ``put``, when
    they add up to at most :data:`JOINED_OBJECT_BYTES` (``joined()`` is called once they
    are, before the put), else a streamed upload that goes on from the chunks read so
    far (a retry of it opens a fresh pass). A local directory takes the stream as it
    comes: a file has no parts, and the chunks need no joining."""
    if capabilities_of(ctx.store).local_path is not None:
        await ctx.store.put_stream(path, open_chunks)
        return
    stream = open_chunks()
    held: list[Buffer] = []
    size = 0
    async for chunk in stream:
        held.append(chunk)
        size += memoryview(chunk).nbytes
        if size > JOINED_OBJECT_BYTES:
            break
    else:
        body = held[0] if len(held) == 1 else b"".join(held)
        del held
        joined()
        await ctx.store.put(path, body)
        return
    first_pass: list[AsyncIterator[Buffer]] = [_resumed(held, stream)]
    del held

    def chunks_of_attempt() -> AsyncIterator[Buffer]:
        return first_pass.pop() if first_pass else open_chunks()

    try:
        await ctx.store.put_stream(path, chunks_of_attempt)
    finally:
        for unused in first_pass:  # no attempt started: let the source end its pass
            await _close(unused)


async def _resumed(held: list[Buffer], rest: AsyncIterator[Buffer]) -> AsyncIterator[Buffer]:
    """The chunks ``held``, then those ``rest`` still gives (closed when this ends)."""
    try:
        while held:
            yield held.pop(0)
        async for chunk in rest:
            yield chunk
    finally:
        await _close(rest)


async def _close(chunks: AsyncIterator[Buffer]) -> None:
    """End ``chunks``' pass, if it is a generator that can be closed."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()


async def _upload_compressed(
    ctx: Context, path: str, data: memoryview, metadata_key: str | None
) -> tuple[str, int]:
    """Compress and hash one buffer in threads, then upload it; (digest, stored size)."""
    assert ctx.codec is not None
    digest, stored = await asyncio.gather(
        sha256_hex_async(data), asyncio.to_thread(ctx.codec.compress, data)
    )
    metadata = {metadata_key: digest} if metadata_key is not None else None
    await ctx.store.put(path, stored, metadata=metadata)
    return digest, len(stored)


async def _upload_buffer(
    ctx: Context, path: str, data: memoryview, metadata_key: str | None
) -> str:
    """Upload one buffer; returns its digest."""
    if metadata_key is None and data.nbytes > INLINE_HASH_LIMIT:
        # Hash in a thread while the bytes travel.
        digest, _ = await asyncio.gather(sha256_hex_async(data), ctx.store.put(path, data))
    elif metadata_key is None:
        # Small: hashing inline is cheaper than the two tasks gather would create.
        digest = sha256_hex(data)
        await ctx.store.put(path, data)
    else:  # the digest must be known before the request: it goes in its headers
        digest = await sha256_hex_async(data)
        await ctx.store.put(path, data, metadata={metadata_key: digest})
    return digest


async def _upload_stream(
    ctx: Context, path: str, source: StreamSource, metadata_key: str | None
) -> str:
    """Upload a file or stream in parts, hashing each chunk; returns its digest."""
    metadata = None
    if metadata_key is not None:
        if not source.reopenable:
            raise InvalidInputError(
                f"{path!r}: a one-shot stream cannot carry its digest as metadata "
                "(it is needed before the upload starts): pass bytes or a file"
            )
        async for _ in source.open():  # a first pass, only to learn the digest
            pass
        metadata = {metadata_key: source.sha256}
    await ctx.store.put_stream(path, source.open, metadata=metadata)
    return source.sha256


def check_uploads(uploads: Sequence[PartitionUpload]) -> list[PartitionUpload]:
    """``uploads`` checked before any I/O: names, partitions, data, no duplicates."""
    checked: list[PartitionUpload] = []
    seen: set[tuple[str, int, bool]] = set()
    for item in uploads:
        if not isinstance(item, tuple) or len(item) != 4:
            raise InvalidInputError(
                f"each upload is (operator, partition, is_delta, data), got {item!r}"
            )
        operator, partition, is_delta, data = item
        validate_name("operator", operator)
        validate_partition(partition)
        if not isinstance(is_delta, bool):
            raise InvalidInputError(f"is_delta must be a bool, got {is_delta!r}")
        check_artifact_data(f"data for ({operator!r}, {partition})", data)
        if (operator, partition, is_delta) in seen:
            raise InvalidInputError(f"({operator!r}, {partition}) is uploaded twice")
        seen.add((operator, partition, is_delta))
        checked.append(item)
    check_keyed(checked)
    return checked
