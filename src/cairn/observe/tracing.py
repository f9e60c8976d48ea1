"""OpenTelemetry traces of a checkpointer (extra: ``pip install 'cairn-checkpoint[metrics]'``).

Attach with ``ObjectStoreCheckpointer(..., observers=[OpenTelemetryTracer()])``. Built on
``opentelemetry-api`` only: without an SDK installed by the application, every span is a
no-op. Spans: ``cairn.save`` (with ``cairn.commit`` inside it), ``cairn.commit``,
``cairn.load``, ``cairn.load_latest``, ``cairn.gc`` and ``cairn.copy``, each a child of
the span current where the operation started (a ``cairn.commit`` of its ``cairn.save``).
Attributes: ``cairn.checkpoint.id``, ``cairn.epoch``, ``cairn.bytes``; on failure
``error.type`` (the exception's class) and an error status. Store requests, retries and
fallbacks are events on the operation's span, at most :data:`MAX_EVENTS` per span (the
rest are counted in ``cairn.store.events_dropped``).
"""

# ruff: noqa: E402 (the imports after the check of the extra need it)
from __future__ import annotations

from typing import Any

from cairn.errors import MissingExtraError
from cairn.observe import Observer, Operation, StoreCall

MissingExtraError.require("cairn.observe.tracing", "metrics", ("opentelemetry",))

from opentelemetry import context as otel_context
from opentelemetry import trace

__all__ = ["MAX_EVENTS", "OpenTelemetryTracer"]

MAX_EVENTS = 128
"""Store-call events recorded on one span; the rest are only counted."""


class _Open:
    """The span of one operation, and how many events it took or dropped."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.events = 0
        self.dropped = 0


class OpenTelemetryTracer(Observer):
    """Spans and events for a checkpointer's operations (see the module docstring).

    Args:
        tracer_provider: The OpenTelemetry tracer provider to get the ``cairn`` tracer
            from; None: the global one.
    """

    def __init__(self, tracer_provider: Any | None = None) -> None:
        self.tracer = trace.get_tracer("cairn", tracer_provider=tracer_provider)
        self._key = id(self)

    def _open(self, operation: Operation | None) -> _Open | None:
        while operation is not None:
            found = operation.observer_state.get(self._key)
            if isinstance(found, _Open):
                return found
            operation = operation.parent
        return None

    def started(self, operation: Operation) -> None:
        """Start the operation's span, under its parent's."""
        parent = self._open(operation.parent)
        context = trace.set_span_in_context(parent.span) if parent else otel_context.get_current()
        span = self.tracer.start_span(
            f"cairn.{operation.name}", context=context, attributes=operation.attributes
        )
        operation.observer_state[self._key] = _Open(span)

    def ended(self, operation: Operation) -> None:
        """Describe and end the operation's span."""
        opened = operation.observer_state.pop(self._key, None)
        if not isinstance(opened, _Open):
            return
        span = opened.span
        span.set_attributes(operation.attributes)
        if opened.dropped:
            span.set_attribute("cairn.store.events_dropped", opened.dropped)
        if operation.error is not None:
            span.set_attribute("error.type", type(operation.error).__qualname__)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(operation.error)))
        span.end()

    def _event(self, operation: Operation | None, name: str, attributes: dict[str, Any]) -> None:
        opened = self._open(operation)
        if opened is None:
            return
        if opened.events >= MAX_EVENTS:
            opened.dropped += 1
            return
        opened.events += 1
        opened.span.add_event(name, attributes)

    def store_call(self, operation: Operation | None, call: StoreCall) -> None:
        """An event ``store.<operation>`` on the current operation's span."""
        self._event(
            operation,
            f"store.{call.operation}",
            {"path": call.path, "outcome": call.outcome, "seconds": call.seconds},
        )

    def retried(self, operation: Operation | None, store_operation: str, reason: str) -> None:
        """An event ``store.retry``."""
        self._event(operation, "store.retry", {"operation": store_operation, "reason": reason})

    def fell_back(
        self, operation: Operation | None, checkpoint_id: Any, error: BaseException
    ) -> None:
        """An event ``fallback`` naming the skipped checkpoint."""
        self._event(
            operation,
            "fallback",
            {"cairn.checkpoint.id": str(checkpoint_id), "error.type": type(error).__qualname__},
        )
