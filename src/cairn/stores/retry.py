"""Retry of transient store failures: capped exponential backoff with full jitter.

Invariant: only :class:`TransientStoreError` is retried, at most ``attempts`` tries in
all; not-found, permission, precondition and already-exists failures surface at once.
Every operation of the :class:`Store` protocol is safe to repeat: reads, listings and
deletes are idempotent, an overwrite writes the same bytes again, and the two
conditional writes resolve their ambiguity in the caller (a retried create that meets
"already exists" is checked by reading the object back; a retried compare-and-swap that
meets "precondition failed" re-reads and compares again).

What is transient is decided once, where obstore's exceptions become cairn's
(:func:`cairn.stores.translate_error`), by the failure's kind and HTTP status and never by
the wording of its message: Python's ``TimeoutError`` and ``ConnectionError``; HTTP 408,
429, 500, 502, 503 (S3's ``SlowDown`` among them) and 504; and object_store's connect,
send, timeout and interrupted (connection reset or closed mid-exchange) failures. obstore
exposes no attribute for the last three kinds nor for the status, so they are read by
the one parser of its structured Debug form (:mod:`cairn.stores._translate`), which no response
body can imitate, and the status is kept on the error (:attr:`cairn.StoreError.status`).
Matching words instead retried a ``403`` or a ``400`` whose text mentioned a timeout or a
closed connection, and would miss a throttling answer worded in a way it did not know.

Bound. obstore tries each HTTP request at most ``max_retries + 1`` times (it retries 5xx,
429 and connection failures, and timeouts and resets of idempotent requests only; see
:data:`cairn.stores.DEFAULT_CLIENT_RETRY`, 3 tries), and :class:`RetryPolicy` tries the
operation at most ``attempts`` times, so a store operation that needs ``k`` requests (1
for everything but paged listings and ``delete_prefix``) sends at most
``k * (max_retries + 1) * attempts`` of them: 12 with the defaults. Between attempts it
sleeps at most ``sum(min(max_delay, initial_delay * multiplier**(n - 1)))`` over
``n = 1 .. attempts - 1`` (0.35 s with the defaults), each delay drawn uniformly below
its cap ("full jitter"), so that clients throttled together spread their retries
instead of coming back in step.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from cairn.errors import InvalidInputError, TransientStoreError
from cairn.observe import _dispatch
from cairn.stores import ForwardingStore, PutMode, Store, StoreMethod
from cairn.stores._types import StoreCall

__all__ = ["RetryPolicy", "RetryingStore"]

T = TypeVar("T")
log = logging.getLogger("cairn.stores.retry")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a transient store failure is retried.

    The delay before retry *n* is uniform in
    ``[0, min(max_delay, initial_delay * multiplier**(n-1))]``.

    Args:
        attempts: Every try, the first included; an int >= 1 (1 disables retrying).
        initial_delay: The bound on the first retry's delay, in seconds, >= 0.
        max_delay: The bound on every delay, in seconds, >= 0.
        multiplier: How much the bound grows from one retry to the next, >= 1.

    Raises:
        InvalidInputError: A value is of the wrong type or out of its bounds.
    """

    attempts: int = 4
    initial_delay: float = 0.05
    max_delay: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise InvalidInputError(f"RetryPolicy.attempts must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise InvalidInputError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        for name in ("initial_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise InvalidInputError(f"RetryPolicy.{name} must be >= 0, got {value!r}")
        if not isinstance(self.multiplier, int | float) or self.multiplier < 1:
            raise InvalidInputError(f"RetryPolicy.multiplier must be >= 1, got {self.multiplier!r}")

    def delay(self, retry_number: int) -> float:
        """A jittered delay before a retry.

        Args:
            retry_number: Which retry, 1 for the first.

        Returns:
            The delay in seconds.
        """
        cap = min(self.max_delay, self.initial_delay * self.multiplier ** (retry_number - 1))
        return random.uniform(0, cap)

    async def run(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Await ``operation()``, calling it again on a transient failure, up to the bound.

        Args:
            operation: Makes one attempt each time it is called.

        Returns:
            What the first attempt that succeeds returns.

        Raises:
            TransientStoreError: The last attempt failed so (any other error is raised at
                once, not retried).
        """
        for attempt in range(1, self.attempts + 1):
            try:
                return await operation()
            except TransientStoreError as exc:
                if attempt == self.attempts:
                    raise
                delay = self.delay(attempt)
                _dispatch.note_retry(exc)
                log.info(
                    "retrying %s of %r in %.3fs after: %s",
                    exc.operation,
                    exc.path,
                    delay,
                    exc.reason,
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


class RetryingStore(ForwardingStore):
    """A :class:`Store` that retries the transient failures of another one.

    Every operation goes through :meth:`RetryPolicy.run`; ``put_stream`` calls
    ``open_chunks`` again for each attempt, so a retry never resumes a spent stream.

    Args:
        inner: The store every call goes to.
        policy: How to retry.
    """

    def __init__(self, inner: Store, policy: RetryPolicy) -> None:
        super().__init__(inner)
        self.policy = policy

    def __repr__(self) -> str:
        return f"RetryingStore({self.inner!r}, {self.policy!r})"

    async def _around(
        self, operation: StoreMethod, path: str, call: StoreCall[T], *, mode: PutMode | None = None
    ) -> T:
        return await self.policy.run(call)
