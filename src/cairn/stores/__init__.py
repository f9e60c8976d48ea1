"""The object-store boundary: the operations cairn needs, over obstore, with our errors.

:class:`Store` is the small async protocol the checkpointer calls. :class:`ObstoreStore`
implements it over any obstore store but a local one; a local directory is its own
store, :class:`~cairn.stores._local.LocalStore`, which works on the files themselves
(obstore's local store follows symbolic links and fsyncs nothing), and which
:func:`as_store` (and so every checkpointer), and ``ObstoreStore`` itself, build for an
obstore ``LocalStore``, a ``file://`` URL or a plain path. Tests and users may pass their
own implementation (a wrapper that counts calls, delays or injects faults) wherever a
store is accepted. :class:`ForwardingStore` is the base of such wrappers: it forwards
every operation to an inner store through one hook. A store may declare
:class:`StoreCapabilities` (read them with :func:`capabilities_of`); code that must treat
backends differently asks for the capability it needs, never for a backend type.
:mod:`cairn.testing` holds the contract every store and wrapper passes.

This module is the interface; its parts live beside it, in private modules of this
package: the values it speaks in, error translation, the local store (on link-safe
filesystem primitives) and opening stores by URL. Every public name stays importable
from here.

Invariants kept at this boundary (the local store's own are in its module):

* no obstore (or OS) exception escapes: each is translated into a :mod:`cairn.errors`
  type that names the operation and the path (:func:`translate_error`);
* failures worth retrying (connection errors, timeouts, 5xx, throttling) are
  :class:`TransientStoreError`; not-found, permission, precondition and already-exists
  never are;
* ``put(mode=IfMatch(...))`` is a compare-and-swap on every backend, of the version
  that :class:`ObjectInfo` names (its e-tag, and on GCS its generation, which GCS
  compares instead; a GCS compare-and-swap without one is refused);
* a ``put`` or ``put_stream`` that returned is durable: the object stores' own PUT is;
* ``delete`` of a missing object is not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import obstore
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, ObjectStore, S3Store

from cairn.errors import CheckpointNotFoundError, InvalidInputError, StoreError, TransientStoreError
from cairn.format._buffer import Buffer
from cairn.stores._local import LocalStore as LocalDirectoryStore
from cairn.stores._localtree import remove_staging
from cairn.stores._parts import PartsController, PartsInFlight, parts_setting
from cairn.stores._pieces import READ_PIECE, read_in_pieces
from cairn.stores._translate import call as _call
from cairn.stores._translate import info_of as _info
from cairn.stores._translate import translate_error
from cairn.stores._types import (
    Blob,
    IfMatch,
    ListDirResult,
    Metadata,
    ObjectInfo,
    OpenChunks,
    PutMode,
    StoreCall,
    StoreCapabilities,
    StoreMethod,
    capabilities_of,
    empty_range,
)
from cairn.stores._urls import (
    DEFAULT_CLIENT_RETRY,
    explain_store_error,
    local_directory,
    open_store,
    store_url,
)

if TYPE_CHECKING:
    from obstore import GetOptions

__all__ = [
    "DEFAULT_CLIENT_RETRY",
    "Blob",
    "ForwardingStore",
    "IfMatch",
    "ListDirResult",
    "ObjectInfo",
    "ObstoreStore",
    "OpenChunks",
    "PartsInFlight",
    "PutMode",
    "Store",
    "StoreCapabilities",
    "StoreMethod",
    "as_store",
    "capabilities_of",
    "explain_store_error",
    "open_store",
    "remove_staging_files",
    "store_url",
    "translate_error",
]

T = TypeVar("T")

PART_SIZE = 8 * 1024 * 1024
"""Multipart part size for streamed uploads (S3's minimum is 5 MiB)."""
PARTS_IN_FLIGHT = PartsInFlight().maximum
"""The most parts of one streamed upload in flight at once by default: memory is at most
PART_SIZE times this (see :class:`PartsInFlight`)."""


@runtime_checkable
class Store(Protocol):
    """The async object-store operations cairn uses. Errors are :mod:`cairn.errors` types.

    A store may also declare its :class:`StoreCapabilities` as a ``capabilities``
    attribute. It is not part of this protocol, so that stores written without it keep
    working: read it with :func:`capabilities_of`, which assumes nothing of a store that
    declares none. :class:`cairn.testing.StoreContract` checks an implementation.
    """

    async def get(self, path: str) -> Blob:
        """The object's bytes.

        Args:
            path: The object's store path.

        Returns:
            Its bytes and what is known of its version.

        Raises:
            CheckpointNotFoundError: It does not exist.
        """

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        """Bytes ``start`` (inclusive) to ``end`` (exclusive) of the object.

        Needs ``0 <= start <= end`` (else :class:`InvalidInputError`). An ``end`` past
        the object's end reads to its end; a non-empty range that starts at or past the
        end raises :class:`StoreError`; an empty range reads nothing, but a missing object
        still raises :class:`CheckpointNotFoundError`.

        Args:
            path: The object's store path.
            start: The first byte to read, >= 0.
            end: The byte after the last to read, >= ``start``.

        Returns:
            The bytes of the range (fewer where ``end`` is past the object's end).

        Raises:
            InvalidInputError: ``start`` is negative or greater than ``end``.
            StoreError: A non-empty range starts at or past the object's end.
            CheckpointNotFoundError: The object does not exist.
        """

    async def head(self, path: str) -> ObjectInfo:
        """The object's metadata.

        Args:
            path: The object's store path.

        Returns:
            Its size, version and modification time.

        Raises:
            CheckpointNotFoundError: It does not exist.
        """

    async def put(
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: Metadata = None
    ) -> ObjectInfo:
        """Write ``data`` atomically; returns what is known of the new version.

        ``"create"`` raises :class:`ObjectExistsError` if the object exists;
        :class:`IfMatch` raises :class:`PreconditionFailedError` if it changed.
        ``metadata`` is stored with the object where the store supports user metadata
        (memory, S3, GCS, Azure) and dropped where it does not (local files).

        Args:
            path: The object's store path.
            data: The bytes to write.
            mode: ``"overwrite"`` (the default), ``"create"`` (only if absent), or an
                :class:`IfMatch` (only over that version).
            metadata: User metadata to store with the object, or None.

        Returns:
            What is known of the new version.

        Raises:
            ObjectExistsError: ``"create"`` met an existing object.
            PreconditionFailedError: An :class:`IfMatch` met another version.
        """

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
    ) -> None:
        """Write the chunks of ``open_chunks()`` as one object, in a multipart upload.

        ``open_chunks`` is called once per attempt; the object appears whole or not at all.
        A chunk is any bytes-like object (cairn sends views of its reused read buffers,
        zero-copy): a store that keeps one after asking for the next keeps a view of it
        (as obstore does) or a copy; cairn refills a buffer only once no view of it lives.

        Args:
            path: The object's store path.
            open_chunks: Called once per attempt, it returns the chunks to write.
            metadata: User metadata to store with the object, or None.
        """

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        """The object's metadata and user metadata, without its bytes (a HEAD request).

        Args:
            path: The object's store path.

        Returns:
            Its metadata, and its user metadata (empty where the store keeps none).

        Raises:
            CheckpointNotFoundError: It does not exist.
        """

    async def list_dir(self, prefix: str) -> ListDirResult:
        """One level under ``prefix``.

        Args:
            prefix: A prefix ending in ``/``, or empty for the root.

        Returns:
            The prefixes (subdirectories) and the objects directly under it.
        """

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose path starts with ``prefix``, in no particular order.

        Args:
            prefix: A path prefix.

        Returns:
            The objects' metadata.
        """

    async def delete(self, paths: Sequence[str]) -> None:
        """Delete ``paths``; missing ones are not an error.

        Args:
            paths: The store paths to delete.
        """

    async def delete_prefix(self, prefix: str) -> None:
        """Delete everything under ``prefix`` (ending in ``/``), listed or not.

        On a local directory this also removes what a listing cannot see: the staging
        files (``name#N``) that a write killed mid-way leaves, and the emptied folders.

        Args:
            prefix: The prefix to empty, ending in ``/``.
        """


async def remove_staging_files(store: Store, prefix: str) -> list[str]:
    """Remove what writes killed mid-way left below directory ``prefix`` of a local store.

    A write to a local directory stages its bytes in ``{name}#{n}`` beside its object and
    renames the file onto the name when complete; a process killed meanwhile leaves the
    staging file, which no listing shows, so nothing that works from listings reclaims
    it. This removes them (and the directories that this empties). A write still in
    progress there loses its staging file and fails: call it only where no write can
    still matter. Garbage collection does, in the directories it has claimed.

    On any other store it does nothing. An object store keeps the parts of an unfinished
    multipart upload out of sight in the same way; its own lifecycle rule reclaims them
    (docs/clouds.md, "Unfinished uploads").

    Args:
        store: The store.
        prefix: A directory below the root, ending in ``/``.

    Returns:
        The path of each staging file removed; none on a store that is not a local
        directory.

    Raises:
        InvalidInputError: ``prefix`` is the root: the writes of the whole store may be
            in progress.
        StoreError: The file system refused a removal.
    """
    if not prefix.strip("/"):
        raise InvalidInputError(
            f"remove_staging_files takes a directory below the root, got {prefix!r}"
        )
    root = capabilities_of(store).local_path
    if root is None:
        return []
    return await asyncio.to_thread(remove_staging, root, prefix)


# ---------------------------------------------------------------------------------------
# The base of store wrappers


class ForwardingStore:
    """A :class:`Store` that forwards every call to ``inner`` through one hook.

    A wrapper (retrying, counting, delaying, injecting faults) overrides
    :meth:`_around` alone, and a method only to change what that method returns.
    Arguments reach ``inner`` unchanged: ``put``'s mode and metadata, and
    ``put_stream``'s ``open_chunks`` callable itself, so each attempt of a repeated
    call opens a fresh stream. The capabilities are those of ``inner``.

    Args:
        inner: The store every call goes to.
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
        self, operation: StoreMethod, path: str, call: StoreCall[T], *, mode: PutMode | None = None
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
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: Metadata = None
    ) -> ObjectInfo:
        return await self._around(
            "put", path, lambda: self.inner.put(path, data, mode=mode, metadata=metadata), mode=mode
        )

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
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
# The obstore adapter


