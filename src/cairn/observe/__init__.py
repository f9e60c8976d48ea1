"""Watching a checkpointer: the observer interface that metrics and traces implement.

Attach observers with ``ObjectStoreCheckpointer(..., observers=[...])`` (or the same on
:class:`~cairn.SyncCheckpointer`). cairn calls them as it works; two implementations
ship as optional extras, :class:`cairn.observe.metrics.PrometheusMetrics` and
:class:`cairn.observe.tracing.OpenTelemetryTracer`, and any other system can be fed by
subclassing :class:`Observer` and overriding what it needs (every method is a no-op).

What is observed:

* **operations**: ``save``, ``commit`` (inside a save, or alone), ``load``,
  ``load_latest``, ``gc``, and ``copy`` (for tools composing the public API, see
  :meth:`~cairn.ObjectStoreCheckpointer.observed`). :meth:`Observer.started` and
  :meth:`Observer.ended` bracket each; an :class:`Operation` carries its attributes,
  parent, outcome, error and result (manifest, GC result);
* **store calls**: every request to the store (:class:`StoreCall`), retried ones
  included, and each retry with its reason;
* **fallbacks** of ``load_latest`` past a checkpoint that does not load, and the number
  of **background saves in flight**.

Invariants: an observer that raises is logged and never changes the outcome of what
cairn does; with no observer attached nothing is measured (no cost but a check).
Observers are called on the event loop thread, in the order given; they must not block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.format.ids import CheckpointId
    from cairn.format.manifest import CheckpointManifest
    from cairn.protocol.retention import GcResult

__all__ = ["Observer", "Operation", "StoreCall"]


@dataclass(eq=False)
class Operation:
    """One operation of a checkpointer, as its observers see it.

    Attributes:
        name: The operation (``"save"``, ``"load"``, ``"gc"``, ...).
        parent: The operation it runs within, or None.
        attributes: ``cairn.checkpoint.id``, ``cairn.epoch`` and ``cairn.bytes`` when
            they are known.
        started: When it began (:func:`time.perf_counter`).
        duration: How long it ran, in seconds, once ended.
        outcome: ``"committed"``, ``"failed"`` or ``"fenced"`` for ``save`` and
            ``commit``, ``"ok"`` or ``"failed"`` for the others.
        error: What it raised, or None.
        manifest: The manifest it committed or loaded, or None.
        gc: What a ``gc`` deleted and kept, or None.
        observer_state: A place for an observer's own bookkeeping (a span), keyed by
            the observer.
    """

    name: str
    parent: Operation | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    duration: float = 0.0
    outcome: str = "ok"
    error: BaseException | None = None
    manifest: CheckpointManifest | None = None
    gc: GcResult | None = None
    observer_state: dict[int, Any] = field(default_factory=dict)

    def describe(self, checkpoint_id: CheckpointId | None = None, **attributes: Any) -> None:
        """Record attributes.

        Args:
            checkpoint_id: Recorded as ``cairn.checkpoint.id``, if given.
            **attributes: Each recorded as ``cairn.<key>``.
        """
        if checkpoint_id is not None:
            self.attributes["cairn.checkpoint.id"] = str(checkpoint_id)
        for key, value in attributes.items():
            self.attributes[f"cairn.{key}"] = value


@dataclass(frozen=True, slots=True)
class StoreCall:
    """One request to the store.

    Attributes:
        operation: The store method (``"get"``, ``"put"``, ...).
        path: The path or prefix it was about.
        outcome: ``ok``, ``not_found``, ``exists``, ``precondition_failed``,
            ``transient`` or ``error``.
        seconds: How long it took.
        sent_bytes: The bytes of its body it sent: a ``put``'s data, the chunks a
            ``put_stream`` handed on (a failed attempt: those it handed on before it
            failed); 0 for reads, lists and deletes.
    """

    operation: str
    path: str
    outcome: str
    seconds: float
    sent_bytes: int = 0


class Observer:
    """Receives what a checkpointer does; every method is a no-op here (see the module)."""

    def started(self, operation: Operation) -> None:
        """``operation`` begins (its parent, if any, began before).

        Args:
            operation: The operation.
        """

    def ended(self, operation: Operation) -> None:
        """``operation`` ended.

        Args:
            operation: The operation; its ``duration``, ``outcome``, ``error`` and
                results are set.
        """

    def store_call(self, operation: Operation | None, call: StoreCall) -> None:
        """One store request ended.

        Args:
            operation: The operation it was made in, or None outside any.
            call: The request: its operation, path, outcome and duration.
        """

    def retried(self, operation: Operation | None, store_operation: str, reason: str) -> None:
        """A store call is retried.

        Args:
            operation: The operation it was made in, or None outside any.
            store_operation: The store method (``"get"``, ``"put"``, ...).
            reason: Why: ``"status_503"``-like, or ``"network"``.
        """

    def fell_back(
        self, operation: Operation | None, checkpoint_id: CheckpointId, error: BaseException
    ) -> None:
        """``load_latest`` skipped a checkpoint that does not load.

        Args:
            operation: The ``load_latest`` operation, or None.
            checkpoint_id: The checkpoint skipped.
            error: Why it does not load.
        """

    def saves_in_flight(self, count: int) -> None:
        """The number of background saves in flight changed.

        Args:
            count: The number now.
        """
