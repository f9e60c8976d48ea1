"""Optional compression of artifacts in the store. Pure: no I/O.

A checkpointer made with ``compression="zstd"`` stores each artifact zstd-compressed and
records ``codec="zstd"`` in its manifest entry; reading an entry whose codec is unknown,
or whose library is not installed (``pip install 'cairn-checkpoint[zstd]'``), raises
:class:`CodecError` naming the artifact and the codec. How compressed artifacts are
stored and read is specified in docs/format.md, section "Compression".

Invariants:

* the SHA-256 and ``size_bytes`` of an entry always cover the decoded bytes, so
  integrity is checked on exactly what the engine restores;
* decompression is bounded, whatever the stored bytes say of themselves: every read
  decodes through one :class:`Decoder`, as a stream, in pieces of at most
  ``piece_size`` bytes, and stops at the piece that takes the output past its ``limit``
  (dropped, with :class:`OversizedArtifactError`). A frame's declared content size is
  never trusted nor used to allocate, and a window over :data:`MAX_WINDOW_SIZE` is
  refused (:class:`UndecodableArtifactError`). So a decompression bomb costs a
  whole-artifact read at most its recorded size plus one piece of memory, a streamed
  one (``load_artifact_to``, which knows no size) about one piece, and fails like any
  other damage.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from cairn.errors import (
    CodecError,
    IntegrityMismatchError,
    OversizedArtifactError,
    UndecodableArtifactError,
)
from cairn.format._buffer import Buffer

__all__ = [
    "CODECS",
    "DECODE_PIECE",
    "MAX_WINDOW_SIZE",
    "Codec",
    "Decoder",
    "StreamEncoder",
    "get_codec",
]

CODECS = ("zstd",)
"""The codec names cairn knows."""

DECODE_PIECE = 1024 * 1024
"""Bytes per piece of output when a whole artifact is decoded into memory."""

MAX_WINDOW_SIZE = 8 * 1024 * 1024
"""The largest zstd window a frame may ask the decoder to hold (zstd's own default
allows 128 MiB). cairn compresses at level 3, whose frames use at most 2 MiB."""


class StreamEncoder(Protocol):
    """Compresses a stream chunk by chunk."""

    def compress(self, data: Buffer) -> bytes:
        """Feed ``data``; returns what is ready."""

    def flush(self) -> bytes:
        """The rest, at the end of the stream."""


class Codec:
    """One compression format: whole-buffer and streaming, both ways."""

    def __init__(self, name: str, module: Any, level: int = 3) -> None:
        self.name = name
        self._module = module
        self._level = level

    def compress(self, data: Buffer) -> bytes:
        """``data`` compressed (releases the GIL: call it from a worker thread)."""
        return bytes(self._module.ZstdCompressor(level=self._level).compress(data))

    def decompress(self, data: Buffer, *, path: str, size_bytes: int) -> bytes:
        """``data``, the stored bytes of the artifact at ``path``, decoded: the
        ``size_bytes`` bytes its entry records (call it from a worker thread).

        Memory holds at most ``size_bytes`` decoded bytes plus one piece of DECODE_PIECE:
        :class:`OversizedArtifactError` as soon as the output passes ``size_bytes``,
        :class:`IntegrityMismatchError` on the size if it ends short of it, and
        :class:`UndecodableArtifactError` if ``data`` does not decode.
        """
        pieces: list[bytes] = []
        decoder = self.decoder(pieces.append, path=path, limit=size_bytes, piece_size=DECODE_PIECE)
        decoder.feed(data)
        if decoder.size != size_bytes:
            raise IntegrityMismatchError(path, str(size_bytes), str(decoder.size), what="size")
        return b"".join(pieces)

    def encoder(self) -> StreamEncoder:
        """A new streaming compressor."""
        encoder: StreamEncoder = self._module.ZstdCompressor(level=self._level).compressobj()
        return encoder

    def decoder(
        self,
        sink: Callable[[bytes], object],
        *,
        path: str,
        limit: int | None,
        piece_size: int,
    ) -> Decoder:
        """A new streaming decompressor for the artifact at ``path`` (see :class:`Decoder`)."""
        return Decoder(self._module, self.name, sink, path=path, limit=limit, piece_size=piece_size)


class Decoder:
    """Decodes one artifact's stored bytes, fed chunk by chunk, in bounded memory.

    Each :meth:`feed` hands what it decodes to ``sink`` in pieces of at most
    ``piece_size`` bytes, one at a time as they are produced: nothing else keeps them.
    Before handing on a piece that takes the output past ``limit`` bytes (None: no
    limit), it raises :class:`OversizedArtifactError`; bytes that do not decode raise
    :class:`UndecodableArtifactError`; whatever ``sink`` raises goes through as it is.
    After an error the decoder is spent. ``size`` counts the bytes decoded so far. A
    stream cut short just decodes to fewer bytes: a whole read tells by the size it
    expects, a streamed one by the digest.
    """

    def __init__(
        self,
        module: Any,
        codec: str,
        sink: Callable[[bytes], object],
        *,
        path: str,
        limit: int | None,
        piece_size: int,
    ) -> None:
        self._codec = codec
        self._path = path
        self._error: type[Exception] = module.ZstdError
        self._outlet = _Outlet(sink, path, codec, limit)
        # stream_writer hands each piece to the outlet as soon as it is decoded, in at
        # most write_size bytes; the frame's declared content size plays no part in it.
        decompressor = module.ZstdDecompressor(max_window_size=MAX_WINDOW_SIZE)
        self._writer = decompressor.stream_writer(
            self._outlet, write_size=piece_size, closefd=False
        )

    @property
    def size(self) -> int:
        """Bytes decoded so far."""
        return self._outlet.size

    def feed(self, data: Buffer) -> None:
        """Decode ``data``, the next stored bytes, into the sink (from a worker thread:
        zstd releases the GIL while it decodes)."""
        try:
            self._writer.write(data)
        except self._error as exc:
            raise UndecodableArtifactError(self._path, self._codec, str(exc)) from None


class _Outlet:
    """What zstandard's ``stream_writer`` writes decoded pieces to: it counts them,
    refuses the one past the limit, and hands the others to the sink.

    It holds no reference back to its :class:`Decoder`: the ``stream_writer`` that holds
    it is opaque to Python's cycle collector, so a cycle through it would never be
    freed, and with it every piece the sink keeps."""

    def __init__(
        self, sink: Callable[[bytes], object], path: str, codec: str, limit: int | None
    ) -> None:
        self.size = 0
        self._sink = sink
        self._path = path
        self._codec = codec
        self._limit = limit

    def write(self, piece: bytes) -> int:
        """Take one decoded piece; its length (what ``stream_writer`` expects)."""
        self.size += len(piece)
        if self._limit is not None and self.size > self._limit:
            raise OversizedArtifactError(self._path, self._codec, self._limit)
        self._sink(piece)
        return len(piece)


def get_codec(name: str, *, path: str = "") -> Codec:
    """The codec called ``name``; :class:`CodecError` if unknown or not installed."""
    if name not in CODECS:
        raise CodecError(path, name, f"unknown codec (known: {', '.join(CODECS)})")
    try:
        module = importlib.import_module("zstandard")
    except ImportError:
        raise CodecError(
            path,
            name,
            "the 'zstandard' package is not installed: pip install 'cairn-checkpoint[zstd]'",
        ) from None
    return Codec(name, module)
