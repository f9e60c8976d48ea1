"""The store every checkpointer's requests pass: counted, and reported to its observers.

Invariant: each attempt of a store call is one request (this store sits beneath the
retrying one), counted in every open counter (:func:`cairn.observe._dispatch.counting_requests`).
With observers, a write reports the bytes of its body it sent: all of a ``put``'s, and
the chunks a ``put_stream`` attempt handed on before it ended.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from cairn.errors import (
    CheckpointNotFoundError,
    ObjectExistsError,
    PreconditionFailedError,
    TransientStoreError,
)
from cairn.format._buffer import Buffer
from cairn.observe import Observer
from cairn.observe._dispatch import note_request, store_call
from cairn.stores import ForwardingStore, ObjectInfo, PutMode, Store, StoreMethod
from cairn.stores._types import Metadata, OpenChunks

__all__ = ["ObservedStore"]

T = TypeVar("T")

_sent: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "cairn_sent_bytes", default=None
)
"""The bytes the write in progress in this task has sent so far (a one-item list), or
None outside a write: set by :meth:`ObservedStore.put` and ``put_stream``, read when the
request ends."""


class ObservedStore(ForwardingStore):
    """A store that counts every request (:func:`counting_requests`) and reports it to
    ``observers``, if any (beneath the retrying store, so that each attempt is one
    request)."""

    def __init__(self, inner: Store, observers: Sequence[Observer]) -> None:
        super().__init__(inner)
        self.observers = tuple(observers)

    async def put(
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: Metadata = None
    ) -> ObjectInfo:
        if not self.observers:
            return await super().put(path, data, mode=mode, metadata=metadata)
        token = _sent.set([memoryview(data).nbytes])
        try:
            return await super().put(path, data, mode=mode, metadata=metadata)
        finally:
            _sent.reset(token)

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
    ) -> None:
        if not self.observers:
            return await super().put_stream(path, open_chunks, metadata=metadata)
        sent = [0]

        async def counted() -> AsyncIterator[Buffer]:
            async for chunk in open_chunks():
                sent[0] += memoryview(chunk).nbytes
                yield chunk

        token = _sent.set(sent)
        try:
            await super().put_stream(path, counted, metadata=metadata)
        finally:
            _sent.reset(token)

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if path or operation != "delete":  # a delete of no paths sends nothing
            note_request(operation)
        if not self.observers:
            return await call()
        began = time.perf_counter()
        outcome = "error"
        try:
            result = await call()
            outcome = "ok"
            return result
        except CheckpointNotFoundError:
            outcome = "not_found"
            raise
        except ObjectExistsError:
            outcome = "exists"
            raise
        except PreconditionFailedError:
            outcome = "precondition_failed"
            raise
        except TransientStoreError:
            outcome = "transient"
            raise
        finally:
            sent = _sent.get()
            seconds = time.perf_counter() - began
            store_call(self.observers, operation, path, outcome, seconds, sent[0] if sent else 0)
