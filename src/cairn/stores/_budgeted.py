"""The store that paces a checkpointer's requests by its store's shared request budget.

Invariant: every attempt of every call reserves its requests and bytes
(:class:`~cairn.stores.budget.RequestBudget` says what counts) from the store's
:class:`~cairn.stores.budget.SharedBudget` before it is sent. This store sits beneath the
retrying one, so that each retry takes its tokens again, and above the observing one, so
that the time spent waiting for a turn is not reported as the request's latency.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

from cairn.format._buffer import Buffer
from cairn.stores import (
    PART_SIZE,
    Blob,
    ForwardingStore,
    ListDirResult,
    ObjectInfo,
    PutMode,
    Store,
    StoreMethod,
)
from cairn.stores._types import Metadata, OpenChunks, StoreCall
from cairn.stores.budget import SharedBudget

__all__ = ["BudgetedStore"]

T = TypeVar("T")

_LIST_PAGE = 1000
"""Entries per page of a listing, and paths per batch of a delete (S3's and Azure's)."""


def _pages(entries: int) -> int:
    """Requests that a listing of ``entries`` entries, or a delete of that many paths, took."""
    return max(1, -(-entries // _LIST_PAGE))


def _parts_begun(sent: int) -> int:
    """Parts of a multipart upload past the first that ``sent`` bytes have begun."""
    return (sent - 1) // PART_SIZE if sent > 0 else 0


class BudgetedStore(ForwardingStore):
    """A store whose every call first waits for its turn in ``budget``.

    Args:
        inner: The store every call goes to.
        budget: The shared budget of the store ``inner`` reaches.
    """

    def __init__(self, inner: Store, budget: SharedBudget) -> None:
        super().__init__(inner)
        self.budget = budget

    def __repr__(self) -> str:
        return f"BudgetedStore({self.inner!r}, {self.budget!r})"

    async def _around(
        self, operation: StoreMethod, path: str, call: StoreCall[T], *, mode: PutMode | None = None
    ) -> T:
        await self.budget.take(1)
        return await call()

    async def get(self, path: str) -> Blob:
        blob = await super().get(path)
        self.budget.charge(0, memoryview(blob.data).nbytes)
        return blob

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        await self.budget.take(1, max(0, end - max(0, start)))
        return await self.inner.get_range(path, start, end)

    async def put(
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: Metadata = None
    ) -> ObjectInfo:
        await self.budget.take(1, memoryview(data).nbytes)
        return await self.inner.put(path, data, mode=mode, metadata=metadata)

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
    ) -> None:
        def paced_chunks() -> AsyncIterator[Buffer]:
            return self._paced(open_chunks())

        await self.budget.take(1)  # the upload's start
        await self.inner.put_stream(path, paced_chunks, metadata=metadata)

    async def _paced(self, chunks: AsyncIterator[Buffer]) -> AsyncIterator[Buffer]:
        """``chunks``, each handed on once its bytes, and the part it completes, may go."""
        sent = 0
        async for chunk in chunks:
            size = memoryview(chunk).nbytes
            parts = _parts_begun(sent + size) - _parts_begun(sent)
            sent += size
            await self.budget.take(parts, size)
            yield chunk
        await self.budget.take(2)  # the last part and the completion

    async def list_dir(self, prefix: str) -> ListDirResult:
        found = await super().list_dir(prefix)
        self.budget.charge(_pages(len(found.prefixes) + len(found.objects)) - 1, 0)
        return found

    async def list(self, prefix: str) -> list[ObjectInfo]:
        found = await super().list(prefix)
        self.budget.charge(_pages(len(found)) - 1, 0)
        return found

    async def delete(self, paths: Sequence[str]) -> None:
        if paths:
            await self.budget.take(_pages(len(paths)))
        await self.inner.delete(paths)

    async def delete_prefix(self, prefix: str) -> None:
        await self.budget.take(2)
        await self.inner.delete_prefix(prefix)
