"""Prometheus metrics of a checkpointer (extra: ``pip install 'cairn-checkpoint[metrics]'``).

Attach with ``ObjectStoreCheckpointer(..., observers=[PrometheusMetrics(registry)])``.
Names follow Flink's checkpoint metrics where Flink has one; labels are few and bounded
(never a checkpoint id):

=================================================  ================================================
``cairn_checkpoints_total{outcome}``               saves that ``committed``, ``failed``, ``fenced``
``cairn_checkpoint_duration_seconds``              histogram of save durations
``cairn_checkpoint_uploaded_bytes_total``          bytes saves sent to the store
``cairn_checkpoint_carried_bytes_total``           bytes saves referenced without sending them
``cairn_last_checkpoint_size_bytes``               bytes the last committed save sent
``cairn_last_checkpoint_full_size_bytes``          full state size of the last committed checkpoint
``cairn_last_completed_checkpoint_timestamp_seconds``  commit time of the last committed checkpoint
``cairn_restore_duration_seconds``                 histogram of ``load`` / ``load_latest`` durations
``cairn_restore_fallbacks_total``                  checkpoints ``load_latest`` skipped as damaged
``cairn_store_requests_total{operation,outcome}``  store requests (each retry attempt counts)
``cairn_store_sent_bytes_total{operation}``        bytes of the bodies of store writes (``put``,
                                                   ``put_stream``; each attempt counts)
``cairn_store_retries_total{operation,reason}``    retried store calls; reason ``status_503``, ...
``cairn_gc_deleted_objects_total``                 objects GC deleted
``cairn_gc_reclaimed_bytes_total``                 bytes GC reclaimed
``cairn_saves_in_flight``                          background saves running now
=================================================  ================================================
"""

# ruff: noqa: E402 (the imports after the check of the extra need it)
from __future__ import annotations

from typing import Any

from cairn.errors import MissingExtraError
from cairn.observe import Observer, Operation, StoreCall

MissingExtraError.require("cairn.observe.metrics", "metrics", ("prometheus_client",))

import prometheus_client

__all__ = ["PrometheusMetrics"]

_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class PrometheusMetrics(Observer):
    """The metrics in the module docstring, registered in ``registry`` (default: the
    global ``prometheus_client.REGISTRY``). One instance per registry: registering the
    same names twice in one registry is refused by ``prometheus_client``.

    Args:
        registry: The ``prometheus_client`` registry to register the metrics in; None:
            the global one.
    """

    def __init__(self, registry: Any | None = None) -> None:
        target = registry if registry is not None else prometheus_client.REGISTRY

        def counter(name: str, doc: str, *labels: str) -> Any:
            return prometheus_client.Counter(name, doc, labels, registry=target)

        def gauge(name: str, doc: str) -> Any:
            return prometheus_client.Gauge(name, doc, registry=target)

        def durations(name: str, doc: str) -> Any:
            return prometheus_client.Histogram(
                name, doc, buckets=_DURATION_BUCKETS, registry=target
            )

        self.checkpoints = counter("cairn_checkpoints", "Saves by outcome.", "outcome")
        self.checkpoint_duration = durations(
            "cairn_checkpoint_duration_seconds", "Duration of saves."
        )
        self.uploaded_bytes = counter(
            "cairn_checkpoint_uploaded_bytes", "Bytes saves sent to the store."
        )
        self.carried_bytes = counter(
            "cairn_checkpoint_carried_bytes",
            "Bytes saves referenced from earlier checkpoints without sending them.",
        )
        self.last_size = gauge(
            "cairn_last_checkpoint_size_bytes", "Bytes the last committed save sent."
        )
        self.last_full_size = gauge(
            "cairn_last_checkpoint_full_size_bytes",
            "Full state size of the last committed checkpoint.",
        )
        self.last_completed = gauge(
            "cairn_last_completed_checkpoint_timestamp_seconds",
            "Commit time of the last committed checkpoint (Unix seconds).",
        )
        self.restore_duration = durations(
            "cairn_restore_duration_seconds", "Duration of load and load_latest."
        )
        self.fallbacks = counter(
            "cairn_restore_fallbacks", "Checkpoints load_latest skipped as damaged."
        )
        self.requests = counter(
            "cairn_store_requests",
            "Store requests by operation and outcome.",
            "operation",
            "outcome",
        )
        self.sent_bytes = counter(
            "cairn_store_sent_bytes",
            "Bytes of the bodies of store writes by operation (each attempt counts).",
            "operation",
        )
        self.retries = counter(
            "cairn_store_retries",
            "Retried store calls by operation and reason.",
            "operation",
            "reason",
        )
        self.gc_deleted = counter("cairn_gc_deleted_objects", "Objects GC deleted.")
        self.gc_reclaimed = counter("cairn_gc_reclaimed_bytes", "Bytes GC reclaimed.")
        self.in_flight = gauge("cairn_saves_in_flight", "Background saves running now.")
        self._request_children: dict[tuple[str, str], Any] = {}
        self._sent_children: dict[str, Any] = {}

    def ended(self, operation: Operation) -> None:
        """Count saves, restores and GC runs."""
        if operation.name == "save" or (operation.name == "commit" and operation.parent is None):
            self.checkpoints.labels(outcome=operation.outcome).inc()
            self.checkpoint_duration.observe(operation.duration)
            manifest = operation.manifest
            if operation.outcome == "committed" and manifest is not None:
                stats = manifest.stats
                if stats is not None:
                    self.uploaded_bytes.inc(stats.uploaded_bytes)
                    self.carried_bytes.inc(stats.carried_bytes)
                    self.last_size.set(stats.uploaded_bytes)
                self.last_full_size.set(manifest.total_size_bytes)
                self.last_completed.set(manifest.timestamp_ms / 1000)
        elif operation.name in ("load", "load_latest") and operation.parent is None:
            self.restore_duration.observe(operation.duration)
        elif operation.name == "gc" and operation.gc is not None and not operation.gc.dry_run:
            self.gc_deleted.inc(operation.gc.objects_deleted)
            self.gc_reclaimed.inc(operation.gc.bytes_reclaimed)

    def store_call(self, operation: Operation | None, call: StoreCall) -> None:
        """Count one store request, and the bytes it sent."""
        key = (call.operation, call.outcome)
        child = self._request_children.get(key)
        if child is None:  # labels() costs a lookup under a lock: once per pair
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()
        if call.sent_bytes:
            sent = self._sent_children.get(call.operation)
            if sent is None:
                sent = self._sent_children[call.operation] = self.sent_bytes.labels(call.operation)
            sent.inc(call.sent_bytes)

    def retried(self, operation: Operation | None, store_operation: str, reason: str) -> None:
        """Count one retry."""
        self.retries.labels(operation=store_operation, reason=reason).inc()

    def fell_back(
        self, operation: Operation | None, checkpoint_id: Any, error: BaseException
    ) -> None:
        """Count one fallback of ``load_latest``."""
        self.fallbacks.inc()

    def saves_in_flight(self, count: int) -> None:
        """Set the number of background saves running."""
        self.in_flight.set(count)
