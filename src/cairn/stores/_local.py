"""A local directory as a :class:`~cairn.stores.Store`: its objects are the files below it.

:class:`LocalStore` works on the file system itself, not through obstore's local store:
obstore's follows symbolic links (in listings, reads, writes and deletes), fsyncs
nothing, and has no compare-and-swap. It keeps the layout obstore's writes (an object is
the file at its path; the e-tag is the inode, the mtime in microseconds and the size, in
hex), so either can open a directory the other wrote. Reads, writes and the
compare-and-swap are here; object paths and their metadata are in
:mod:`cairn.stores._localnames`, listings and deletes in :mod:`cairn.stores._localtree`.

Invariants:

* nothing outside the root is read, written or deleted: every file is reached by
  :func:`cairn.stores._localfs.open_dirs`, which never follows a symbolic link below the root
  (the root itself may be one: the caller chose it). A link is not an object: listings
  neither report it nor descend into it; ``get``, ``get_range``, ``head`` and ``stat`` of
  a path that is a link, or passes through one, raise :class:`CheckpointNotFoundError`
  naming the link (so readers fall back as for any missing object); ``put`` and
  ``put_stream`` of such a path raise :class:`StoreError` naming the link, neither
  writing through it nor replacing it; ``delete`` of a path that is a link removes the
  link itself, and of a path through one deletes nothing; ``delete_prefix`` removes
  links as links (the prefix's own directory too, if it is one), never descending;
* a ``put`` or ``put_stream`` is atomic and durable when it returns, as a PUT to S3 is
  (:class:`cairn.stores._localfs.AtomicFile`): the bytes go to a staging file (``{name}#{n}``,
  which no listing shows, as obstore's), fsynced, renamed into place (create-only: linked,
  which fails if the name exists), then every directory from its parent up to the root
  is fsynced, so a manifest is never on disk ahead of its artifacts after a power cut. A
  write whose fsync failed raises :class:`NotDurableError` (never retried);
* ``put(mode=IfMatch(...))`` is a compare-and-swap under an OS file lock (``flock``) on
  the directory that holds the object, around read-compare-replace: it holds between the
  processes of one host (not across hosts sharing a network filesystem), and leaves no
  file of its own in the store (``native_compare_and_swap`` is False);
* ``delete`` of a missing object is not an error; a ``delete`` or ``delete_prefix`` that
  empties directories removes them too, up to (never including) the root, as an object
  store keeps no empty folders; a ``put`` whose directory such a delete removed while the
  put was making it makes it again.

obstore 0.12 exposes no fsync option for its local store; one would still not let the
writes here go, since obstore's local writer resolves paths and so follows links.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from cairn.errors import (
    CheckpointNotFoundError,
    NotDurableError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
)
from cairn.format._buffer import Buffer
from cairn.stores._localfs import (
    AtomicFile,
    Dirs,
    LinkRefused,
    SyncFailed,
    atomic_file_at,
    open_dirs,
    open_file_at,
    run_to_end,
)
from cairn.stores._localnames import object_info, object_parts, path_parts, staging_name
from cairn.stores._localtree import delete_objects, list_level, list_tree, remove_tree
from cairn.stores._translate import translate_error
from cairn.stores._types import (
    Blob,
    IfMatch,
    ListDirResult,
    ObjectInfo,
    OpenChunks,
    PutMode,
    StoreCapabilities,
    empty_range,
)

__all__ = ["LOCAL_PUT_ATTEMPTS", "LocalStore"]

T = TypeVar("T")

LOCAL_PUT_ATTEMPTS = 8
"""Tries of a put whose directory a concurrent delete keeps removing as the put makes it:
the delete of an emptied directory can remove one the put just made before its staging
file is there (once it is, the directory is not empty and stays); one removal costs one
more try."""


class _RangePastEnd(Exception):
    """A ranged read that starts at or past the end of the file (obstore: invalid range)."""


class LocalStore:
    """:class:`~cairn.stores.Store` on the files below directory ``root``, which is made if
    missing when something is written. See the module docstring for what each operation
    guarantees, and what it does with a symbolic link."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))
        self.capabilities = StoreCapabilities(local_path=self.root)

    def __repr__(self) -> str:
        return f"LocalStore({os.fspath(self.root)!r})"

    async def get(self, path: str) -> Blob:
        body, info = await self._io("get", path, _read, self.root, path)
        return Blob(data=body, info=info)

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        if empty_range(path, start, end):
            await self.head(path)  # a missing object is missing
            return b""
        try:
            return await self._io("get_range", path, _read_range, self.root, path, start, end)
        except _RangePastEnd as exc:
            raise StoreError("get_range", path, f"invalid range: {exc}") from None

    async def head(self, path: str) -> ObjectInfo:
        # Inline: a few system calls cost less than a hop to a worker thread.
        return self._now("head", path, _head, self.root, path)

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        return await self.head(path), {}

    async def put(
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: object = None
    ) -> ObjectInfo:
        # ``metadata`` is dropped: a directory keeps none (``user_metadata`` is False).
        if isinstance(mode, IfMatch):
            return await self._compare_and_swap(path, data, mode)
        status = await self._io("put", path, _put_bytes, self.root, path, data, mode == "create")
        return object_info(path, status)

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: object = None
    ) -> None:
        with self._errors("put", path):
            stack, dirs, file = _stage(self.root, path)  # inline: nothing to leak if cancelled
        with stack, self._errors("put", path):
            writeback = _Writeback(path, file.fd)
            try:
                async for chunk in open_chunks():
                    await run_to_end(file.write, chunk)
                    writeback.wrote(memoryview(chunk).nbytes)
            finally:
                await writeback.wait()  # before the descriptor can close
            writeback.check()
            await run_to_end(_commit, path, file, dirs, False)

    async def list_dir(self, prefix: str) -> ListDirResult:
        return await self._io("list", prefix, list_level, self.root, prefix)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await self._io("list", prefix, list_tree, self.root, prefix)

    async def delete(self, paths: Sequence[str]) -> None:
        if paths:
            await self._io("delete", paths[0], delete_objects, self.root, paths)

    async def delete_prefix(self, prefix: str) -> None:
        await self.delete([info.path for info in await self.list(prefix)])
        if prefix.endswith("/") and prefix.strip("/"):
            await self._io("delete", prefix, remove_tree, self.root, prefix)

    async def _compare_and_swap(self, path: str, data: Buffer, mode: IfMatch) -> ObjectInfo:
        """Compare-and-swap under an exclusive ``flock`` on the directory holding the object.

        The swaps of all objects in one directory take turns, in one process and between
        processes, and no lock file is left in the store. A swap needs the object, so its
        directory exists; one removed while this waited (its object deleted, and maybe
        made again since, a new directory) is not the one to hold: lock the one there now.
        """
        while True:
            fd = await self._io("put", path, _open_parent, self.root, path)
            if fd is None:
                raise PreconditionFailedError("put", path, "object no longer exists")
            try:  # closing the descriptor releases the lock, also when cancelled
                await _flock_exclusive(fd, path)
                if not await self._io("put", path, _holds, self.root, path, fd):
                    continue
                try:
                    current = await self.head(path)
                except CheckpointNotFoundError:
                    raise PreconditionFailedError("put", path, "object no longer exists") from None
                if current.e_tag != mode.e_tag:
                    raise PreconditionFailedError(
                        "put", path, f"e-tag is {current.e_tag}, expected {mode.e_tag}"
                    )
                return await self.put(path, data)
            finally:
                os.close(fd)

    async def _io(self, operation: str, path: str, func: Callable[..., T], *args: Any) -> T:
        """Run blocking file-system work in a thread, with our errors."""
        with self._errors(operation, path):
            return await asyncio.to_thread(func, *args)
        raise AssertionError("unreachable")  # pragma: no cover

    def _now(self, operation: str, path: str, func: Callable[..., T], *args: Any) -> T:
        with self._errors(operation, path):
            return func(*args)
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def _errors(self, operation: str, path: str) -> Iterator[None]:
        """OS errors as cairn's: a link met names the link, as a read's not-found or as a
        write's refusal."""
        try:
            yield
        except LinkRefused as exc:
            link = "/".join(path_parts(operation, path)[: exc.depth])
            if operation == "put":
                raise StoreError(
                    "put",
                    path,
                    f"{link!r} is a symbolic link; a local store neither writes through "
                    "nor replaces links (remove it)",
                ) from None
            raise ObjectNotFoundError(
                operation, path, f"object (the symbolic link {link!r} on its path is not followed)"
            ) from None
        except OSError as exc:
            raise translate_error(operation, path, exc) from exc


