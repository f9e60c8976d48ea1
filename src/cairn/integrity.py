"""SHA-256 digests of checkpoint data, and their verification. Pure: no I/O.

Invariant: a digest is always the lowercase hex SHA-256 of exactly the bytes the caller
handed in (before any compression). Large buffers are hashed in worker threads, where
hashlib releases the GIL, so hashing overlaps with uploads and uses every core; small
ones are hashed inline, where a thread hop would cost more than the hash.
"""

from __future__ import annotations

import asyncio
import hashlib

from cairn._buffer import Buffer
from cairn.errors import IntegrityMismatchError

__all__ = ["INLINE_HASH_LIMIT", "sha256_hex", "sha256_hex_async", "verify_integrity"]

INLINE_HASH_LIMIT = 256 * 1024
"""Buffers up to this size are hashed on the calling thread."""


def sha256_hex(data: Buffer) -> str:
    """The lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


async def sha256_hex_async(data: Buffer) -> str:
    """:func:`sha256_hex`, off the event loop for buffers larger than INLINE_HASH_LIMIT."""
    if memoryview(data).nbytes <= INLINE_HASH_LIMIT:
        return sha256_hex(data)
    return await asyncio.to_thread(sha256_hex, data)


def verify_integrity(path: str, data: Buffer, expected_sha256: str) -> None:
    """Raise :class:`IntegrityMismatchError` unless SHA-256 of ``data`` is ``expected_sha256``.

    The error carries ``path``, ``expected`` and ``actual``.
    """
    actual = sha256_hex(data)
    if actual != expected_sha256.lower():
        raise IntegrityMismatchError(path, expected_sha256, actual)
