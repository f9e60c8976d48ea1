"""SHA-256 digests of checkpoint data, and their verification. Pure: no I/O.

Invariant: a digest is always the lowercase hex SHA-256 of exactly the bytes the caller
handed in (before any compression). Large buffers are hashed in worker threads, where
hashlib releases the GIL, so hashing overlaps with uploads and uses every core; small
ones are hashed inline, where a thread hop would cost more than the hash. A stream is
hashed by :class:`StreamHasher`, in order, on a thread of its own, while its chunks
travel.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cairn.errors import IntegrityMismatchError
from cairn.format._buffer import Buffer

T = TypeVar("T")

__all__ = [
    "INLINE_HASH_LIMIT",
    "StreamHasher",
    "off_loop_if_large",
    "sha256_hex",
    "sha256_hex_async",
    "verify_integrity",
    "verify_integrity_async",
]

INLINE_HASH_LIMIT = 256 * 1024
"""Buffers up to this size are hashed on the calling thread."""


def sha256_hex(data: Buffer) -> str:
    """The lowercase hex SHA-256 of ``data``.

    Args:
        data: Any bytes-like object.

    Returns:
        The 64-character lowercase hex digest.
    """
    return hashlib.sha256(data).hexdigest()


async def off_loop_if_large(data: Buffer, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``, in a worker thread when ``data`` (the bytes it works on) is larger
    than INLINE_HASH_LIMIT (hashlib releases the GIL there); inline otherwise, where the
    thread hop would cost more than the work."""
    if memoryview(data).nbytes <= INLINE_HASH_LIMIT:
        return work(*args)
    return await asyncio.to_thread(work, *args)


async def sha256_hex_async(data: Buffer) -> str:
    """:func:`sha256_hex`, off the event loop for buffers larger than INLINE_HASH_LIMIT."""
    return await off_loop_if_large(data, sha256_hex, data)


async def verify_integrity_async(
    path: str, data: Buffer, expected_sha256: str, *, what: str = "sha256"
) -> None:
    """:func:`verify_integrity`, off the event loop for buffers larger than INLINE_HASH_LIMIT."""
    await off_loop_if_large(data, verify_integrity, path, data, expected_sha256, what)


def verify_integrity(path: str, data: Buffer, expected_sha256: str, what: str = "sha256") -> None:
    """Raise :class:`IntegrityMismatchError` unless SHA-256 of ``data`` is ``expected_sha256``.

    Args:
        path: Where ``data`` was read from, for the error.
        data: The bytes read.
        expected_sha256: The hex digest they must have (either case).
        what: What was checked, for the error's message (the digest of which part of
            the object, where there are several).

    Raises:
        IntegrityMismatchError: The digest differs; it carries ``path``, ``expected``
            and ``actual``.
    """
    actual = sha256_hex(data)
    if actual != expected_sha256.lower():
        raise IntegrityMismatchError(path, expected_sha256, actual, what=what)


class StreamHasher:
    """SHA-256 of a stream, computed on one worker thread while the stream goes on.

    :meth:`feed` queues a chunk and returns at once, unless ``lag`` chunks are already
    waiting for the hash: the caller hands the chunk on (to a store, a file) while it is
    hashed, so hashing one chunk overlaps with moving it and reading the next, and the
    digest costs no wall time unless hashing is the slowest stage. One thread hashes
    every chunk of the stream in the order fed, so the digest is that of the chunks in
    that order. A chunk must not change until it is hashed: the hash holds a buffer
    export of it while it runs, which is what :class:`cairn.format._buffer.BufferPool` waits
    for before it hands a buffer out again. Small chunks are hashed inline when nothing
    is queued. Call :meth:`close` when done, also on failure.
    """

    def __init__(self, lag: int = 2) -> None:
        self._hasher = hashlib.sha256()
        self._lag = lag
        self._pending: collections.deque[asyncio.Future[None]] = collections.deque()
        self._executor: ThreadPoolExecutor | None = None

    async def feed(self, chunk: Buffer) -> None:
        """Queue ``chunk`` for hashing; waits only while ``lag`` chunks are queued."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()
        if not self._pending and memoryview(chunk).nbytes <= INLINE_HASH_LIMIT:
            self._hasher.update(chunk)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="cairn-sha256")
        loop = asyncio.get_running_loop()
        self._pending.append(loop.run_in_executor(self._executor, self._hasher.update, chunk))
        while len(self._pending) > self._lag:
            await self._pending.popleft()

    async def drain(self) -> None:
        """Wait until every chunk fed is hashed (after which the caller may change them)."""
        while self._pending:
            await self._pending.popleft()

    async def hexdigest(self) -> str:
        """The digest of every chunk fed, once they are all hashed."""
        await self.drain()
        return self._hasher.hexdigest()

    def close(self) -> None:
        """Let the worker thread end once what is queued is hashed."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