def _declared_capabilities(store: ObjectStore) -> StoreCapabilities:
    """What obstore (0.12) does natively for a store of this type."""
    if isinstance(store, MemoryStore | S3Store | GCSStore | AzureStore):
        return StoreCapabilities(native_compare_and_swap=True, user_metadata=True)
    return StoreCapabilities()  # HTTPStore (WebDAV) and whatever comes next: claim nothing


class ObstoreStore:
    """:class:`Store` over an obstore store (memory, S3, GCS, Azure, HTTP).

    ``ObstoreStore(store)`` of an obstore ``LocalStore`` gives cairn's own local store on
    the same directory instead (:class:`~cairn.stores._local.LocalStore`: obstore's local
    store follows symbolic links, fsyncs nothing and has no compare-and-swap).

    One object moves as several parts at once: a streamed upload is a multipart upload of
    :data:`PART_SIZE` parts, and a ranged read of more than two :data:`READ_PIECE` pieces is
    read as pieces, each its own request, into one buffer. A ``put`` of a buffer of more
    than 5 MiB is obstore's own multipart upload, of 5 MiB parts, up to 12 at once. How
    many parts of one object are in flight at once is ``parts_in_flight`` (for a streamed
    upload and a ranged read): by default it starts at 8 and adapts between
    2 and 16 (see :class:`PartsInFlight`), growing while each part keeps its rate and
    halving when the store throttles or fails a transfer; uploads and reads adapt apart,
    and what they learn lasts as long as this adapter (reuse one across saves to keep it).
    The bytes one object holds in flight are at most ``maximum`` times the part size
    (16 x 8 MiB = 128 MiB by default for an upload, 16 x 4 MiB beside the result for a
    read), beside what the caller itself holds.

    Args:
        store: The obstore store to adapt.
        parts_in_flight: Parts of one object in flight at once: a
            :class:`PartsInFlight`, an int (that many, fixed), or None (the default,
            ``PartsInFlight()``).

    Raises:
        InvalidInputError: ``parts_in_flight`` is not an int >= 1, a
            :class:`PartsInFlight` or None.
    """

    def __new__(
        cls, store: ObjectStore | None = None, parts_in_flight: PartsInFlight | int | None = None
    ) -> Any:
        # ``store`` defaults so that unpickling, which calls ``__new__(cls)``, works.
        if isinstance(store, LocalStore):
            parts_setting(parts_in_flight)  # checked alike, though a local file has no parts
            return LocalDirectoryStore(store.prefix if store.prefix is not None else "/")
        return super().__new__(cls)

    def __init__(
        self, store: ObjectStore, parts_in_flight: PartsInFlight | int | None = None
    ) -> None:
        self._store = store
        setting = parts_setting(parts_in_flight)
        self._upload_parts = PartsController(setting)
        self._download_parts = PartsController(setting)
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

    @property
    def parts_in_flight(self) -> PartsInFlight:
        """The setting this adapter adapts within."""
        return self._upload_parts.setting

    @property
    def upload_parts(self) -> int:
        """Parts the next streamed upload will have in flight at once."""
        return self._upload_parts.limit

    @property
    def download_parts(self) -> int:
        """Pieces the next large ranged read will have in flight at once."""
        return self._download_parts.limit

    def __repr__(self) -> str:
        return f"ObstoreStore({self._store!r})"

    async def get(self, path: str) -> Blob:
        result = await _call("get", path, obstore.get_async(self._store, path))
        data = await _call("get", path, result.bytes_async())
        return Blob(data=data, info=_info(result.meta))

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        if empty_range(path, start, end):
            await self.head(path)  # obstore refuses an empty range; a missing object is missing
            return b""
        if end - start <= 2 * READ_PIECE:
            return await _call(
                "get_range", path, obstore.get_range_async(self._store, path, start=start, end=end)
            )
        return await self._get_in_pieces(path, start, end)

    async def _get_in_pieces(self, path: str, start: int, end: int) -> Buffer:
        """A large range as pieces at once (see :mod:`cairn.stores._pieces`): the first
        piece's reply head gives the object's size and e-tag, which bound and pin the rest."""
        first_end = start + READ_PIECE
        try:
            head = await _call(
                "get_range",
                path,
                obstore.get_async(self._store, path, options={"range": (start, first_end)}),
            )
        except TransientStoreError:
            self._download_parts.failed()
            raise
        first = _call("get_range", path, head.bytes_async())
        end = min(end, head.meta["size"])
        if end <= first_end:
            return await first
        e_tag = head.meta.get("e_tag")

        async def piece(a: int, b: int) -> Buffer:
            if a == start:
                return await first
            options: GetOptions = {"range": (a, b)}
            if e_tag is not None:
                options["if_match"] = e_tag
            got = await _call(
                "get_range", path, obstore.get_async(self._store, path, options=options)
            )
            return await _call("get_range", path, got.bytes_async())

        return await read_in_pieces(piece, start, end, self._download_parts, READ_PIECE)

    async def head(self, path: str) -> ObjectInfo:
        return _info(await _call("head", path, obstore.head_async(self._store, path)))

    async def put(
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: Metadata = None
    ) -> ObjectInfo:
        obstore_mode: Any = mode
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
        result = await _call(
            "put",
            path,
            obstore.put_async(
                self._store, path, data, mode=obstore_mode, attributes=self._attributes(metadata)
            ),
        )
        return ObjectInfo(
            path=path,
            size=memoryview(data).nbytes,
            e_tag=result.get("e_tag"),
            last_modified=dt.datetime.now(dt.UTC),
            version=result.get("version"),
        )

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
    ) -> None:
        controller = self._upload_parts
        in_flight = controller.limit
        sent = 0

        async def source() -> AsyncIterator[Buffer]:
            nonlocal sent
            async for chunk in open_chunks():
                sent += memoryview(chunk).nbytes
                yield chunk

        began = time.monotonic()
        try:
            await _call(
                "put",
                path,
                obstore.put_async(
                    self._store,
                    path,
                    source(),
                    attributes=self._attributes(metadata),
                    chunk_size=PART_SIZE,
                    max_concurrency=in_flight,
                ),
            )
        except TransientStoreError:
            controller.failed()
            raise
        parts = -(-sent // PART_SIZE)
        if parts > 1:  # a single part tells nothing of parts at once
            controller.completed_together(parts, sent, time.monotonic() - began, in_flight)

    def _attributes(self, metadata: Metadata) -> dict[str, str] | None:
        return dict(metadata) if metadata and self._capabilities.user_metadata else None

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
        quote = self._quote_listed_e_tags
        objects = [_info(meta, quote_e_tag=quote) for meta in result["objects"]]
        return ListDirResult(prefixes=prefixes, objects=objects)

    async def list(self, prefix: str) -> list[ObjectInfo]:
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


def as_store(
    store: Store | ObjectStore | str, parts_in_flight: PartsInFlight | int | None = None
) -> Store:
    """Accept a :class:`Store`, an obstore store, or a URL or plain path for :func:`open_store`.

    A local directory (an obstore ``LocalStore``, a ``file://`` URL, a plain path) gives
    cairn's own local store, :class:`~cairn.stores._local.LocalStore`.

    Args:
        store: A :class:`Store` (returned as is), an obstore store, or a URL or path.
        parts_in_flight: For the :class:`ObstoreStore` built here: parts of one object in
            flight at once (see :class:`PartsInFlight`); None is the default. A local
            directory has no parts and ignores it; a :class:`Store` carries its own, so
            passing both is an error.

    Returns:
        The store, as a :class:`Store`.

    Raises:
        InvalidStoreUrlError: A URL that :func:`open_store` cannot open.
        InvalidInputError: ``parts_in_flight`` is not a setting, or is given with a
            :class:`Store`.
    """
    setting = None if parts_in_flight is None else parts_setting(parts_in_flight)
    if isinstance(store, str):
        root = local_directory(store)
        if root is not None:
            return LocalDirectoryStore(root)
        return ObstoreStore(open_store(store), setting)
    if isinstance(store, Store):
        if setting is not None:
            raise InvalidInputError(
                f"parts_in_flight={parts_in_flight!r} is for a store cairn opens (a URL, a "
                f"path, an obstore store); {store!r} is a Store, which carries its own: "
                "build it as ObstoreStore(obstore_store, parts_in_flight=...)"
            )
        return store
    return ObstoreStore(store, setting)
