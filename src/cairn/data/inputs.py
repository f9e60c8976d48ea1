"""Where artifact bytes come from: buffers, files, and streams, read once and hashed on the way.

A snapshot or delta may be given as a bytes-like object, a :class:`os.PathLike` naming a
file, a binary file object, or a sync or async iterable of bytes-like chunks. Buffers take
the direct path (one ``put``, hashed in a thread alongside it). Everything else becomes a
:class:`StreamSource`: its chunks flow into a multipart upload while each is hashed on
another thread, so a 2 GiB file is uploaded in memory bounded by the part size times the
parts in flight, and takes about as long as the slower of the upload and the hash. A
file is read into a few buffers of cairn's own, reused (:class:`~cairn.format._buffer.BufferPool`).

"Bytes-like" means any C-contiguous buffer (bytes, bytearray, memoryview of any format,
``array.array``, a numpy array): its raw bytes are sent, without a copy, as
:func:`cairn.format._buffer.raw_bytes` describes. Anything else where bytes are expected is an
error, never converted: ``bytes(3)`` is three zero bytes, so an iterable of ints (say
``list(b"abc")``) would otherwise be stored as zeros and verify. A buffer is read in
place while its save runs, so it must not change until ``save`` returns; a chunk that is
not ``bytes`` is copied as it is taken, since a reader may refill it for the next one.

Invariants: the digest and size recorded are those of exactly the bytes that were sent
(a read buffer is refilled only once neither the store nor the hash holds it);
a source is read once per attempt; a file (path or seekable object) can be sent again
when a transient failure makes the upload retry, and a one-shot iterator cannot (the
retry then fails with :class:`InvalidInputError` saying so, rather than sending less);
what can be refused without reading the source (a str, a mapping, a set, a text file,
a list with a chunk that is not bytes-like, a non-contiguous buffer) is refused by
:func:`check_artifact_data`, before anything is uploaded, and a chunk that only
iteration reveals to be wrong fails the upload with :class:`InvalidInputError`.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    Set,
)
from pathlib import Path
from typing import BinaryIO, TypeAlias

from cairn.errors import InvalidInputError
from cairn.format._buffer import Buffer, BufferPool, raw_bytes
from cairn.format.codecs import StreamEncoder
from cairn.format.integrity import StreamHasher
from cairn.format.ranges import RangeSource

__all__ = [
    "READ_BUFFERS",
    "READ_CHUNK",
    "ArtifactData",
    "StreamSource",
    "as_buffer",
    "check_artifact_data",
]

READ_CHUNK = 8 * 1024 * 1024
"""Bytes read from a file per chunk (and the multipart part size)."""

READ_BUFFERS = 17
"""Read buffers of READ_CHUNK bytes one streamed upload reuses, at most: enough for the
most parts a store has in flight by default (16, ``cairn.stores.PartsInFlight().maximum``)
and one being read. A pool allocates a buffer only when every one it has is still held,
so a store that writes one chunk at a time (a local directory) uses two."""

ArtifactData: TypeAlias = (
    Buffer | os.PathLike[str] | BinaryIO | Iterable[Buffer] | AsyncIterable[Buffer] | RangeSource
)
"""What ``save`` accepts for one artifact (a :class:`~cairn.format.ranges.RangeSource` makes an
object of ranges; see :mod:`cairn.format.ranges`)."""


def as_buffer(data: object, what: str = "artifact data") -> memoryview | None:
    """``data``'s raw bytes as a flat, zero-copy view if it is bytes-like, else None.

    A buffer that cannot be sent as it is (not C-contiguous, say) raises
    :class:`InvalidInputError` naming ``what``; see :func:`cairn.format._buffer.raw_bytes`.
    """
    return raw_bytes(data, what)


def check_artifact_data(what: str, data: object) -> None:
    """Raise :class:`InvalidInputError` naming ``what`` unless ``data`` is a usable source.

    Decides everything that can be decided without reading the data: a one-shot
    iterator's chunks are checked as they are read, by :class:`StreamSource`.
    """
    if isinstance(data, str):
        raise InvalidInputError(f"{what} is a str: pass bytes, or a pathlib.Path to upload a file")
    if isinstance(data, RangeSource) or as_buffer(data, what) is not None:
        return
    if isinstance(data, os.PathLike):
        if not Path(data).is_file():
            raise InvalidInputError(f"{what} names no readable file: {os.fspath(data)!r}")
        return
    if hasattr(data, "read"):
        if _is_text_file(data):
            raise InvalidInputError(
                f"{what} is a file opened in text mode ({type(data).__name__}), which reads "
                "str: open it in binary mode ('rb'), or pass its path"
            )
        return
    if isinstance(data, Mapping):
        raise InvalidInputError(
            f"{what} is a mapping ({type(data).__name__}), not bytes: iterating it gives its "
            "keys; serialize it to bytes first"
        )
    if isinstance(data, Set):
        raise InvalidInputError(
            f"{what} is a set ({type(data).__name__}): its order is arbitrary, so its chunks "
            "have no defined concatenation; pass a list of bytes chunks"
        )
    if isinstance(data, Sequence):  # readable without consuming it: check every chunk now
        for index, chunk in enumerate(data):
            _chunk_view(chunk, what, index)
        return
    if isinstance(data, Iterable | AsyncIterable):
        return
    raise InvalidInputError(
        f"{what} must be bytes-like, a path, a binary file or an iterable of chunks, "
        f"got {type(data).__name__}"
    )


class StreamSource:
    """A file or stream to upload in chunks, hashing and counting what passes.

    Call :meth:`open` for each attempt; after the stream it returns is exhausted,
    :attr:`sha256` and :attr:`size` describe exactly the bytes it produced.

    A path or a binary file is read into at most ``buffers`` reusable buffers of
    ``chunk_size`` bytes (:class:`~cairn.format._buffer.BufferPool`), and each chunk is handed
    on as a ``memoryview`` of one, zero-copy, while a :class:`~cairn.format.integrity.StreamHasher`
    hashes it on another thread: the bytes are read once, and the hash runs alongside
    the upload instead of before it. A buffer is refilled only once the store and the
    hash are both done with it, so what is sent is always what was hashed.
    """

    def __init__(
        self,
        data: ArtifactData,
        *,
        chunk_size: int = READ_CHUNK,
        encoder: Callable[[], StreamEncoder] | None = None,
        what: str = "artifact data",
        buffers: int = READ_BUFFERS,
    ) -> None:
        self._data = data
        self._what = what
        self._chunk_size = chunk_size
        self._encoder = encoder
        self._buffers = buffers
        self.stored_size = 0
        self._opened = 0
        self._start = data.tell() if _is_seekable_file(data) else 0  # type: ignore[union-attr]
        self.sha256 = ""
        self.size = 0

    @property
    def reopenable(self) -> bool:
        """Whether the bytes can be produced again (a path or a seekable file)."""
        return isinstance(self._data, os.PathLike) or _is_seekable_file(self._data)

    def open(self) -> AsyncIterator[Buffer]:
        """A fresh pass over the bytes; raises if a one-shot stream was already read.

        Each chunk is valid until the next one is asked for: a buffer of ours is refilled
        once nothing holds it any more (see :class:`~cairn.format._buffer.BufferPool`).
        """
        if self._opened and not self.reopenable:
            raise InvalidInputError(
                "this artifact's data is a one-shot stream and was already sent once: "
                "it cannot be sent again after a failed attempt (pass a file to allow retry)"
            )
        self._opened += 1
        return self._hashing(self._chunks())

    async def _hashing(self, chunks: AsyncIterator[object]) -> AsyncIterator[Buffer]:
        hasher = StreamHasher()
        encoder = self._encoder() if self._encoder is not None else None
        size = stored = 0
        index = 0
        try:
            async for chunk in chunks:
                if isinstance(chunk, _OwnChunk):
                    view, own = chunk.view, True
                else:
                    view, own = _chunk_view(chunk, self._what, index), False
                index += 1
                size += view.nbytes
                out: Buffer
                if encoder is not None:
                    # Hashed on the hasher's thread while compressed on another.
                    await hasher.feed(view)
                    out = await asyncio.to_thread(encoder.compress, view)
                    if not own and not isinstance(chunk, bytes):
                        await hasher.drain()  # the caller may refill its chunk once we go on
                else:
                    # Our own buffer is sent as it is (the pool does not refill it while
                    # anything holds it); a caller's mutable chunk is copied: the caller may
                    # refill it once asked for the next one, while the store still holds it.
                    out = view if own else chunk if isinstance(chunk, bytes) else view.tobytes()
                    await hasher.feed(out)
                # No reference of ours may outlive this step: a buffer still viewed here
                # would look busy to the pool (see BufferPool).
                del chunk, view
                if (length := memoryview(out).nbytes) > 0:
                    stored += length
                    yield out
                del out
            if encoder is not None and (tail := encoder.flush()):
                stored += len(tail)
                yield tail
            self.sha256 = await hasher.hexdigest()
            self.size, self.stored_size = size, stored
        finally:
            hasher.close()

    async def _chunks(self) -> AsyncIterator[object]:
        data = self._data
        if isinstance(data, os.PathLike):
            # Unbuffered: readinto goes straight from the kernel into our buffer.
            file = await asyncio.to_thread(open, data, "rb", buffering=0)
            try:
                async for chunk in self._read_file(file):
                    yield chunk
                    del chunk  # not held while the next is read (see _hashing)
            finally:
                file.close()
        elif hasattr(data, "read"):
            if _is_seekable_file(data):
                data.seek(self._start)  # type: ignore[union-attr]
            async for chunk in self._read_file(data):  # type: ignore[arg-type]
                yield chunk
                del chunk
        elif isinstance(data, AsyncIterable):
            async for part in data:
                yield part
        else:
            iterator: Iterator[object] = iter(data)  # type: ignore[arg-type]
            # A sentinel, not None: a None chunk is an error to report, not the end.
            while (item := await asyncio.to_thread(next, iterator, _END)) is not _END:
                yield item

    async def _read_file(self, file: BinaryIO) -> AsyncIterator[object]:
        if not isinstance(file, io.RawIOBase | io.BufferedIOBase):
            # A duck-typed file may have no readinto, or one of its own meaning.
            while chunk := await asyncio.to_thread(file.read, self._chunk_size):
                yield chunk
            return
        pool = BufferPool(self._chunk_size, self._buffers)
        try:
            while True:
                buffer = pool.take()
                filled = await asyncio.to_thread(_fill, file, buffer)
                if not filled:
                    return
                yield _OwnChunk(memoryview(buffer)[:filled])
        finally:
            pool.clear()


class _OwnChunk:
    """Bytes read into a buffer of our own pool: sent as they are, never copied."""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view


def _fill(file: BinaryIO, buffer: bytearray) -> int:
    """Read into ``buffer`` until it is full or the file ends; the bytes read."""
    view = memoryview(buffer)
    filled = 0
    while filled < len(view):
        got = file.readinto(view[filled:])  # type: ignore[attr-defined]
        if not got:  # the end (or, from a non-blocking file, no data: as read() did)
            break
        filled += got
    return filled


_END = object()


def _chunk_view(chunk: object, what: str, index: int) -> memoryview:
    """Chunk ``index`` of ``what`` as flat bytes; :class:`InvalidInputError` if it is not."""
    view = raw_bytes(chunk, f"chunk {index} of {what}")
    if view is None:
        hint = ""
        if isinstance(chunk, int):
            hint = " (iterating a bytes object yields ints: pass the bytes object itself)"
        elif isinstance(chunk, str):
            hint = " (encode text to bytes, or open files in binary mode)"
        raise InvalidInputError(
            f"chunk {index} of {what} is of type {type(chunk).__name__}, not bytes-like: an "
            "iterable or file must yield bytes, bytearray, memoryview or another "
            f"C-contiguous buffer{hint}"
        )
    return view


def _is_text_file(data: object) -> bool:
    if isinstance(data, io.TextIOBase):
        return True
    if isinstance(data, io.BufferedIOBase | io.RawIOBase):
        return False
    # Duck-typed files (tempfile wrappers, say) say how they were opened in their mode.
    mode = getattr(data, "mode", None)
    return isinstance(mode, str) and "b" not in mode


def _is_seekable_file(data: object) -> bool:
    seekable = getattr(data, "seekable", None)
    return bool(hasattr(data, "read") and callable(seekable) and seekable())
