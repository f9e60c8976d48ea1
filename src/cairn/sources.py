"""Where artifact bytes come from: buffers, files, and streams, read once and hashed on the way.

A snapshot or delta may be given as a bytes-like object, a :class:`os.PathLike` naming a
file, a binary file object, or a sync or async iterable of bytes-like chunks. Buffers take
the direct path (one ``put``, hashed in a thread alongside it). Everything else becomes a
:class:`StreamSource`: its chunks flow into a multipart upload while each is hashed, so
a 2 GiB file is uploaded in memory bounded by the part size times the parts in flight.

Invariants: the digest and size recorded are those of exactly the bytes that were sent;
a source is read once per attempt; a file (path or seekable object) can be sent again
when a transient failure makes the upload retry, and a one-shot iterator cannot (the
retry then fails with :class:`InvalidInputError` saying so, rather than sending less).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias

from cairn._buffer import Buffer
from cairn.codecs import StreamEncoder
from cairn.errors import InvalidInputError

__all__ = ["READ_CHUNK", "ArtifactData", "StreamSource", "as_buffer", "check_artifact_data"]

READ_CHUNK = 8 * 1024 * 1024
"""Bytes read from a file per chunk (and the multipart part size)."""

ArtifactData: TypeAlias = (
    Buffer | os.PathLike[str] | BinaryIO | Iterable[Buffer] | AsyncIterable[Buffer]
)
"""What ``save`` accepts for one artifact."""


def as_buffer(data: object) -> memoryview | None:
    """A view of ``data`` if it is bytes-like, else None."""
    if isinstance(data, str):
        return None
    try:
        return memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        return None


def check_artifact_data(what: str, data: object) -> None:
    """Raise :class:`InvalidInputError` naming ``what`` unless ``data`` is a usable source."""
    if isinstance(data, str):
        raise InvalidInputError(f"{what} is a str: pass bytes, or a pathlib.Path to upload a file")
    if as_buffer(data) is not None:
        return
    if isinstance(data, os.PathLike):
        if not Path(data).is_file():
            raise InvalidInputError(f"{what} names no readable file: {os.fspath(data)!r}")
        return
    if hasattr(data, "read") or isinstance(data, Iterable | AsyncIterable):
        return
    raise InvalidInputError(
        f"{what} must be bytes-like, a path, a binary file or an iterable of chunks, "
        f"got {type(data).__name__}"
    )


class StreamSource:
    """A file or stream to upload in chunks, hashing and counting what passes.

    Call :meth:`open` for each attempt; after the stream it returns is exhausted,
    :attr:`sha256` and :attr:`size` describe exactly the bytes it produced.
    """

    def __init__(
        self,
        data: ArtifactData,
        *,
        chunk_size: int = READ_CHUNK,
        encoder: Callable[[], StreamEncoder] | None = None,
    ) -> None:
        self._data = data
        self._chunk_size = chunk_size
        self._encoder = encoder
        self.stored_size = 0
        self._opened = 0
        self._start = data.tell() if _is_seekable_file(data) else 0  # type: ignore[union-attr]
        self.sha256 = ""
        self.size = 0

    @property
    def reopenable(self) -> bool:
        """Whether the bytes can be produced again (a path or a seekable file)."""
        return isinstance(self._data, os.PathLike) or _is_seekable_file(self._data)

    def open(self) -> AsyncIterator[bytes]:
        """A fresh pass over the bytes; raises if a one-shot stream was already read."""
        if self._opened and not self.reopenable:
            raise InvalidInputError(
                "this artifact's data is a one-shot stream and was already sent once: "
                "it cannot be sent again after a failed attempt (pass a file to allow retry)"
            )
        self._opened += 1
        return self._hashing(self._chunks())

    async def _hashing(self, chunks: AsyncIterator[Buffer]) -> AsyncIterator[bytes]:
        hasher = hashlib.sha256()
        encoder = self._encoder() if self._encoder is not None else None
        size = stored = 0
        async for chunk in chunks:
            view = bytes(chunk) if not isinstance(chunk, bytes) else chunk
            size += len(view)
            if encoder is not None:
                view = await asyncio.to_thread(_hash_and_encode, hasher, encoder, view)
            elif len(view) > 256 * 1024:
                await asyncio.to_thread(hasher.update, view)
            else:
                hasher.update(view)
            if view:
                stored += len(view)
                yield view
        if encoder is not None and (tail := encoder.flush()):
            stored += len(tail)
            yield tail
        self.sha256, self.size, self.stored_size = hasher.hexdigest(), size, stored

    async def _chunks(self) -> AsyncIterator[Buffer]:
        data = self._data
        if isinstance(data, os.PathLike):
            file = await asyncio.to_thread(open, data, "rb")
            try:
                async for chunk in _read_file(file, self._chunk_size):
                    yield chunk
            finally:
                file.close()
        elif hasattr(data, "read"):
            if _is_seekable_file(data):
                data.seek(self._start)  # type: ignore[union-attr]
            async for chunk in _read_file(data, self._chunk_size):  # type: ignore[arg-type]
                yield chunk
        elif isinstance(data, AsyncIterable):
            async for part in data:
                yield part
        else:
            iterator: Iterator[Buffer] = iter(data)  # type: ignore[arg-type]
            while (item := await asyncio.to_thread(_next_or_none, iterator)) is not None:
                yield item


def _hash_and_encode(hasher: Any, encoder: StreamEncoder, chunk: bytes) -> bytes:
    hasher.update(chunk)
    return encoder.compress(chunk)


def _next_or_none(iterator: Iterator[Buffer]) -> Buffer | None:
    return next(iterator, None)


async def _read_file(file: BinaryIO, chunk_size: int) -> AsyncIterator[bytes]:
    while True:
        chunk = await asyncio.to_thread(file.read, chunk_size)
        if not chunk:
            return
        yield chunk


def _is_seekable_file(data: object) -> bool:
    seekable = getattr(data, "seekable", None)
    return bool(hasattr(data, "read") and callable(seekable) and seekable())
