"""The simulated object store: a memory store whose every call is a scheduling point.

:class:`SimStore` keeps the :class:`cairn.stores.Store` contract (create-only puts and
compare-and-swaps that change nothing when they fail, listings of every object, deletes
that ignore missing objects), with two differences from a real memory store:

* no call touches the objects by itself: each hands a synchronous ``apply`` to the
  scheduler (:class:`~support.sim.scheduler.Scheduler`), which decides when it happens,
  whether it happens at all, and what the caller hears back;
* the store has a clock of its own, which only the scheduler moves: every write is
  stamped with it (``last_modified``), as S3, GCS and Azure stamp theirs, and no
  process's local clock sees it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from cairn.errors import (
    InvalidInputError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
)
from cairn.format._buffer import Buffer
from cairn.stores import Blob, IfMatch, ListDirResult, ObjectInfo, PutMode, StoreCapabilities
from cairn.stores._types import Metadata, OpenChunks

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["SimObject", "SimStore"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SimObject:
    """One stored version: its bytes, e-tag, the store's stamp and user metadata."""

    data: bytes
    e_tag: str
    last_modified: dt.datetime
    metadata: tuple[tuple[str, str], ...] = ()

    def info(self, path: str) -> ObjectInfo:
        return ObjectInfo(path, len(self.data), self.e_tag, self.last_modified)


class SimStore:
    """A :class:`~cairn.stores.Store` whose calls go through ``scheduler`` (see the module
    docstring). ``name`` tells two stores of one simulation apart in traces."""

    capabilities = StoreCapabilities(native_compare_and_swap=True, user_metadata=True)

    def __init__(self, scheduler: Scheduler, name: str = "store") -> None:
        self.scheduler = scheduler
        self.name = name
        self.objects: dict[str, SimObject] = {}
        self._versions = 0

    def __repr__(self) -> str:
        return f"SimStore({self.name!r})"

    # -- what the scheduler applies: synchronous, on the objects --------------------------

    def _stamp(self, data: bytes, metadata: Metadata) -> SimObject:
        self._versions += 1
        kept = tuple(sorted((metadata or {}).items()))
        return SimObject(bytes(data), f'"v{self._versions}"', self.scheduler.store_time(), kept)

    def _found(self, operation: str, path: str) -> SimObject:
        found = self.objects.get(path)
        if found is None:
            raise ObjectNotFoundError(operation, path)
        return found

    def write(self, path: str, data: bytes, mode: PutMode, metadata: Metadata) -> ObjectInfo:
        """Apply a put: the objects change only if ``mode`` allows it."""
        current = self.objects.get(path)
        if mode == "create" and current is not None:
            raise ObjectExistsError("put", path, "object exists")
        if isinstance(mode, IfMatch) and (current is None or current.e_tag != mode.e_tag):
            raise PreconditionFailedError("put", path, "e-tag does not match")
        stored = self._stamp(data, metadata)
        self.scheduler.oracle.before_write(self, path, current, stored)
        self.objects[path] = stored
        return stored.info(path)

    def remove(self, paths: Sequence[str]) -> None:
        """Apply a delete of ``paths`` (missing ones are not an error)."""
        for path in paths:
            current = self.objects.get(path)
            if current is not None:
                self.scheduler.oracle.before_delete(self, path, current)
                del self.objects[path]

    def listing(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``, in path order (the scheduler's order is the
        only nondeterminism a simulation has)."""
        self.scheduler.oracle.on_list(self, prefix)
        return [obj.info(p) for p, obj in sorted(self.objects.items()) if p.startswith(prefix)]

    # -- the Store protocol: each call a scheduling point ---------------------------------

    async def _call(self, operation: str, path: str, apply: Callable[[], T]) -> T:
        result: T = await self.scheduler.call(self, operation, path, apply)
        return result

    async def get(self, path: str) -> Blob:
        def apply() -> Blob:
            found = self._found("get", path)
            return Blob(found.data, found.info(path))

        return await self._call("get", path, apply)

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        if not 0 <= start <= end:
            raise InvalidInputError(f"get_range of {path!r}: start={start}, end={end}")

        def apply() -> Buffer:
            found = self._found("get_range", path)
            if start >= len(found.data) and end > start:
                raise StoreError("get_range", path, "range starts past the end")
            return found.data[start:end]

        return await self._call("get_range", path, apply)

    async def head(self, path: str) -> ObjectInfo:
        return await self._call("head", path, lambda: self._found("head", path).info(path))

    async def put(
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: Metadata = None
    ) -> ObjectInfo:
        body = bytes(data)
        return await self._call("put", path, lambda: self.write(path, body, mode, metadata))

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
    ) -> None:
        body = b"".join([bytes(chunk) async for chunk in open_chunks()])
        await self._call("put", path, lambda: self.write(path, body, "overwrite", metadata))

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        def apply() -> tuple[ObjectInfo, dict[str, str]]:
            found = self._found("head", path)
            return found.info(path), dict(found.metadata)

        return await self._call("head", path, apply)

    async def list_dir(self, prefix: str) -> ListDirResult:
        def apply() -> ListDirResult:
            prefixes: set[str] = set()
            objects: list[ObjectInfo] = []
            for info in self.listing(prefix):
                rest = info.path[len(prefix) :]
                if "/" in rest:
                    prefixes.add(prefix + rest.split("/", 1)[0] + "/")
                else:
                    objects.append(info)
            return ListDirResult(sorted(prefixes), objects)

        return await self._call("list", prefix, apply)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await self._call("list", prefix, lambda: self.listing(prefix))

    async def delete(self, paths: Sequence[str]) -> None:
        if not paths:
            return
        chosen = list(paths)
        await self._call("delete", chosen[0], lambda: self.remove(chosen))

    async def delete_prefix(self, prefix: str) -> None:
        # As obstore-backed stores do it: a listing, then a batch delete.
        await self.delete([info.path for info in await self.list(prefix)])

    def snapshot(self) -> dict[str, Any]:
        """The objects as plain data (for a trace)."""
        return {p: (len(o.data), o.e_tag) for p, o in sorted(self.objects.items())}