# -- reads -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_object(root: Path, operation: str, path: str) -> Iterator[tuple[int, os.stat_result]]:
    """The descriptor and status of the regular file at object ``path``, closed on exit.

    FileNotFoundError when it, or a directory on its way, is missing or not a regular
    file or directory; :class:`LinkRefused` when one is a symbolic link.
    """
    parts = path_parts(operation, path)
    with open_dirs(root, parts[:-1]) as dirs:
        if not parts or not dirs.complete:
            if dirs.link is not None:
                raise LinkRefused(dirs.link)
            raise FileNotFoundError(errno.ENOENT, "no such object", path)
        fd = open_file_at(dirs.fds[-1], parts[-1], len(parts))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(errno.ENOENT, "not a file", path)
            yield fd, st
        finally:
            os.close(fd)


def _read_exactly(fd: int, start: int, wanted: int) -> bytes:
    """``wanted`` bytes of ``fd`` from ``start``, in one new ``bytes`` when possible."""
    pieces: list[bytes] = []
    got = 0
    while got < wanted:  # pread returns at most about 2 GiB at once
        piece = os.pread(fd, min(wanted - got, 1 << 30), start + got)
        if not piece:
            raise OSError(errno.EIO, f"the file ended at {start + got} while being read")
        pieces.append(piece)
        got += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _read(root: Path, path: str) -> tuple[bytes, ObjectInfo]:
    """The whole object and the metadata of the version read (a rename replacing it
    meanwhile does not mix versions: the descriptor holds the old file)."""
    with _open_object(root, "get", path) as (fd, st):
        return _read_exactly(fd, 0, st.st_size), object_info(path, st)


