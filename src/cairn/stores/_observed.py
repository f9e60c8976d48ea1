"""The store every checkpointer's requests pass: counted, and reported to its observers.

Invariant: each attempt of a store call is one request (this store sits beneath the
retrying one), counted in every open counter (:func:`cairn.observe._dispatch.counting_requests`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from cairn.errors import (
    CheckpointNotFoundError,
    ObjectExistsError,
    PreconditionFailedError,
    TransientStoreError,
)
from cairn.observe import Observer
from cairn.observe._dispatch import note_request, store_call
from cairn.stores import ForwardingStore, PutMode, Store, StoreMethod

__all__ = ["ObservedStore"]

T = TypeVar("T")


class ObservedStore(ForwardingStore):
    """A store that counts every request (:func:`counting_requests`) and reports it to
    ``observers``, if any (beneath the retrying store, so that each attempt is one
    request)."""

    def __init__(self, inner: Store, observers: Sequence[Observer]) -> None:
        super().__init__(inner)
        self.observers = tuple(observers)

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
            store_call(self.observers, operation, path, outcome, time.perf_counter() - began)
