"""The object-store boundary: the operations cairn needs, over obstore, with our errors.

:class:`Store` is the small async protocol the checkpointer calls. :class:`ObstoreStore`
implements it over any obstore store; tests and users may pass their own implementation
(a wrapper that counts calls, delays or injects faults) wherever a store is accepted.

Invariants kept at this boundary:

* no obstore (or OS) exception escapes: each is translated into a :mod:`cairn.errors`
  type that names the operation and the path (:func:`translate_error`);
* failures worth retrying (connection errors, timeouts, 5xx, throttling) are
  :class:`TransientStoreError`; not-found, permission, precondition and already-exists
  never are;
* ``put(mode=IfMatch(...))`` is a compare-and-swap on every backend. obstore's local
  store has no conditional update, so for ``file://`` stores it is done under an OS file
  lock (``fcntl.flock``) on a sidecar ``.{name}.lock`` file next to the object, around
  read-compare-replace, where the replace is obstore's atomic rename. That holds between
  processes on one host (not across hosts sharing a network filesystem);
* ``delete`` of a missing object is not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import unquote, urlsplit

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import LocalStore, MemoryStore, ObjectStore, from_url

from cairn import _shutdown
from cairn._buffer import Buffer
from cairn.errors import (
    CheckpointerError,
    CheckpointNotFoundError,
    InvalidStoreUrlError,
    ObjectExistsError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
)

__all__ = [
    "DEFAULT_CLIENT_RETRY",
    "Blob",
    "IfMatch",
    "ListDirResult",
    "ObjectInfo",
    "ObstoreStore",
    "PutMode",
    "Store",
    "as_store",
    "open_store",
    "translate_error",
]

T = TypeVar("T")

PART_SIZE = 8 * 1024 * 1024
"""Multipart part size for streamed uploads (S3's minimum is 5 MiB)."""
PARTS_IN_FLIGHT = 4
"""Parts of one streamed upload in flight at once: memory is about PART_SIZE times this."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a HEAD or a listing tells about one object."""

    path: str
    size: int
    e_tag: str | None
    last_modified: dt.datetime


@dataclass(frozen=True, slots=True)
class Blob:
    """An object's bytes with the metadata of the version that was read."""

    data: Buffer
    info: ObjectInfo


@dataclass(frozen=True, slots=True)
class ListDirResult:
    """One level of a listing: sub-directories (ending in ``/``) and objects."""

    prefixes: list[str]
    objects: list[ObjectInfo]


@dataclass(frozen=True, slots=True)
class IfMatch:
    """Put mode: replace the object only if its current e-tag is ``e_tag``."""

    e_tag: str
    version: str | None = None


PutMode = Literal["overwrite", "create"] | IfMatch
"""``"overwrite"``, ``"create"`` (fail if the object exists) or :class:`IfMatch`."""


@runtime_checkable
class Store(Protocol):
    """The async object-store operations cairn uses. Errors are :mod:`cairn.errors` types."""

    async def get(self, path: str) -> Blob:
        """The object's bytes; :class:`CheckpointNotFoundError` if it does not exist."""

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        """Bytes ``start`` (inclusive) to ``end`` (exclusive) of the object."""

    async def head(self, path: str) -> ObjectInfo:
        """The object's metadata; :class:`CheckpointNotFoundError` if it does not exist."""

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        """Write ``data`` atomically; returns what is known of the new version.

        ``"create"`` raises :class:`ObjectExistsError` if the object exists;
        :class:`IfMatch` raises :class:`PreconditionFailedError` if it changed.
        ``metadata`` is stored with the object where the store supports user metadata
        (memory, S3, GCS, Azure) and dropped where it does not (local files).
        """

    async def put_stream(
        self,
        path: str,
        open_chunks: Callable[[], AsyncIterator[bytes]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Write the chunks of ``open_chunks()`` as one object, in a multipart upload.

        ``open_chunks`` is called once per attempt; the object appears whole or not at all.
        """

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        """The object's metadata and user metadata, without its bytes (a HEAD request)."""

    async def list_dir(self, prefix: str) -> ListDirResult:
        """One level under ``prefix`` (which ends in ``/`` or is empty)."""

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose path starts with ``prefix``, in no particular order."""

    async def delete(self, paths: Sequence[str]) -> None:
        """Delete ``paths``; missing ones are not an error."""

    async def delete_prefix(self, prefix: str) -> None:
        """Delete everything under ``prefix`` (ending in ``/``), listed or not.

        On a local directory this also removes what a listing cannot see: the staging
        files (``name#N``) that a write killed mid-way leaves, and the emptied folders.
        """


# ---------------------------------------------------------------------------------------
# Error translation

_TRANSIENT = re.compile(
    r"error sending request|timed? ?out|timeout|connection|connect|reset by peer|broken pipe"
    r"|unexpected eof|incomplete|closed|dispatch|server error|status(?: code)?:? 5\d\d"
    r"|\b5\d\d\b|too many requests|\b429\b|slow ?down|throttl|service unavailable"
    r"|error decoding response body|body error|temporarily",
    re.IGNORECASE,
)


def _first_line(exc: BaseException) -> str:
    text = str(exc).split("\n\nDebug source:", 1)[0].strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate_error(operation: str, path: str, exc: BaseException) -> CheckpointerError:
    """The :mod:`cairn.errors` error for an exception raised by obstore (or the OS)."""
    if isinstance(exc, CheckpointerError):
        return exc
    reason = _first_line(exc)
    if isinstance(exc, FileNotFoundError):
        return CheckpointNotFoundError(path)
    if isinstance(exc, AlreadyExistsError):
        return ObjectExistsError(operation, path, reason)
    if isinstance(exc, PreconditionError):
        return PreconditionFailedError(operation, path, reason)
    if isinstance(
        exc, PermissionDeniedError | UnauthenticatedError | NotSupportedError | NotImplementedError
    ):
        return StoreError(operation, path, reason)
    if isinstance(exc, TimeoutError | ConnectionError):
        return TransientStoreError(operation, path, reason)
    if isinstance(exc, BaseError | OSError) and _TRANSIENT.search(reason):
        return TransientStoreError(operation, path, reason)
    return StoreError(operation, path, reason)


async def _call(operation: str, path: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except (BaseError, OSError, NotImplementedError) as exc:
        raise translate_error(operation, path, exc) from exc
    finally:
        _shutdown.note_store_call()


def _info(meta: Any) -> ObjectInfo:
    return ObjectInfo(
        path=meta["path"],
        size=meta["size"],
        e_tag=meta.get("e_tag"),
        last_modified=meta["last_modified"],
    )


# ---------------------------------------------------------------------------------------
# The obstore adapter


class ObstoreStore:
    """:class:`Store` over an obstore store (memory, local, S3, GCS, Azure, HTTP)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._local_root: Path | None = None
        if isinstance(store, LocalStore):
            self._local_root = store.prefix if store.prefix is not None else Path("/")

    @property
    def obstore(self) -> ObjectStore:
        """The wrapped obstore store."""
        return self._store

    def __repr__(self) -> str:
        return f"ObstoreStore({self._store!r})"

    async def get(self, path: str) -> Blob:
        result = await _call("get", path, obstore.get_async(self._store, path))
        data = await _call("get", path, result.bytes_async())
        return Blob(data=data, info=_info(result.meta))

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        return await _call(
            "get_range", path, obstore.get_range_async(self._store, path, start=start, end=end)
        )

    async def head(self, path: str) -> ObjectInfo:
        return _info(await _call("head", path, obstore.head_async(self._store, path)))

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        if isinstance(mode, IfMatch) and self._local_root is not None:
            return await self._local_compare_and_swap(path, data, mode)
        obstore_mode: Any
        if isinstance(mode, IfMatch):
            obstore_mode = {"e_tag": mode.e_tag}
            if mode.version is not None:  # obstore rejects an explicit None version
                obstore_mode["version"] = mode.version
        else:
            obstore_mode = mode
        attributes = dict(metadata) if metadata and self._local_root is None else None
        result = await _call(
            "put",
            path,
            obstore.put_async(self._store, path, data, mode=obstore_mode, attributes=attributes),
        )
        return ObjectInfo(
            path=path,
            size=memoryview(data).nbytes,
            e_tag=result.get("e_tag"),
            last_modified=dt.datetime.now(dt.UTC),
        )

    async def put_stream(
        self,
        path: str,
        open_chunks: Callable[[], AsyncIterator[bytes]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        attributes = dict(metadata) if metadata and self._local_root is None else None
        await _call(
            "put",
            path,
            obstore.put_async(
                self._store,
                path,
                open_chunks(),
                attributes=attributes,
                chunk_size=PART_SIZE,
                max_concurrency=PARTS_IN_FLIGHT,
            ),
        )

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        result = await _call(
            "head", path, obstore.get_async(self._store, path, options={"head": True})
        )
        return _info(result.meta), {str(k): str(v) for k, v in result.attributes.items()}

    async def list_dir(self, prefix: str) -> ListDirResult:
        result = await _call(
            "list", prefix, obstore.list_with_delimiter_async(self._store, prefix or None)
        )
        prefixes = [p if p.endswith("/") else p + "/" for p in result["common_prefixes"]]
        return ListDirResult(prefixes=prefixes, objects=[_info(m) for m in result["objects"]])

    async def list(self, prefix: str) -> list[ObjectInfo]:
        stream = obstore.list(self._store, prefix or None, chunk_size=1000)
        found: list[ObjectInfo] = []
        while True:
            try:
                chunk = await _call("list", prefix, anext(stream))
            except StopAsyncIteration:
                return found
            found.extend(_info(m) for m in chunk)

    async def delete(self, paths: Sequence[str]) -> None:
        if not paths:
            return
        try:
            await _call("delete", paths[0], obstore.delete_async(self._store, list(paths)))
            return
        except CheckpointNotFoundError:
            pass
        # S3 ignores missing objects in a batch; the local and Azure stores fail the batch
        # at the first one, leaving the rest in place: finish one by one.
        for path in paths:
            with contextlib.suppress(CheckpointNotFoundError):
                await _call("delete", path, obstore.delete_async(self._store, path))

    async def delete_prefix(self, prefix: str) -> None:
        await self.delete([info.path for info in await self.list(prefix)])
        if self._local_root is not None and prefix.endswith("/") and prefix.strip("/"):
            folder = self._local_root / prefix
            try:
                await asyncio.to_thread(shutil.rmtree, folder)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise translate_error("delete", prefix, exc) from exc

    async def _local_compare_and_swap(self, path: str, data: Buffer, mode: IfMatch) -> ObjectInfo:
        assert self._local_root is not None
        target = self._local_root / path
        lock_path = target.with_name(f".{target.name}.lock")

        def acquire() -> int:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            return fd

        try:
            fd = await asyncio.to_thread(acquire)
        except OSError as exc:
            raise translate_error("put", path, exc) from exc
        try:
            try:
                current = await self.head(path)
            except CheckpointNotFoundError:
                raise PreconditionFailedError("put", path, "object no longer exists") from None
            if current.e_tag != mode.e_tag:
                raise PreconditionFailedError(
                    "put", path, f"e-tag is {current.e_tag}, expected {mode.e_tag}"
                )
            await self.put(path, data, mode="overwrite")
            # The local store's e-tag is derived from inode, mtime and size: read it back.
            return await self.head(path)
        finally:
            os.close(fd)  # closing the descriptor releases the lock


def as_store(store: Store | ObjectStore | str) -> Store:
    """Accept a :class:`Store`, an obstore store, or a URL for :func:`open_store`."""
    if isinstance(store, str):
        return ObstoreStore(open_store(store))
    if isinstance(store, Store):
        return store
    return ObstoreStore(store)


# ---------------------------------------------------------------------------------------
# Opening stores by URL

DEFAULT_CLIENT_RETRY: dict[str, Any] = {
    "max_retries": 2,
    "backoff": {
        "init_backoff": dt.timedelta(milliseconds=100),
        "max_backoff": dt.timedelta(seconds=2),
        "base": 2,
    },
    "retry_timeout": dt.timedelta(seconds=30),
}
"""obstore's own HTTP retry for stores opened by URL.

obstore retries a failed HTTP request (connection errors, 5xx, timeouts of safe
requests) inside one call; cairn's :class:`~cairn.RetryPolicy` retries the whole
operation on what is still transient after that. Keeping obstore's layer short bounds a
persistent fault to ``(max_retries + 1) * RetryPolicy.attempts`` HTTP requests per
operation (3 x 4 = 12 with the defaults) instead of obstore's default of 11 per attempt.
Pass ``retry_config=...`` to :func:`open_store` to choose otherwise.
"""

_REMOTE_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https"})


def open_store(url: str, **options: Any) -> ObjectStore:
    """Open the obstore store a URL names; ``options`` go to obstore unchanged.

    ``memory://`` (a new, empty in-memory store), ``file:///abs/dir`` (created if
    missing), ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``
    (and the other URL forms obstore knows for those services). An unknown scheme or a
    malformed URL raises :class:`InvalidStoreUrlError` naming the URL.
    """
    if not isinstance(url, str):
        raise InvalidStoreUrlError(repr(url), "a store URL must be a string")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidStoreUrlError(url, str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme == "memory":
        if parts.netloc or parts.path.strip("/") or options:
            raise InvalidStoreUrlError(url, "memory:// takes no path and no options")
        return MemoryStore()
    if scheme == "file":
        return _open_local(url, parts.netloc, unquote(parts.path), options)
    if scheme not in _REMOTE_SCHEMES:
        raise InvalidStoreUrlError(
            url, f"unknown scheme {parts.scheme!r}; use memory, file, s3, gs or az"
        )
    if not parts.netloc:
        raise InvalidStoreUrlError(url, "missing bucket or container name")
    options.setdefault("retry_config", DEFAULT_CLIENT_RETRY)
    try:
        return from_url(url, **options)
    except (BaseError, ValueError, TypeError) as exc:
        raise InvalidStoreUrlError(url, _first_line(exc)) from None


def _open_local(url: str, host: str, path: str, options: dict[str, Any]) -> LocalStore:
    if host not in ("", "localhost"):
        raise InvalidStoreUrlError(url, f"file URLs name a local path, not host {host!r}")
    if not path.startswith("/"):
        raise InvalidStoreUrlError(url, "file URLs need an absolute path (file:///abs/dir)")
    unknown = set(options) - {"automatic_cleanup", "mkdir"}
    if unknown:
        raise InvalidStoreUrlError(url, f"unknown option(s) for file stores: {sorted(unknown)}")
    try:
        if options.get("mkdir", True):
            Path(path).mkdir(parents=True, exist_ok=True)
        return LocalStore(path, **options)
    except (BaseError, OSError) as exc:
        raise InvalidStoreUrlError(url, _first_line(exc)) from None
