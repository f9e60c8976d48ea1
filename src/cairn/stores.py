"""The object-store boundary: the operations cairn needs, over obstore, with our errors.

:class:`Store` is the small async protocol the checkpointer calls. :class:`ObstoreStore`
implements it over any obstore store; tests and users may pass their own implementation
(a wrapper that counts calls, delays or injects faults) wherever a store is accepted.
:class:`ForwardingStore` is the base of such wrappers: it forwards every operation to an
inner store through one hook. A store may declare :class:`StoreCapabilities` (read them
with :func:`capabilities_of`); code that must treat backends differently asks for the
capability it needs, never for a backend type. :mod:`cairn.testing` holds the contract
every store and wrapper passes.

Invariants kept at this boundary:

* no obstore (or OS) exception escapes: each is translated into a :mod:`cairn.errors`
  type that names the operation and the path (:func:`translate_error`);
* failures worth retrying (connection errors, timeouts, 5xx, throttling) are
  :class:`TransientStoreError`; not-found, permission, precondition and already-exists
  never are;
* ``put(mode=IfMatch(...))`` is a compare-and-swap on every backend. obstore's local
  store has no conditional update (``native_compare_and_swap`` is False), so for
  ``file://`` stores it is done under an OS file lock (``fcntl.flock``) on a sidecar
  ``.{name}.lock`` file next to the object, around read-compare-replace, where the
  replace is obstore's atomic rename. That holds between processes on one host (not
  across hosts sharing a network filesystem);
* ``delete`` of a missing object is not an error;
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
  Listing and deleting walk directory descriptors opened with ``O_NOFOLLOW``, so a
  directory swapped for a link mid-walk is not followed either. Reads and writes go
  through obstore after a ``lstat`` of each path component below the root: a link
  swapped in between that check and obstore's own open is the remaining window.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import fcntl
import itertools
import os
import re
import shutil
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
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
from obstore.store import (
    AzureStore,
    GCSStore,
    LocalStore,
    MemoryStore,
    ObjectStore,
    S3Store,
    from_url,
)

from cairn import _shutdown
from cairn._buffer import Buffer
from cairn.errors import (
    CheckpointerError,
    CheckpointNotFoundError,
    InvalidInputError,
    InvalidStoreUrlError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
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
# Capabilities, and the base of store wrappers


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """What a store declares about how it does the :class:`Store` operations.

    Every store does every operation, with the meaning the protocol states; a capability
    says *how*, where backends differ in a way a caller or the store contract must know.
    The defaults claim nothing: they are what :func:`capabilities_of` assumes of a store
    that declares none.

    * ``native_compare_and_swap``: ``put(mode=IfMatch(...))`` is done by the backend
      itself, atomically for every client. False where cairn emulates it (a local
      directory, under an OS file lock that holds between the processes of one host
      only) or cannot tell.
    * ``user_metadata``: ``put``'s ``metadata`` is stored and :meth:`Store.stat` returns
      it. Where False, it is dropped.
    * ``local_path``: for a store whose objects are the files below a local directory,
      that directory. Symbolic links can appear there, and are never followed (see this
      module's docstring). None for every other store.
    """

    native_compare_and_swap: bool = False
    user_metadata: bool = False
    local_path: Path | None = None


def capabilities_of(store: object) -> StoreCapabilities:
    """The :class:`StoreCapabilities` that ``store`` declares as ``capabilities``.

    A store without that attribute (or with one of another type) gets
    ``StoreCapabilities()``, which claims nothing.
    """
    declared = getattr(store, "capabilities", None)
    return declared if isinstance(declared, StoreCapabilities) else StoreCapabilities()


StoreMethod = Literal[
    "get",
    "get_range",
    "head",
    "put",
    "put_stream",
    "stat",
    "list_dir",
    "list",
    "delete",
    "delete_prefix",
]
"""The name of one :class:`Store` method, as :meth:`ForwardingStore._around` receives it."""


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
        open_chunks: Callable[[], AsyncIterator[bytes]],
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

_DEBUG_SOURCE = "\n\nDebug source:\n"
_REQUEST_ERROR = re.compile(r"\b(Status|Response) \{\n[ \t]*status: (\d{3}),\n")
_HTTP_ERROR = re.compile(r"\bHttpError \{\n[ \t]*kind: (\w+),\n")
_S3_ERROR_CODE = re.compile(r"<Code>(\w+)</Code>")

_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Request Timeout, Too Many Requests (throttling), and the server-side 5xx that mean
"try again": internal error, bad gateway, service unavailable (S3's SlowDown), gateway
timeout. 501 and 505 are permanent; other 4xx are the request's own fault."""

_TRANSIENT_HTTP_KINDS = frozenset({"Connect", "Request", "Timeout", "Interrupted"})
"""The HttpErrorKinds object_store itself retries: no connection, a request that could
not be sent, a timeout, a connection reset or closed mid-exchange. object_store retries
the last two only for idempotent requests; every :class:`Store` call is safe to repeat
(see :mod:`cairn.retry`). ``Decode`` (an unparseable response) and ``Unknown`` are not
retried, by either."""

_TRANSIENT_S3_CODES = frozenset({"RequestTimeout"})
"""S3 error codes (the ``<Code>`` of its XML error document) that are transient although
their status is not: ``400 RequestTimeout`` (the socket was idle too long mid-upload)."""


@dataclass(frozen=True, slots=True)
class _Failure:
    """What obstore's Debug form says about a failed HTTP exchange."""

    status: int | None = None  # the status the server answered, if it answered
    error_in_success: bool = False  # S3's 200 response whose body is an error
    kind: str | None = None  # HttpErrorKind, if no response came back
    s3_code: str | None = None  # the S3 error code in the response body, if any


def _http_failure(exc: BaseException) -> _Failure:
    debug = str(exc).rpartition(_DEBUG_SOURCE)[2]
    request_error = _REQUEST_ERROR.search(debug)
    if request_error is not None:
        code = _S3_ERROR_CODE.search(debug, request_error.end())
        return _Failure(
            status=int(request_error.group(2)),
            error_in_success=request_error.group(1) == "Response",
            s3_code=code.group(1) if code else None,
        )
    http_error = _HTTP_ERROR.search(debug)
    return _Failure(kind=http_error.group(1) if http_error else None)


def _is_transient(failure: _Failure) -> bool:
    if failure.error_in_success:
        # object_store raises Response only for a 2xx whose body is an S3 InternalError
        # or SlowDown, which it retries like a 5xx.
        return True
    if failure.status is not None:
        return failure.status in _TRANSIENT_STATUSES or (
            failure.status == 400 and failure.s3_code in _TRANSIENT_S3_CODES
        )
    return failure.kind in _TRANSIENT_HTTP_KINDS


def _first_line(exc: BaseException) -> str:
    text = str(exc).split("\n\nDebug source:", 1)[0].strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate_error(operation: str, path: str, exc: BaseException) -> CheckpointerError:
    """The :mod:`cairn.errors` error for an exception raised by obstore (or the OS).

    Classified by kind, then by HTTP status, never by the wording of the message:
    obstore's not-found, already-exists, precondition, permission, authentication and
    not-supported classes map to their own errors; Python's ``TimeoutError`` and
    ``ConnectionError`` are transient; for any other obstore error (or OS error) the
    status or connection-failure kind recorded in obstore's structured Debug form
    decides: 408, 429, 500, 502, 503, 504 (and S3's ``400 RequestTimeout``, and S3's
    200 carrying an error) and connect, send, timeout and interrupted failures are
    :class:`TransientStoreError`; everything else is a plain :class:`StoreError`. The
    HTTP status, when there was one, is kept as ``status`` on the error.
    """
    if isinstance(exc, CheckpointerError):
        return exc
    reason = _first_line(exc)
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(operation, path)
    failure = _http_failure(exc) if isinstance(exc, BaseError | OSError) else _Failure()
    status = failure.status
    if isinstance(exc, AlreadyExistsError):
        return ObjectExistsError(operation, path, reason, status=status)
    if isinstance(exc, PreconditionError):
        return PreconditionFailedError(operation, path, reason, status=status)
    if isinstance(
        exc, PermissionDeniedError | UnauthenticatedError | NotSupportedError | NotImplementedError
    ):
        return StoreError(operation, path, reason, status=status)
    if isinstance(exc, TimeoutError | ConnectionError) or _is_transient(failure):
        return TransientStoreError(operation, path, reason, status=status)
    return StoreError(operation, path, reason, status=status)


async def _call(operation: str, path: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except (BaseError, OSError, NotImplementedError) as exc:
        raise translate_error(operation, path, exc) from exc
    finally:
        _shutdown.note_store_call()


def _info(meta: Any, *, quote_e_tag: bool = False) -> ObjectInfo:
    e_tag = meta.get("e_tag")
    if quote_e_tag and e_tag is not None and not e_tag.startswith(('"', "W/")):
        e_tag = f'"{e_tag}"'
    return ObjectInfo(
        path=meta["path"],
        size=meta["size"],
        e_tag=e_tag,
        last_modified=meta["last_modified"],
    )


# ---------------------------------------------------------------------------------------
# Local directories: symbolic links below the root are never followed

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What open(O_NOFOLLOW) reports for a link: ELOOP on Linux and macOS, EMLINK on FreeBSD;
# with O_DIRECTORY too, Linux reports ENOTDIR (as for any other non-directory).
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _local_parts(operation: str, path: str) -> list[str]:
    """The components of an object path, as obstore parses them; StoreError if invalid."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    for part in parts:
        if part in ("", ".", "..") or "\x00" in part:
            raise StoreError(operation, path, f"not a valid object path (segment {part!r})")
    return parts


def _is_staging(name: str) -> bool:
    # obstore's local store writes ``{name}#{n}`` and renames it into place; it never
    # lists such a name nor lets one be addressed (the suffix after the first ``#``).
    _, hash_sign, suffix = name.partition("#")
    return bool(hash_sign) and suffix.isascii() and suffix.isdigit()


def _local_info(path: str, st: os.stat_result) -> ObjectInfo:
    # The same metadata obstore's local store reports (its e-tag is inode, mtime in
    # microseconds and size, in hex), so a listing and a HEAD agree.
    micros = st.st_mtime_ns // 1000
    return ObjectInfo(
        path=path,
        size=st.st_size,
        e_tag=f'"{st.st_ino:x}-{max(micros, 0):x}-{st.st_size:x}"',
        last_modified=_EPOCH + dt.timedelta(microseconds=micros),
    )


def _open_nofollow_dir(name: str, dir_fd: int) -> int | None:
    """A descriptor of directory ``name`` in ``dir_fd``; None if missing, not a dir, a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            return None
        raise


@contextlib.contextmanager
def _local_dirs(root: Path, parts: Sequence[str]) -> Iterator[list[int]]:
    """Descriptors of ``root`` and of each directory ``parts`` names below it, in order.

    The walk stops at the first part that is missing, not a directory, or a symbolic
    link: the list is complete (``len(parts) + 1``) only if every part is a real
    directory. Empty if the root itself is missing. All are closed on exit.
    """
    fds: list[int] = []
    try:
        with contextlib.suppress(FileNotFoundError):
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in parts:
                fd = _open_nofollow_dir(part, fds[-1])
                if fd is None:
                    break
                fds.append(fd)
        yield fds
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _scan_tree(dir_fd: int, key: str, found: list[ObjectInfo]) -> None:
    """Append every regular file under ``dir_fd`` (whose object path is ``key``)."""
    subdirs: list[tuple[str, str]] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            name = entry.name
            if entry.is_symlink() or not _utf8(name):
                continue
            child = f"{key}/{name}" if key else name
            if entry.is_dir(follow_symlinks=False):
                subdirs.append((name, child))
            elif entry.is_file(follow_symlinks=False) and not _is_staging(name):
                try:
                    found.append(_local_info(child, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue  # deleted since the scan
    for name, child in subdirs:
        fd = _open_nofollow_dir(name, dir_fd)
        if fd is None:
            continue  # deleted, or replaced by a link, since the scan
        try:
            _scan_tree(fd, child, found)
        finally:
            os.close(fd)


def _utf8(name: str) -> bool:
    # A name that is not UTF-8 (decoded with surrogate escapes) is no object path.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _local_list(root: Path, prefix: str) -> list[ObjectInfo]:
    parts = _local_parts("list", prefix)
    found: list[ObjectInfo] = []
    with _local_dirs(root, parts) as fds:
        if len(fds) == len(parts) + 1:
            _scan_tree(fds[-1], "/".join(parts), found)
    return found


def _local_list_dir(root: Path, prefix: str) -> ListDirResult:
    parts = _local_parts("list", prefix)
    key = "/".join(parts)
    prefixes: list[str] = []
    objects: list[ObjectInfo] = []
    with _local_dirs(root, parts) as fds:
        if len(fds) == len(parts) + 1:
            with os.scandir(fds[-1]) as entries:
                for entry in entries:
                    name = entry.name
                    if entry.is_symlink() or not _utf8(name):
                        continue
                    child = f"{key}/{name}" if key else name
                    if entry.is_dir(follow_symlinks=False):
                        prefixes.append(child + "/")
                    elif entry.is_file(follow_symlinks=False) and not _is_staging(name):
                        with contextlib.suppress(FileNotFoundError):
                            objects.append(_local_info(child, entry.stat(follow_symlinks=False)))
    objects.sort(key=lambda info: info.path)
    return ListDirResult(prefixes=sorted(prefixes), objects=objects)


def _local_delete(root: Path, paths: Sequence[str], cleanup: bool) -> None:
    """Unlink each path's final name in its parent, opened without following links."""
    split = sorted((_local_parts("delete", path), path) for path in paths)
    for parts, path in split:
        if not parts:
            raise StoreError("delete", path, "not an object path")
        if _is_staging(parts[-1]):
            raise StoreError("delete", path, "a name ending in '#<digits>' is no object")
    for parent, group in itertools.groupby(split, key=lambda item: item[0][:-1]):
        with _local_dirs(root, parent) as fds:
            for parts, path in group:
                if len(fds) != len(parts):
                    continue  # a parent is missing or a link: no such object here
                try:
                    os.unlink(parts[-1], dir_fd=fds[-1])  # a link is unlinked, not followed
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise translate_error("delete", path, exc) from exc
                if cleanup:  # as obstore's automatic_cleanup: drop emptied parents
                    for depth in range(len(parts) - 1, 0, -1):
                        try:
                            os.rmdir(parts[depth - 1], dir_fd=fds[depth - 1])
                        except OSError:
                            break


def _local_remove_tree(root: Path, prefix: str) -> None:
    """Remove directory ``prefix`` and all in it; a link there is removed as a link."""
    parts = _local_parts("delete", prefix)
    with _local_dirs(root, parts[:-1]) as fds:
        if len(fds) != len(parts):
            return  # a parent is missing or a link: nothing of ours under the prefix
        name, parent_fd = parts[-1], fds[-1]
        try:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                os.unlink(name, dir_fd=parent_fd)
            elif stat.S_ISDIR(mode):
                # With dir_fd, rmtree opens each level relative to its parent and refuses
                # (rather than follows) a link, also one swapped in while it runs.
                shutil.rmtree(name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise translate_error("delete", prefix, exc) from exc


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
        self._local_cleanup = False
        # Azure's List Blobs gives each ETag without the quotes that its HEAD, GET and PUT
        # replies (and so head, get and put here) give: one e-tag, one spelling.
        self._quote_listed_e_tags = isinstance(store, AzureStore)
        if isinstance(store, LocalStore):
            # obstore exposes its options only through the pickle protocol.
            pickled = getattr(store, "__getnewargs_ex__", None)
            options: dict[str, Any] = pickled()[1] if pickled is not None else {}
            self._local_cleanup = bool(options.get("automatic_cleanup", False))

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
        self._check_readable("get", path)
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
        self._check_readable("get_range", path)
        if start == end:
            await self.head(path)  # obstore refuses an empty range; a missing object is missing
            return b""
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
            obstore_mode = {"e_tag": mode.e_tag}
            if mode.version is not None:  # obstore rejects an explicit None version
                obstore_mode["version"] = mode.version
        else:
            obstore_mode = mode
        attributes = dict(metadata) if metadata and capabilities.user_metadata else None
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
        self._check_writable(path)
        attributes = dict(metadata) if metadata and self._capabilities.user_metadata else None
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
            await _local_io("delete", paths[0], _local_delete, root, paths, self._local_cleanup)
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
        """Compare-and-swap under an OS file lock, for a directory without a native one."""
        # Joined by parts: a leading "/" (which obstore ignores) must not leave the root.
        target = root.joinpath(*_local_parts("put", path))
        lock_path = target.with_name(f".{target.name}.lock")

        def acquire() -> int:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a link planted at the lock's name must not create or open a file
            # elsewhere (ELOOP, reported as a StoreError).
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(lock_path, flags, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            return fd

        try:
            fd = await asyncio.to_thread(acquire)
        except OSError as exc:
            if exc.errno in _LINK_ERRNOS:
                raise StoreError(
                    "put", path, f"its lock file {lock_path.name!r} is a symbolic link (remove it)"
                ) from None
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


async def _local_io(operation: str, path: str, func: Callable[..., T], *args: Any) -> T:
    """Run blocking local file-system work in a thread, with our errors."""
    try:
        return await asyncio.to_thread(func, *args)
    except OSError as exc:
        raise translate_error(operation, path, exc) from exc
    finally:
        _shutdown.note_store_call()


def as_store(store: Store | ObjectStore | str) -> Store:
    """Accept a :class:`Store`, an obstore store, or a URL or plain path for :func:`open_store`."""
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
_S3_SCHEMES = frozenset({"s3", "s3a"})
_URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_URL_SHAPES = {
    "memory": "memory://",
    "file": "an absolute path: file:///abs/dir",
    "s3": "s3://bucket/prefix",
    "s3a": "s3a://bucket/prefix",
    "gs": "gs://bucket/prefix",
    "http": "http://host/path",
    "https": "https://host/path",
}


def store_url(location: str) -> str:
    """The URL of a store ``location``: a URL as given, a plain path as a ``file://`` URL.

    A location with no scheme is a local directory, made absolute against the current
    directory (``~`` expanded): ``checkpoints``, ``./dir``, ``/abs/dir``. A location that
    starts with a scheme (``s3:``) must be a URL: the scheme followed by ``//``. Anything
    else raises :class:`InvalidStoreUrlError` naming the location, with the same message
    wherever it is met (:func:`open_store`, the checkpointers, the ``cairn`` command):
    ``s3:/x`` is a malformed URL, not a directory. A local directory whose name has a
    colon is written with a slash first (``./a:b``).
    """
    if not isinstance(location, str):
        raise InvalidStoreUrlError(repr(location), "a store URL must be a string")
    if not location.strip():
        raise InvalidStoreUrlError(location, "the store URL is empty")
    scheme = _URL_SCHEME.match(location)
    if scheme is None:
        return Path(os.path.abspath(os.path.expanduser(location))).as_uri()
    name = scheme.group(1).lower()
    slashes = location[scheme.end() :].startswith("//")
    if name not in _REMOTE_SCHEMES and name not in ("memory", "file"):
        hint = "" if slashes else f" (a local directory named so is written ./{location})"
        raise InvalidStoreUrlError(
            location, f"unknown scheme {scheme.group(1)!r}; use memory, file, s3, gs or az{hint}"
        )
    if not slashes:
        shape = _URL_SHAPES.get(name, f"{name}://container/prefix")
        raise InvalidStoreUrlError(
            location, f"malformed URL: {scheme.group(0)} must be followed by // ({shape})"
        )
    return location


_S3_ENDPOINT_KEYS = (
    "aws_endpoint_url_s3",
    "endpoint_url_s3",
    "aws_endpoint_url",
    "endpoint_url",
    "aws_endpoint",
    "endpoint",
)


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _check_plain_http(url: str, options: Mapping[str, Any]) -> None:
    """Refuse an S3 endpoint over plain HTTP unless HTTP is allowed, before any request.

    object_store refuses such requests one by one with a bare "builder error"; the
    setting that allows them is named here instead.
    """
    lowered = {key.lower(): value for key, value in options.items()}
    config = lowered.get("config")
    if isinstance(config, Mapping):
        lowered = {**{key.lower(): value for key, value in config.items()}, **lowered}
    endpoint = next(
        (value for key in _S3_ENDPOINT_KEYS if isinstance(value := lowered.get(key), str)),
        None,
    )
    if endpoint is None:
        endpoint = next(
            (
                value
                for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
                if (value := os.environ.get(name))
            ),
            None,
        )
    if endpoint is None or not endpoint.lower().startswith("http://"):
        return
    client = lowered.get("client_options")
    allowed = isinstance(client, Mapping) and _flag(
        {key.lower(): value for key, value in client.items()}.get("allow_http", False)
    )
    if allowed or _flag(os.environ.get("AWS_ALLOW_HTTP", "")):
        return
    raise InvalidStoreUrlError(
        url,
        f"the S3 endpoint {endpoint} is plain HTTP, which is refused unless allowed: set "
        "AWS_ALLOW_HTTP=true (or pass client_options={'allow_http': True}), or use https://",
    )


def open_store(url: str, **options: Any) -> ObjectStore:
    """Open the obstore store a URL (or a plain path) names; ``options`` go to obstore.

    ``memory://`` (a new, empty in-memory store), ``file:///abs/dir`` or a plain path
    such as ``./dir`` (a local directory, created if missing), ``s3://bucket/prefix``,
    ``gs://bucket/prefix``, ``az://container/prefix`` (and the other URL forms obstore
    knows for those services). An unknown scheme or a malformed URL raises
    :class:`InvalidStoreUrlError` naming the URL (see :func:`store_url`), as does an S3
    endpoint over plain HTTP while HTTP is not allowed (``AWS_ALLOW_HTTP``).
    """
    url = store_url(url)
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
    if not parts.netloc:
        raise InvalidStoreUrlError(url, "missing bucket or container name")
    if scheme in _S3_SCHEMES:
        _check_plain_http(url, options)
    options.setdefault("retry_config", DEFAULT_CLIENT_RETRY)
    try:
        return from_url(url, **options)
    except (BaseError, ValueError, TypeError) as exc:
        raise InvalidStoreUrlError(url, _first_line(exc)) from None


_MISSING_CONTAINER_CODES = {
    "NoSuchBucket": "bucket",
    "ContainerNotFound": "container",
}


def explain_store_error(exc: BaseException, url: str | None = None) -> str | None:
    """One line saying what is wrong and what to do, for store failures a newcomer meets.

    Today: a bucket (S3's ``NoSuchBucket``) or container (Azure's ``ContainerNotFound``)
    that does not exist, read from the error code in the response that obstore kept in
    the cause of ``exc``; ``url`` is the store's, to name it. None when there is nothing
    better to say than ``str(exc)``.
    """
    if not isinstance(exc, StoreError) or exc.__cause__ is None:
        return None
    code = _http_failure(exc.__cause__).s3_code
    what = _MISSING_CONTAINER_CODES.get(code or "")
    if what is None:
        return None
    of = f" of {url}" if url else ""
    return (
        f"the {what}{of} does not exist (the store answered {exc.status or 404} {code} to "
        f"{exc.operation} {exc.path!r}): create it, or correct the {what} name in the URL"
    )


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
