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
        return CheckpointNotFoundError(path)
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


def _info(meta: Any) -> ObjectInfo:
    return ObjectInfo(
        path=meta["path"],
        size=meta["size"],
        e_tag=meta.get("e_tag"),
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


class ObstoreStore:
    """:class:`Store` over an obstore store (memory, local, S3, GCS, Azure, HTTP).

    Over a local directory, symbolic links below the root are never followed: see the
    module docstring for what each operation does with one.
    """

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._local_root: Path | None = None
        self._local_cleanup = False
        if isinstance(store, LocalStore):
            self._local_root = store.prefix if store.prefix is not None else Path("/")
            # obstore exposes its options only through the pickle protocol.
            pickled = getattr(store, "__getnewargs_ex__", None)
            options: dict[str, Any] = pickled()[1] if pickled is not None else {}
            self._local_cleanup = bool(options.get("automatic_cleanup", False))

    @property
    def obstore(self) -> ObjectStore:
        """The wrapped obstore store."""
        return self._store

    def __repr__(self) -> str:
        return f"ObstoreStore({self._store!r})"

    def _local_link(self, operation: str, path: str) -> str | None:
        """The first component of ``path`` that is a symbolic link (None if none).

        One ``lstat`` per component, stopping at the first missing one. Run inline: a
        few system calls cost less than a hop to a worker thread.
        """
        assert self._local_root is not None
        current = os.fspath(self._local_root)
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
        if self._local_root is None:
            return
        link = self._local_link(operation, path)
        if link is not None:
            raise CheckpointNotFoundError(
                path, f"object (the symbolic link {link!r} on its path is not followed)"
            )

    def _check_writable(self, path: str) -> None:
        if self._local_root is None:
            return
        link = self._local_link("put", path)
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
        self._check_readable("get_range", path)
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
        self._check_writable(path)
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
        self._check_readable("head", path)
        result = await _call(
            "head", path, obstore.get_async(self._store, path, options={"head": True})
        )
        return _info(result.meta), {str(k): str(v) for k, v in result.attributes.items()}

    async def list_dir(self, prefix: str) -> ListDirResult:
        if self._local_root is not None:
            return await _local_io("list", prefix, _local_list_dir, self._local_root, prefix)
        result = await _call(
            "list", prefix, obstore.list_with_delimiter_async(self._store, prefix or None)
        )
        prefixes = [p if p.endswith("/") else p + "/" for p in result["common_prefixes"]]
        return ListDirResult(prefixes=prefixes, objects=[_info(m) for m in result["objects"]])

    async def list(self, prefix: str) -> list[ObjectInfo]:
        if self._local_root is not None:
            # obstore's local listing follows links (outside the root, and into loops).
            return await _local_io("list", prefix, _local_list, self._local_root, prefix)
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
        if self._local_root is not None:
            # obstore's local delete resolves the path, following links in its parents.
            await _local_io(
                "delete", paths[0], _local_delete, self._local_root, paths, self._local_cleanup
            )
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
        if self._local_root is not None and prefix.endswith("/") and prefix.strip("/"):
            await _local_io("delete", prefix, _local_remove_tree, self._local_root, prefix)

    async def _local_compare_and_swap(self, path: str, data: Buffer, mode: IfMatch) -> ObjectInfo:
        assert self._local_root is not None
        # Joined by parts: a leading "/" (which obstore ignores) must not leave the root.
        target = self._local_root.joinpath(*_local_parts("put", path))
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
