"""The object-store boundary: the operations cairn needs, over obstore, with our errors.

:class:`Store` is the small async protocol the checkpointer calls. :class:`ObstoreStore`
implements it over any obstore store; tests and users may pass their own implementation
(a wrapper that counts calls, delays or injects faults) wherever a store is accepted.
:class:`ForwardingStore` is the base of such wrappers: it forwards every operation to an
inner store through one hook. A store may declare :class:`StoreCapabilities` (read them
with :func:`capabilities_of`); code that must treat backends differently asks for the
capability it needs, never for a backend type. :mod:`cairn.testing` holds the contract
every store and wrapper passes.

This module is the interface; its parts live beside it: the values it speaks in
(:mod:`cairn._storetypes`), error translation (:mod:`cairn._translate`), the link-safe
local filesystem (:mod:`cairn._localfs`) and opening stores by URL (:mod:`cairn._urls`).
Every public name stays importable from here.

Invariants kept at this boundary:

* no obstore (or OS) exception escapes: each is translated into a :mod:`cairn.errors`
  type that names the operation and the path (:func:`translate_error`);
* failures worth retrying (connection errors, timeouts, 5xx, throttling) are
  :class:`TransientStoreError`; not-found, permission, precondition and already-exists
  never are;
* ``put(mode=IfMatch(...))`` is a compare-and-swap on every backend, of the version
  that :class:`ObjectInfo` names (its e-tag, and on GCS its generation, which GCS
  compares instead; a GCS compare-and-swap without one is refused). obstore's local
  store has no conditional update (``native_compare_and_swap`` is False), so for
  ``file://`` stores it is done under an OS file lock (``fcntl.flock``) on the
  directory that holds the object, around read-compare-replace, where the replace is
  obstore's atomic rename. That holds between processes on one host (not across hosts
  sharing a network filesystem), and leaves no file of its own in the store;
* a ``put`` or ``put_stream`` that returned is durable, as a PUT to S3 is: on a local
  store (where obstore writes and renames without any fsync) the file and every
  directory from its parent up to the root are fsynced before it returns, so a
  manifest is never on disk ahead of its artifacts after a power cut. A write that
  landed but whose fsync failed raises :class:`NotDurableError` (never retried);
* ``delete`` of a missing object is not an error. On a local store a ``delete`` or
  ``delete_prefix`` that empties directories removes them too, up to (never
  including) the root, as an object store keeps no empty folders; a ``put`` whose
  directory such a delete removed while the put was making it tries again;
* a local store never follows a symbolic link below its root (the root itself may be
  one: the caller chose it), so nothing outside the root is read, written or deleted
  through one. A link is not an object: listings neither report it nor descend into
  it; ``get``, ``get_range``, ``head`` and ``stat`` of a path that is a link, or
  passes through one, raise :class:`CheckpointNotFoundError` naming the link (so
  readers fall back as for any missing object); ``put`` and ``put_stream`` of such a
  path raise :class:`StoreError` naming the link, neither writing through the link
  nor replacing it; ``delete`` of a path that is a link removes the link itself, and
  of a path through one deletes nothing; ``delete_prefix`` removes links as links
  (the prefix's own directory too, if it is one) and never descends into them.
  Listing, deleting and reading (``get``, ``get_range``: a ``pread`` of the file,
  cheaper than obstore's local read) walk directory descriptors opened with
  ``O_NOFOLLOW``, so a directory swapped for a link mid-walk is not followed either.
  ``head``, ``stat`` and writes go through obstore after a ``lstat`` of each path
  component below the root: a link swapped in between that check and obstore's own
  open is the remaining window there.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import obstore
from obstore.store import (
    AzureStore,
    GCSStore,
    LocalStore,
    MemoryStore,
    ObjectStore,
    S3Store,
)

from cairn._buffer import Buffer
from cairn._localfs import (
    _local_delete,
    _local_holds,
    _local_io,
    _local_list,
    _local_list_dir,
    _local_open_parent,
    _local_parent_missing,
    _local_parts,
    _local_persist,
    _local_read,
    _local_read_range,
    _local_remove_tree,
    _RangePastEnd,
)
from cairn._storetypes import (
    Blob,
    IfMatch,
    ListDirResult,
    ObjectInfo,
    PutMode,
    StoreCapabilities,
    StoreMethod,
    capabilities_of,
)
from cairn._translate import (
    _call,
    _info,
    translate_error,
)
from cairn._urls import (
    DEFAULT_CLIENT_RETRY,
    explain_store_error,
    open_store,
    store_url,
)
from cairn.errors import (
    CheckpointNotFoundError,
    InvalidInputError,
    NotDurableError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
)

__all__ = [
    "DEFAULT_CLIENT_RETRY",
    "Blob",
    "ForwardingStore",
    "IfMatch",
    "ListDirResult",
    "ObjectInfo",
    "ObstoreStore",
    "PutMode",
    "Store",
    "StoreCapabilities",
    "StoreMethod",
    "as_store",
    "capabilities_of",
    "explain_store_error",
    "open_store",
    "store_url",
    "translate_error",
]

T = TypeVar("T")

PART_SIZE = 8 * 1024 * 1024
"""Multipart part size for streamed uploads (S3's minimum is 5 MiB)."""
PARTS_IN_FLIGHT = 4
"""Parts of one streamed upload in flight at once: memory is about PART_SIZE times this."""
LOCAL_PUT_ATTEMPTS = 8
"""Tries of a local put whose directory a concurrent delete keeps removing as the put
makes it (see :meth:`ObstoreStore._local_put`); one removal costs one more try."""


@runtime_checkable
class Store(Protocol):
    """The async object-store operations cairn uses. Errors are :mod:`cairn.errors` types.

    A store may also declare its :class:`StoreCapabilities` as a ``capabilities``
    attribute. It is not part of this protocol, so that stores written without it keep
    working: read it with :func:`capabilities_of`, which assumes nothing of a store that
    declares none. :class:`cairn.testing.StoreContract` checks an implementation.
    """

    async def get(self, path: str) -> Blob:
        """The object's bytes; :class:`CheckpointNotFoundError` if it does not exist."""

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        """Bytes ``start`` (inclusive) to ``end`` (exclusive) of the object.

        Needs ``0 <= start <= end`` (else :class:`InvalidInputError`). An ``end`` past
        the object's end reads to its end; a non-empty range that starts at or past the
        end raises :class:`StoreError`; an empty range reads nothing, but a missing object
        still raises :class:`CheckpointNotFoundError`.
        """

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
        open_chunks: Callable[[], AsyncIterator[Buffer]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Write the chunks of ``open_chunks()`` as one object, in a multipart upload.

        ``open_chunks`` is called once per attempt; the object appears whole or not at all.
        A chunk is any bytes-like object (cairn sends views of its reused read buffers,
        zero-copy): a store that keeps one after asking for the next keeps a view of it
        (as obstore does) or a copy; cairn refills a buffer only once no view of it lives.
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
# Capabilities, and the base of store wrappers


class ForwardingStore:
    """A :class:`Store` that forwards every call to ``inner`` through one hook.

    A wrapper (retrying, counting, delaying, injecting faults) overrides
    :meth:`_around` alone, and a method only to change what that method returns.
    Arguments reach ``inner`` unchanged: ``put``'s mode and metadata, and
    ``put_stream``'s ``open_chunks`` callable itself, so each attempt of a repeated
    call opens a fresh stream. The capabilities are those of ``inner``.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    @property
    def capabilities(self) -> StoreCapabilities:
        """The capabilities of the wrapped store."""
        return capabilities_of(self.inner)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        """Await ``call()``, which does ``operation`` on ``inner``; override to wrap it.

        ``path`` is the call's path or prefix (for ``delete``, its first path, or ``""``
        if it has none). ``mode`` is the put mode of ``put``, ``"overwrite"`` for
        ``put_stream``, and None for every other operation. Each ``call()`` makes a new
        attempt, so an override may call it again to repeat the operation.
        """
        return await call()

    async def get(self, path: str) -> Blob:
        return await self._around("get", path, lambda: self.inner.get(path))

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        return await self._around("get_range", path, lambda: self.inner.get_range(path, start, end))

    async def head(self, path: str) -> ObjectInfo:
        return await self._around("head", path, lambda: self.inner.head(path))

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        return await self._around(
            "put", path, lambda: self.inner.put(path, data, mode=mode, metadata=metadata), mode=mode
        )

    async def put_stream(
        self,
        path: str,
        open_chunks: Callable[[], AsyncIterator[Buffer]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        await self._around(
            "put_stream",
            path,
            lambda: self.inner.put_stream(path, open_chunks, metadata=metadata),
            mode="overwrite",
        )

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        return await self._around("stat", path, lambda: self.inner.stat(path))

    async def list_dir(self, prefix: str) -> ListDirResult:
        return await self._around("list_dir", prefix, lambda: self.inner.list_dir(prefix))

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await self._around("list", prefix, lambda: self.inner.list(prefix))

    async def delete(self, paths: Sequence[str]) -> None:
        first = paths[0] if paths else ""
        await self._around("delete", first, lambda: self.inner.delete(paths))

    async def delete_prefix(self, prefix: str) -> None:
        await self._around("delete_prefix", prefix, lambda: self.inner.delete_prefix(prefix))


# ---------------------------------------------------------------------------------------
# Error translation

# Retryability is decided by what a failure is, never by words in its message: a 400
# whose body says "connection closed" is not retried, and a 503 is, whatever its body.
#
# obstore 0.12 raises exception classes without attributes (no status, no cause), but
# every message it builds is object_store's Display text, then "\n\nDebug source:\n",
# then the pretty Debug form of the same Rust error. The Debug form is structured:
# object_store's RetryError prints its outcome as ``inner: Status {`` / ``Response {``
# followed by a ``status: NNN,`` field line, or ``Http(HttpError {`` followed by a
# ``kind: K,`` field line (HttpErrorKind: Connect, Request, Timeout, Interrupted,
# Decode, Unknown); a body stream that fails mid-response is an ``HttpError`` too.
# Strings in a Debug form are quoted and escaped (a newline is printed as ``\n``), so a
# response body or a path can never produce the line structure matched below, and the
# Debug form is taken after the *last* marker, so a body that contains the marker text
# cannot move it. tests/test_throttling.py pins these shapes against live obstore errors.


# ---------------------------------------------------------------------------------------
# Local directories: symbolic links below the root are never followed


# ---------------------------------------------------------------------------------------
# The obstore adapter


def _declared_capabilities(store: ObjectStore) -> StoreCapabilities:
    """What obstore (0.12) does natively for a store of this type."""
    if isinstance(store, LocalStore):
        # No e-tag update (NotImplementedError), no attributes: a plain directory.
        return StoreCapabilities(local_path=store.prefix if store.prefix is not None else Path("/"))
    if isinstance(store, MemoryStore | S3Store | GCSStore | AzureStore):
        return StoreCapabilities(native_compare_and_swap=True, user_metadata=True)
    return StoreCapabilities()  # HTTPStore (WebDAV) and whatever comes next: claim nothing


class ObstoreStore:
    """:class:`Store` over an obstore store (memory, local, S3, GCS, Azure, HTTP).

    Over a local directory, symbolic links below the root are never followed: see the
    module docstring for what each operation does with one.
    """

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._capabilities = _declared_capabilities(store)
        # Azure's List Blobs gives each ETag without the quotes that its HEAD, GET and PUT
        # replies (and so head, get and put here) give: one e-tag, one spelling. GCS lists
        # quoted ones, as S3 does; fake-gcs-server (the tests' GCS) drops the quotes there
        # only, and quoting an unquoted one is all this does: harmless where quoted.
        self._quote_listed_e_tags = isinstance(store, AzureStore | GCSStore)
        # GCS conditions a write on the object's generation alone (object_store refuses a
        # compare-and-swap without one, before any request).
        self._swap_needs_version = isinstance(store, GCSStore)

    @property
    def obstore(self) -> ObjectStore:
        """The wrapped obstore store."""
        return self._store

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the obstore store's type does natively (see :class:`StoreCapabilities`)."""
        return self._capabilities

    def __repr__(self) -> str:
        return f"ObstoreStore({self._store!r})"

    def _local_link(self, root: Path, operation: str, path: str) -> str | None:
        """The first component of ``path`` below ``root`` that is a symbolic link, or None.

        One ``lstat`` per component, stopping at the first missing one. Run inline: a
        few system calls cost less than a hop to a worker thread.
        """
        current = os.fspath(root)
        parts = _local_parts(operation, path)
        for depth, part in enumerate(parts, 1):
            current = os.path.join(current, part)
            try:
                mode = os.lstat(current).st_mode
            except OSError:
                return None  # missing (or under a file): obstore reports what it finds
            if stat.S_ISLNK(mode):
                return "/".join(parts[:depth])
        return None

    def _check_readable(self, operation: str, path: str) -> None:
        root = self._capabilities.local_path
        if root is None:
            return
        link = self._local_link(root, operation, path)
        if link is not None:
            raise ObjectNotFoundError(
                operation, path, f"object (the symbolic link {link!r} on its path is not followed)"
            )

    @contextlib.contextmanager
    def _naming_links(self, operation: str, path: str) -> Iterator[None]:
        """A local read found nothing: say so naming the link on the path, if that is why.

        Local reads open with ``O_NOFOLLOW`` all the way down, so they never follow a
        link; the ``lstat`` walk that names it is only paid when a read fails.
        """
        try:
            yield
        except ObjectNotFoundError:
            self._check_readable(operation, path)
            raise

    def _check_writable(self, path: str) -> None:
        root = self._capabilities.local_path
        if root is None:
            return
        link = self._local_link(root, "put", path)
        if link is not None:
            raise StoreError(
                "put",
                path,
                f"{link!r} is a symbolic link; a local store neither writes through "
                "nor replaces links (remove it)",
            )

    async def get(self, path: str) -> Blob:
        root = self._capabilities.local_path
        if root is not None:
            with self._naming_links("get", path):
                body, info = await _local_io("get", path, _local_read, root, path)
            return Blob(data=body, info=info)
        result = await _call("get", path, obstore.get_async(self._store, path))
        data = await _call("get", path, result.bytes_async())
        return Blob(data=data, info=_info(result.meta))

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        if not 0 <= start <= end:
            # obstore raises a bare ValueError for these.
            raise InvalidInputError(
                f"get_range of {path!r}: a byte range needs 0 <= start <= end, "
                f"got start={start!r}, end={end!r}"
            )
        if start == end:
            await self.head(path)  # obstore refuses an empty range; a missing object is missing
            return b""
        root = self._capabilities.local_path
        if root is not None:
            try:
                with self._naming_links("get_range", path):
                    return await _local_io(
                        "get_range", path, _local_read_range, root, path, start, end
                    )
            except _RangePastEnd as exc:
                raise StoreError("get_range", path, f"invalid range: {exc}") from None
        return await _call(
            "get_range", path, obstore.get_range_async(self._store, path, start=start, end=end)
        )

    async def head(self, path: str) -> ObjectInfo:
        self._check_readable("head", path)
        return _info(await _call("head", path, obstore.head_async(self._store, path)))

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        self._check_writable(path)
        capabilities = self._capabilities
        if (
            isinstance(mode, IfMatch)
            and not capabilities.native_compare_and_swap
            and capabilities.local_path is not None
        ):
            return await self._locked_compare_and_swap(capabilities.local_path, path, data, mode)
        obstore_mode: Any
        if isinstance(mode, IfMatch):
            if mode.version is None and self._swap_needs_version:
                raise StoreError(
                    "put",
                    path,
                    "GCS compares generations: a compare-and-swap needs the version that "
                    "get, head or put reported (IfMatch(info.e_tag, info.version))",
                )
            obstore_mode = {"e_tag": mode.e_tag}
            if mode.version is not None:  # obstore rejects an explicit None version
                obstore_mode["version"] = mode.version
        else:
            obstore_mode = mode
        attributes = dict(metadata) if metadata and capabilities.user_metadata else None
        result = await self._local_put(
            path,
            lambda: _call(
                "put",
                path,
                obstore.put_async(
                    self._store, path, data, mode=obstore_mode, attributes=attributes
                ),
            ),
        )
        await self._persist(path)
        return ObjectInfo(
            path=path,
            size=memoryview(data).nbytes,
            e_tag=result.get("e_tag"),
            last_modified=dt.datetime.now(dt.UTC),
            version=result.get("version"),
        )

    async def put_stream(
        self,
        path: str,
        open_chunks: Callable[[], AsyncIterator[Buffer]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self._check_writable(path)
        attributes = dict(metadata) if metadata and self._capabilities.user_metadata else None
        await self._local_put(
            path,
            lambda: _call(
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
            ),
        )
        await self._persist(path)

    async def _local_put(self, path: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` (one obstore put of ``path``), again while on a local directory it
        fails because a directory on the object's way vanished meanwhile.

        obstore's local put makes the missing directories of the object one level after
        another, then opens its staging file in the last one. A delete that empties a
        directory removes it (:func:`cairn._localfs._local_delete`): one that removes a
        directory the put just made, before the put made the next one or its file there,
        fails the put ("Unable to create dir ...: No such file or directory") with
        nothing written. Trying again makes them again. Once the staging file is in its
        directory, no such delete can remove that directory (it is not empty), so the
        rename into place does not lose this race. Other failures are not tried again.
        """
        root = self._capabilities.local_path
        tries = 1
        while True:
            try:
                return await attempt()
            except StoreError as exc:
                if root is None or tries >= LOCAL_PUT_ATTEMPTS:
                    raise
                if type(exc) not in (StoreError, ObjectNotFoundError):
                    raise  # exists, precondition, transient (the retry policy's), ...
                if not await _local_io("put", path, _local_parent_missing, root, path):
                    raise
            tries += 1
            self._check_writable(path)  # a link may have come in the vanished one's place

    async def _persist(self, path: str) -> None:
        """On a local directory, fsync what a put just wrote (obstore does not)."""
        root = self._capabilities.local_path
        if root is None:
            return
        try:
            await _local_io("put", path, _local_persist, root, path)
        except StoreError as exc:
            raise NotDurableError(
                "put", path, f"written, but not made durable: {exc.reason}"
            ) from exc

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        self._check_readable("head", path)
        result = await _call(
            "head", path, obstore.get_async(self._store, path, options={"head": True})
        )
        return _info(result.meta), {str(k): str(v) for k, v in result.attributes.items()}

    async def list_dir(self, prefix: str) -> ListDirResult:
        root = self._capabilities.local_path
        if root is not None:
            return await _local_io("list", prefix, _local_list_dir, root, prefix)
        result = await _call(
            "list", prefix, obstore.list_with_delimiter_async(self._store, prefix or None)
        )
        prefixes = [p if p.endswith("/") else p + "/" for p in result["common_prefixes"]]
        quote = self._quote_listed_e_tags
        objects = [_info(meta, quote_e_tag=quote) for meta in result["objects"]]
        return ListDirResult(prefixes=prefixes, objects=objects)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        root = self._capabilities.local_path
        if root is not None:
            # obstore's local listing follows links (outside the root, and into loops).
            return await _local_io("list", prefix, _local_list, root, prefix)
        stream = obstore.list(self._store, prefix or None, chunk_size=1000)
        found: list[ObjectInfo] = []
        while True:
            try:
                chunk = await _call("list", prefix, anext(stream))
            except StopAsyncIteration:
                return found
            found.extend(_info(m, quote_e_tag=self._quote_listed_e_tags) for m in chunk)

    async def delete(self, paths: Sequence[str]) -> None:
        if not paths:
            return
        root = self._capabilities.local_path
        if root is not None:
            # obstore's local delete resolves the path, following links in its parents.
            await _local_io("delete", paths[0], _local_delete, root, paths)
            return
        try:
            await _call("delete", paths[0], obstore.delete_async(self._store, list(paths)))
            return
        except CheckpointNotFoundError:
            pass
        # S3 ignores missing objects in a batch; the Azure store fails the batch at the
        # first one, leaving the rest in place: finish one by one.
        for path in paths:
            with contextlib.suppress(CheckpointNotFoundError):
                await _call("delete", path, obstore.delete_async(self._store, path))

    async def delete_prefix(self, prefix: str) -> None:
        await self.delete([info.path for info in await self.list(prefix)])
        root = self._capabilities.local_path
        if root is not None and prefix.endswith("/") and prefix.strip("/"):
            await _local_io("delete", prefix, _local_remove_tree, root, prefix)

    async def _locked_compare_and_swap(
        self, root: Path, path: str, data: Buffer, mode: IfMatch
    ) -> ObjectInfo:
        """Compare-and-swap under an OS file lock, for a directory without a native one.

        The lock is an exclusive ``flock`` on the directory that holds the object, opened
        as every local access is (without following a link on the way): the swaps of all
        objects in one directory take turns, in one process and between processes, and
        no lock file is left in the store. A swap needs the object, so its directory
        exists; one that was removed while this waited (its object deleted, and maybe
        made again since, a new directory) is not the one to hold: lock the one there
        now.
        """
        while True:
            fd = await _local_io("put", path, _local_open_parent, root, path)
            if fd is None:
                raise PreconditionFailedError("put", path, "object no longer exists")
            try:  # closing the descriptor releases the lock, also when cancelled
                await _flock_exclusive(fd, path)
                if not await _local_io("put", path, _local_holds, root, path, fd):
                    continue
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
                os.close(fd)


async def _flock_exclusive(fd: int, path: str) -> None:
    """Take an exclusive ``flock`` on ``fd``, waiting on the event loop, not in a thread.

    A blocking ``flock`` in a worker thread would hold that thread for as long as another
    holder keeps the lock: enough waiters fill the loop's default executor, and the
    holder, which needs a worker to fsync its put, never finishes (a deadlock). A waiter
    cancelled meanwhile would also leave a thread to take the lock later and keep it.
    So: non-blocking attempts, with a pause doubling from 1 ms up to 50 ms between them.
    """
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
        except OSError as exc:
            raise translate_error("put", path, exc) from exc


def as_store(store: Store | ObjectStore | str) -> Store:
    """Accept a :class:`Store`, an obstore store, or a URL or plain path for :func:`open_store`."""
    if isinstance(store, str):
        return ObstoreStore(open_store(store))
    if isinstance(store, Store):
        return store
    return ObstoreStore(store)


# ---------------------------------------------------------------------------------------
# Opening stores by URL
