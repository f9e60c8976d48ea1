"""Reading one artifact: bounded by what its entry records, and verified.

Every read of a stored artifact goes through here: a checkpoint's links
(:mod:`cairn.protocol._download`), a copy's stored bytes (:mod:`cairn.protocol.copy`),
the integrations' reads (:mod:`cairn.integrations._interface`). A read needs the store
alone. Invariants:

* every byte handed out is verified against the SHA-256 its entry records (unless the
  caller asks not to), after decompression; large buffers in a worker thread, small
  ones inline (a thread hop costs more than their hash); an object of ranges
  (:mod:`cairn.format.ranges`) is handed out as stored, index included, once its index
  and every range verify;
* no read of an artifact an entry describes holds more than the entry records: its
  stored bytes are read in one request of their recorded size (``size_bytes``, or
  ``stored_size_bytes`` when compressed) plus one byte, so an object of any other length
  is an :class:`IntegrityMismatchError` on the size, also unverified; and they are
  decoded by the bounded decoder of :mod:`cairn.format.codecs`, which stops as soon as
  the output passes ``size_bytes`` (holding at most that plus one piece) with an
  :class:`OversizedArtifactError` naming the artifact: a decompression bomb;
* an entry with an ``offset`` (a range of a pack, see :mod:`cairn.format.manifest`) is
  read with one ranged request of exactly its stored length from its offset: fewer
  bytes (a pack shorter than the manifest says) are an :class:`IntegrityMismatchError`
  on the size; its bytes are decoded and verified on their own, like a whole object's;
* a whole pack is read (for a copy, byte for byte) only up to what a pack can hold, and
  handed out once every range named in it verifies (:func:`read_pack`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cairn.errors import (
    CheckpointNotFoundError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidInputError,
    StoreError,
)
from cairn.format._buffer import Buffer
from cairn.format.codecs import get_codec
from cairn.format.integrity import off_loop_if_large, verify_integrity, verify_integrity_async
from cairn.format.manifest import PartitionSnapshotEntry
from cairn.format.ranges import verify_ranges
from cairn.protocol import _upload
from cairn.stores import Store

__all__ = [
    "cut",
    "decode_each",
    "decoded",
    "load_artifact",
    "read_at_most",
    "read_entry",
    "read_pack",
    "read_range",
    "read_sized",
    "read_stored",
]


async def load_artifact(store: Store, path: str, expected_sha256: str | None) -> Buffer:
    """The bytes at store ``path``, verified against ``expected_sha256`` when given."""
    if not isinstance(path, str) or not path:
        raise InvalidInputError(f"artifact path must be a non-empty string, got {path!r}")
    blob = await store.get(path)
    if expected_sha256 is not None:
        await verify_integrity_async(path, blob.data, expected_sha256)
    return blob.data


async def read_sized(store: Store, path: str, size: int, start: int = 0) -> Buffer:
    """The bytes at ``path`` from ``start`` on, the object being exactly ``size`` bytes,
    in one request.

    A GET is two round trips through obstore (the response, then its body), a ranged
    read one: with many small artifacts that halves the calls. Asking for one byte more
    than expected tells a longer object from the right one, so nothing is hidden that a
    whole read would have shown, and no more than that byte is read: any other length
    is an :class:`IntegrityMismatchError` on the size. With nothing to read (an empty
    object, or ``start`` at its size) a HEAD checks the size: an empty range reads
    nothing.
    """
    if size == start:
        got = (await store.head(path)).size
        if got != size:
            raise IntegrityMismatchError(path, str(size), str(got), what="size")
        return b""
    data = await store.get_range(path, start, size + 1)
    got = start + memoryview(data).nbytes
    if got != size:
        if got > size:  # longer than written: its whole length, for the error, from a HEAD
            got = max(got, (await store.head(path)).size)
        raise IntegrityMismatchError(path, str(size), str(got), what="size")
    return data


async def read_range(store: Store, path: str, offset: int, length: int) -> Buffer:
    """Exactly ``length`` bytes from ``offset`` of the object at ``path``, in one request.

    An object that ends before ``offset + length`` (the store returns fewer bytes, or
    refuses a range that starts past its end) is an :class:`IntegrityMismatchError` on
    the size of that range; an empty range checks by a HEAD that the object reaches
    ``offset``.
    """
    what = f"size of bytes {offset}..{offset + length}"
    data = await read_at_most(store, path, offset, length)
    if data is None:
        ends = " (the object ends before)" if length == 0 else ""
        raise IntegrityMismatchError(path, str(length), "0", what=what + ends)
    got = memoryview(data).nbytes
    if got != length:
        raise IntegrityMismatchError(path, str(length), str(got), what=what)
    return data


async def read_at_most(store: Store, path: str, offset: int, length: int) -> Buffer | None:
    """The ``length`` bytes from ``offset`` of the object at ``path``, in one request, or
    fewer where the object ends before ``offset + length``; None where it ends before
    ``offset`` (an empty range is checked by a HEAD)."""
    if length == 0:
        return b"" if (await store.head(path)).size >= offset else None
    try:
        return await store.get_range(path, offset, offset + length)
    except CheckpointNotFoundError:
        raise
    except StoreError:
        # A store refuses a range that starts at or past the object's end: is that it?
        size = (await store.head(path)).size
        if size > offset:
            raise
        return b"" if size == offset else None


async def read_stored(store: Store, path: str, entry: PartitionSnapshotEntry) -> Buffer:
    """The bytes of ``entry`` at ``path`` as stored (compressed, if it is), which must be
    the size it records (:func:`read_sized`); for an entry with an offset, its range of
    the pack (:func:`read_range`)."""
    if entry.offset is not None:
        return await read_range(store, path, entry.offset, entry.stored_length)
    if entry.codec is None:
        return await read_sized(store, path, entry.size_bytes)
    if entry.stored_size_bytes is None:  # a hand-made entry: the decoder still bounds it
        return (await store.get(path)).data
    return await read_sized(store, path, entry.stored_size_bytes)


async def read_pack(store: Store, path: str, entries: Sequence[PartitionSnapshotEntry]) -> Buffer:
    """The whole object at ``path``, a pack, as stored; first every range of it that
    ``entries`` (entries with offsets, all at ``path``) describe is decoded and verified.

    For copying a pack once, byte for byte: a range that runs past the object's end is
    an :class:`IntegrityMismatchError` on the size, bytes that do not hash as recorded
    an :class:`IntegrityMismatchError`; bytes no entry names are copied unverified (no
    digest covers them). No manifest records a pack's own size, so the read is bounded
    by what a pack can hold: twice :data:`~cairn.protocol._upload.PACK_BYTES`, or the end of the
    furthest range if that is more; a longer object is a size mismatch, read no further.
    """
    if any(entry.offset is None for entry in entries):
        raise InvalidInputError(f"read_pack of {path!r}: an entry without an offset")
    ends = [(entry.offset or 0) + entry.stored_length for entry in entries]
    limit = max([2 * _upload.PACK_BYTES, *ends])
    try:
        data = await store.get_range(path, 0, limit + 1)
    except CheckpointNotFoundError:
        raise
    except StoreError:  # a store refuses a range of an empty object: is it empty?
        if (await store.head(path)).size > 0:
            raise
        data = b""
    view = memoryview(data)
    if view.nbytes > limit:
        size = (await store.head(path)).size
        raise IntegrityMismatchError(path, str(limit), str(size), what="size (at most)")
    pieces = [(index, entry, cut(path, view, 0, entry)) for index, entry in enumerate(entries)]
    _, damaged = await asyncio.to_thread(decode_each, path, pieces, True)
    if damaged:
        raise damaged[0][1]
    return data


async def read_entry(
    store: Store, path: str, entry: PartitionSnapshotEntry, verify: bool
) -> Buffer:
    """The bytes ``entry`` describes, from ``path``: read and decoded in memory bounded by
    what the entry records (see the module docstring), verified when ``verify``."""
    if entry.codec is not None:
        get_codec(entry.codec, path=path)  # a codec this cairn cannot decode fails before I/O
    stored = await read_stored(store, path, entry)
    if entry.codec is not None or entry.index_size_bytes is not None:
        # Decoded on a worker thread, whatever its stored size (an object of ranges may
        # hold frames that decode to far more than they take).
        return await asyncio.to_thread(decoded, path, stored, entry, verify)
    return await off_loop_if_large(stored, decoded, path, stored, entry, verify)


def decoded(path: str, stored: Buffer, entry: PartitionSnapshotEntry, verify: bool) -> Buffer:
    """The bytes ``entry`` describes, from its ``stored`` bytes read from ``path``: decoded
    in memory bounded by the entry (see the module docstring) and, when ``verify``,
    checked against its digest (an object of ranges range by range)."""
    data = stored
    if entry.codec is not None:
        codec = get_codec(entry.codec, path=path)
        data = codec.decompress(stored, path=path, size_bytes=entry.size_bytes)
    if verify and entry.index_size_bytes is not None:
        verify_ranges(path, data, entry.index_size_bytes, entry.sha256)
    elif verify:
        verify_integrity(path, data, entry.sha256)
    return data


def cut(
    path: str, view: memoryview | None, start: int, entry: PartitionSnapshotEntry
) -> memoryview:
    """The stored bytes of ``entry``, a range of the pack at ``path``, out of ``view``:
    the pack's bytes from ``start`` on that were read (None: the pack ends before
    ``start``). A range they do not hold whole is an :class:`IntegrityMismatchError` on
    its size: the pack is shorter than the manifest says."""
    offset = entry.offset or 0
    end = offset + entry.stored_length
    held = start + view.nbytes if view is not None else -1
    if view is None or end > held:
        got = max(0, held - offset)
        what = f"size of bytes {offset}..{end}"
        raise IntegrityMismatchError(path, str(entry.stored_length), str(got), what=what)
    return view[offset - start : end - start]


def decode_each(
    path: str,
    pieces: list[tuple[int, PartitionSnapshotEntry, memoryview]],
    verify: bool,
) -> tuple[list[tuple[int, Buffer]], list[tuple[int, IntegrityError]]]:
    """Each piece's stored bytes :func:`decoded` (and verified when ``verify``), each on
    its own: the pieces that decode, and the damage of those that do not."""
    found: list[tuple[int, Buffer]] = []
    damaged: list[tuple[int, IntegrityError]] = []
    for index, entry, stored in pieces:
        try:
            found.append((index, decoded(path, stored, entry, verify)))
        except IntegrityError as exc:
            damaged.append((index, exc))
    return found, damaged
