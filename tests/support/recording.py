"""A :class:`cairn.stores.Store` wrapper that records every call, for tests.

:class:`RecordingStore` forwards to a real store and records what passed through it:
the calls counted in total, per method and per request, in order with their paths, how
many were in flight at once, the paths of streamed uploads and, if asked, the buffer of
each put. :class:`support.faults.FaultyStore` is one that also injects faults.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

from cairn.format._buffer import Buffer
from cairn.format.manifest import StoreRequests
from cairn.stores import ForwardingStore, ObjectInfo, PutMode, Store, StoreMethod

T = TypeVar("T")

OP_NAMES: dict[StoreMethod, str] = {"stat": "head", "put_stream": "put", "delete_prefix": "delete"}
"""The name a call is counted and matched under (``ops``, ``log``, a fault plan's
``transient_ops``) where it is not the method's own: by the request it makes, so ``stat``
is a ``head``."""


class RecordingStore(ForwardingStore):
    """A :class:`Store` that forwards to ``inner`` and records every call.

    ``calls`` counts every call from 1; ``methods`` counts them per :data:`StoreMethod`,
    ``ops`` per request name (:data:`OP_NAMES`), and ``log`` lists ``(op, path)`` in call
    order. ``in_flight`` / ``peak_in_flight`` (and ``..._by_op``) count the calls running
    at once. ``stream_puts`` lists the paths of ``put_stream`` calls; with ``keep_puts``,
    ``puts`` maps each ``put``'s path to the buffer it was given (held, so off by
    default).
    """

    def __init__(self, inner: Store, *, keep_puts: bool = False) -> None:
        super().__init__(inner)
        self.keep_puts = keep_puts
        self.calls = 0
        self.methods: collections.Counter[StoreMethod] = collections.Counter()
        self.ops: collections.Counter[str] = collections.Counter()
        self.log: list[tuple[str, str]] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.in_flight_by_op: collections.Counter[str] = collections.Counter()
        self.peak_by_op: collections.Counter[str] = collections.Counter()
        self.puts: dict[str, Buffer] = {}
        self.stream_puts: list[str] = []

    def record(self, operation: StoreMethod, path: str) -> int:
        """Count one call of ``operation`` on ``path``; returns its number (from 1)."""
        self.calls += 1
        self.methods[operation] += 1
        op = OP_NAMES.get(operation, operation)
        self.ops[op] += 1
        self.log.append((op, path))
        if operation == "put_stream":
            self.stream_puts.append(path)
        return self.calls

    @contextmanager
    def flying(self, op: str) -> Iterator[None]:
        """Count a call of request ``op`` as in flight while the block runs."""
        self.in_flight += 1
        self.in_flight_by_op[op] += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.peak_by_op[op] = max(self.peak_by_op[op], self.in_flight_by_op[op])
        try:
            yield
        finally:
            self.in_flight -= 1
            self.in_flight_by_op[op] -= 1

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        self.record(operation, path)
        with self.flying(OP_NAMES.get(operation, operation)):
            return await call()

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        if self.keep_puts:
            self.puts[path] = data
        return await super().put(path, data, mode=mode, metadata=metadata)


KIND_OF = {"get_range": "get", "list_dir": "list"}
"""How the requests a RecordingStore logs map to StoreRequests' kinds (its own names
already count ``stat`` as a head, ``put_stream`` as a put, ``delete_prefix`` as a delete)."""


def requests_up_to_commit(recording: RecordingStore, manifest_path: str) -> StoreRequests:
    """The requests ``recording`` saw, by kind, up to and including the first put of
    ``manifest_path``: the commit point."""
    seen: collections.Counter[str] = collections.Counter()
    for op, path in recording.log:
        seen[KIND_OF.get(op, op)] += 1
        if op == "put" and path == manifest_path:
            return StoreRequests(**seen)
    raise AssertionError(f"the manifest {manifest_path} was never written")
