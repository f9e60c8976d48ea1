"""Optional compression of artifacts in the store. Pure: no I/O.

A checkpointer made with ``compression="zstd"`` stores each artifact zstd-compressed and
records ``codec="zstd"`` in its manifest entry, with ``stored_size_bytes``. The SHA-256
always covers the bytes the caller handed in (decompressed), so integrity is checked on
exactly what the engine restores. Reading an entry whose codec is unknown, or whose
library is not installed (``pip install cairn[zstd]``), raises :class:`CodecError`
naming the artifact and the codec.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from cairn._buffer import Buffer
from cairn.errors import CodecError

__all__ = ["CODECS", "Codec", "StreamDecoder", "StreamEncoder", "get_codec"]

CODECS = ("zstd",)
"""The codec names cairn knows."""


class StreamEncoder(Protocol):
    """Compresses a stream chunk by chunk."""

    def compress(self, data: Buffer) -> bytes:
        """Feed ``data``; returns what is ready."""

    def flush(self) -> bytes:
        """The rest, at the end of the stream."""


class StreamDecoder(Protocol):
    """Decompresses a stream chunk by chunk."""

    def decompress(self, data: Buffer) -> bytes:
        """Feed ``data``; returns what is ready."""


class Codec:
    """One compression format: whole-buffer and streaming, both ways."""

    def __init__(self, name: str, module: Any, level: int = 3) -> None:
        self.name = name
        self._module = module
        self._level = level

    def compress(self, data: Buffer) -> bytes:
        """``data`` compressed (releases the GIL: call it from a worker thread)."""
        return bytes(self._module.ZstdCompressor(level=self._level).compress(data))

    def decompress(self, data: Buffer) -> bytes:
        """``data`` decompressed, whatever the frame says of its size."""
        decoder = self._module.ZstdDecompressor().decompressobj()
        return bytes(decoder.decompress(data))

    def encoder(self) -> StreamEncoder:
        """A new streaming compressor."""
        encoder: StreamEncoder = self._module.ZstdCompressor(level=self._level).compressobj()
        return encoder

    def decoder(self) -> StreamDecoder:
        """A new streaming decompressor."""
        decoder: StreamDecoder = self._module.ZstdDecompressor().decompressobj()
        return decoder


def get_codec(name: str, *, path: str = "") -> Codec:
    """The codec called ``name``; :class:`CodecError` if unknown or not installed."""
    if name not in CODECS:
        raise CodecError(path, name, f"unknown codec (known: {', '.join(CODECS)})")
    try:
        module = importlib.import_module("zstandard")
    except ImportError:
        raise CodecError(
            path, name, "the 'zstandard' package is not installed: pip install 'cairn[zstd]'"
        ) from None
    return Codec(name, module)