def _read_range(root: Path, path: str, start: int, end: int) -> bytes:
    """Bytes ``start`` up to ``end`` (clamped to the size, as obstore does), by ``pread``:
    a third of the CPU of obstore's local ranged read, which a streamed restore pays on
    top of hashing and writing. :class:`_RangePastEnd` when ``start`` is not below the
    size."""
    with _open_object(root, "get_range", path) as (fd, st):
        if start >= st.st_size:
            raise _RangePastEnd(f"the range starts at {start}, the object has {st.st_size} bytes")
        return _read_exactly(fd, start, min(end, st.st_size) - start)


def _head(root: Path, path: str) -> ObjectInfo:
    with _open_object(root, "head", path) as (_, st):
        return object_info(path, st)


# -- writes ----------------------------------------------------------------------------------


WRITEBACK_BYTES = 32 * 1024 * 1024
"""A streamed put starts flushing what it wrote to disk (an ``fdatasync`` on a worker
thread, one at a time) each time this many more bytes are written, so that the disk
writes while the rest arrives instead of all at the final fsync, which then has little
left to flush."""


class _Writeback:
    """The early flushes of one streamed put (see :data:`WRITEBACK_BYTES`).

    A flush that fails fails the put with :class:`NotDurableError`: after a failed
    ``fdatasync`` a later fsync may report success without the bytes on disk, so the
    final fsync alone cannot be trusted then.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd = path, fd
        self.unflushed = 0
        self.flushing: asyncio.Future[None] | None = None

    def wrote(self, size: int) -> None:
        """Count ``size`` more bytes written; start a flush when enough are waiting and
        none is running (raising the failure of one that ended)."""
        self.unflushed += size
        if self.unflushed < WRITEBACK_BYTES:
            return
        if self.flushing is not None:
            if not self.flushing.done():
                return
            self.flushing.result()
        self.unflushed = 0
        self.flushing = asyncio.ensure_future(run_to_end(self._flush))

    def _flush(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise NotDurableError(
                "put", self.path, f"not written: not made durable: {exc}"
            ) from exc

    async def wait(self) -> None:
        """Wait for the flush in flight, if any, to end."""
        if self.flushing is not None:
            await asyncio.wait([self.flushing])

    def check(self) -> None:
        """Raise the failure of the last flush, if it failed (once it ended)."""
        if self.flushing is not None:
            self.flushing.result()


def _stage(root: Path, path: str) -> tuple[contextlib.ExitStack, Dirs, AtomicFile]:
    """A staging file for object ``path`` in its directory (made if missing), with the
    descriptors of the directories on its way; the stack closes them all and removes the
    staging file unless it was committed. Tries again while a concurrent delete removes a
    directory this just made (see :data:`LOCAL_PUT_ATTEMPTS`)."""
    parts = object_parts("put", path)
    for attempt in range(1, LOCAL_PUT_ATTEMPTS + 1):
        stack = contextlib.ExitStack()
        try:
            staged = atomic_file_at(root, parts, staging_name, create=True)
            file, dirs = stack.enter_context(staged)
            return stack, dirs, file
        except FileNotFoundError as exc:
            stack.close()
            if isinstance(exc, LinkRefused):
                raise
            if attempt == LOCAL_PUT_ATTEMPTS:
                raise StoreError(
                    "put", path, f"a directory on its way kept vanishing as it was made: {exc}"
                ) from exc
        except BaseException:
            stack.close()
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _commit(path: str, file: AtomicFile, dirs: Dirs, exclusive: bool) -> os.stat_result:
    """Name the staged file durably (create-only: :class:`ObjectExistsError` if the name
    is taken); an fsync that fails is :class:`NotDurableError`."""
    try:
        return file.commit(dirs.fds, exclusive=exclusive)
    except FileExistsError:
        raise ObjectExistsError("put", path, "the object already exists") from None
    except SyncFailed as exc:
        done = "written, but" if exc.named else "not written:"
        raise NotDurableError("put", path, f"{done} not made durable: {exc}") from exc


def _put_bytes(root: Path, path: str, data: Buffer, exclusive: bool) -> os.stat_result:
    stack, dirs, file = _stage(root, path)
    with stack:
        file.write(memoryview(data))
        return _commit(path, file, dirs, exclusive)


# -- the compare-and-swap lock ---------------------------------------------------------------


def _open_parent(root: Path, path: str) -> int | None:
    """A new descriptor of the directory that holds object ``path`` (reached without
    following a link); None if it, or one on its way, is missing or a link."""
    parts = object_parts("put", path)
    with open_dirs(root, parts[:-1]) as dirs:
        return os.dup(dirs.fds[-1]) if dirs.complete else None


def _holds(root: Path, path: str, dir_fd: int) -> bool:
    """Whether ``dir_fd`` is still the directory at the place of object ``path``'s parent:
    not one removed since it was opened (and maybe made again, a new directory)."""
    parts = object_parts("put", path)
    with open_dirs(root, parts[:-1]) as dirs:
        if not dirs.complete:
            return False
        now, held = os.fstat(dirs.fds[-1]), os.fstat(dir_fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


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
