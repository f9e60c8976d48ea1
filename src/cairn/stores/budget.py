"""A client-side request budget per store: requests and bytes per second, shared in a process.

S3-compatible services (MinIO, Cloudflare R2, Hetzner, ...) answer ``429`` or ``503
Slow Down`` when a bucket gets more requests than they allow. A :class:`RequestBudget`
given to a checkpointer (``ObjectStoreCheckpointer(store, budget=RequestBudget(...))``)
paces cairn's requests to that store below such a limit, instead of learning it from
failures.

One budget per store, in a process. Every checkpointer given a budget for the same
store shares one :class:`SharedBudget`: two checkpointers opened on the same bucket, by
the same or different prefixes, from one URL or from two obstore stores, draw on one
allowance together (:func:`store_key` says what "the same store" is). The budgets of a
store must agree: a second, different :class:`RequestBudget` for a store whose shared
budget is in use raises :class:`InvalidInputError` rather than let two allowances add
up. The shared budget lives while a checkpointer uses it; the next one starts afresh.

Token buckets, as a schedule. Each limit is a token bucket of capacity ``burst`` (a
tenth of a second's worth, at least one token) refilled at the limit's rate. A call
reserves its tokens at once, under a lock, and gets the time it may send: the earliest
at which each of its buckets holds what it needs (``min(cost, burst)``: a request
larger than the bucket waits until the bucket is full, then leaves it in debt that the
next callers wait out). Reservations are handed out in call order, so waiting callers
go in turn (first come, first served), each with one sleep, to its own time: no polling,
no timer, nothing that runs while nobody waits. A call waits its turn behind every call
that came before it, even one whose own buckets would let it go sooner. In any window
of ``w`` seconds (both ends included) a limit of ``r`` per second lets through at most
``burst + r * w`` tokens, and, where one call needs more than the bucket holds, that
excess besides. A call cancelled while it waits does not give its turn back: the budget
errs on the slow side.

Invariants: a store opened without a budget pays nothing (no wrapper, no lock, no
clock); every attempt of a call, a retried one included, reserves its tokens before it
is sent, but for what only its reply tells (a ``get``'s bytes, a listing's further
pages), which is counted on arrival and waited out by the calls after it; the times
granted never go backwards, so no caller overtakes an earlier one.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

from cairn.errors import InvalidInputError
from cairn.stores import ForwardingStore, ObstoreStore, PartsInFlight, Store
from cairn.stores._local import LocalStore
from cairn.stores._urls import DEFAULT_CLIENT_RETRY, REMOTE_SCHEMES, open_store, store_url
from cairn.stores.retry import RetryPolicy

__all__ = [
    "BUDGETED_RETRY",
    "BURST_SECONDS",
    "NO_CLIENT_RETRY",
    "RequestBudget",
    "SharedBudget",
    "TokenBucket",
    "is_remote",
    "open_remote",
    "shared_budget",
    "store_key",
]

BURST_SECONDS = 0.1
"""A bucket holds this many seconds' worth of its rate (and at least one token)."""


NO_CLIENT_RETRY: dict[str, Any] = {**DEFAULT_CLIENT_RETRY, "max_retries": 0}
"""obstore's HTTP retry for a store a checkpointer with a budget opens by URL: none, so
that every request obstore sends is one cairn counted."""

BUDGETED_RETRY = RetryPolicy(attempts=12, initial_delay=0.1, max_delay=2.0)
"""The retry of a checkpointer with a budget that opened its store by URL, unless given
one: what obstore's retry (3 tries, 0.1 to 2 s apart) times the default
:class:`~cairn.stores.retry.RetryPolicy` (4 attempts) allowed, at most 12 requests per
call, now each one taking its turn in the budget."""


def _limit(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"RequestBudget.{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"RequestBudget.{name} must be finite and > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class RequestBudget:
    """How many requests, and how many bytes, per second cairn may send to one store.

    Either limit may be None (no limit of that kind), not both. What counts, for each
    attempt of a store call (a retried call counts again), is taken before it is sent
    unless said otherwise:

    * requests: one per call; a listing (``list``, ``list_dir``) one more per 1,000
      entries past the first 1,000, charged when it returns; ``delete`` one per 1,000
      paths (an S3 or Azure batch); ``delete_prefix`` two (a listing and a batch); a
      streamed upload (``put_stream``, a multipart upload) one to start it, one per part
      as its chunks reach each 8 MiB boundary, and two after its last chunk (the last
      part and the completion);
    * bytes: the bytes of a ``put`` and of each chunk of a ``put_stream``, sent; the
      range of a ``get_range``, before it is read; the bytes of a ``get``, when they have
      arrived (the calls after it wait them out). Headers, listings and the like are not
      counted.

    Retries that obstore makes inside one HTTP request are invisible to cairn: a
    checkpointer given a URL and a budget opens the store with obstore's retry off, and
    retries each request itself (each attempt taking its tokens); open a store yourself
    with ``retry_config={"max_retries": 0}`` for the same.

    Args:
        max_requests_per_s: Requests per second at most, a finite number > 0, or None.
        max_bytes_per_s: Bytes per second at most, a finite number > 0, or None.

    Raises:
        InvalidInputError: A limit is not a finite number > 0, or neither is given.
    """

    max_requests_per_s: float | None = None
    max_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        requests = _limit("max_requests_per_s", self.max_requests_per_s)
        nbytes = _limit("max_bytes_per_s", self.max_bytes_per_s)
        if requests is None and nbytes is None:
            raise InvalidInputError(
                "a RequestBudget needs max_requests_per_s or max_bytes_per_s (or both)"
            )


class TokenBucket:
    """One limit: ``rate`` tokens per second, at most ``capacity`` saved up. Not locked.

    The state is one time, the moment the bucket would be full again; a bucket that has
    never been drawn on is full.

    Args:
        rate: Tokens per second, > 0.
        capacity: Tokens the bucket holds when full, > 0.
    """

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self._full_at = -math.inf

    def earliest(self, cost: float, now: float) -> float:
        """The earliest time, not before ``now``, at which ``cost`` tokens may be drawn.

        Args:
            cost: Tokens wanted, >= 0.
            now: The current time.

        Returns:
            The time: when the bucket holds ``min(cost, capacity)``.
        """
        ready = self._full_at - (self.capacity - min(cost, self.capacity)) / self.rate
        return max(now, ready)

    def draw(self, cost: float, at: float) -> None:
        """Take ``cost`` tokens at time ``at`` (the bucket may go into debt).

        Args:
            cost: Tokens taken, >= 0.
            at: When they are taken: a time :meth:`earliest` granted, or now.
        """
        self._full_at = max(self._full_at, at) + cost / self.rate


class SharedBudget:
    """The token buckets of one :class:`RequestBudget`, safe to share between threads and
    event loops.

    Args:
        budget: The limits.
        clock: Seconds, never going backwards; ``time.monotonic`` unless a test passes
            its own.
    """

    def __init__(self, budget: RequestBudget, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._lock = threading.Lock()
        self._requests = _bucket(budget.max_requests_per_s)
        self._bytes = _bucket(budget.max_bytes_per_s)
        self._last = -math.inf

    def __repr__(self) -> str:
        return f"SharedBudget({self.budget!r})"

    def reserve(self, requests: int, nbytes: int) -> float:
        """Reserve ``requests`` requests and ``nbytes`` bytes, together, for one send.

        Args:
            requests: Requests the send counts as, >= 0.
            nbytes: Bytes it counts as, >= 0.

        Returns:
            Seconds to wait before sending (0 if it may go at once).
        """
        with self._lock:
            now = self._clock()
            wanted = [
                (bucket, cost)
                for bucket, cost in ((self._requests, requests), (self._bytes, nbytes))
                if bucket is not None and cost > 0
            ]
            at = max((bucket.earliest(cost, now) for bucket, cost in wanted), default=now)
            at = max(at, self._last)  # in turn: after every caller who came before
            for bucket, cost in wanted:
                bucket.draw(cost, at)
            self._last = at
            return at - now

    def charge(self, requests: int, nbytes: int) -> None:
        """Count what was already sent or received: no wait now, the next callers wait.

        Args:
            requests: Requests to count, >= 0.
            nbytes: Bytes to count, >= 0.
        """
        with self._lock:
            now = self._clock()
            for bucket, cost in ((self._requests, requests), (self._bytes, nbytes)):
                if bucket is not None and cost > 0:
                    bucket.draw(cost, now)

    async def take(self, requests: int, nbytes: int = 0) -> None:
        """Wait until ``requests`` requests and ``nbytes`` bytes may be sent.

        Args:
            requests: Requests the send counts as, >= 0.
            nbytes: Bytes it counts as, >= 0.
        """
        delay = self.reserve(requests, nbytes)
        if delay > 0:
            await asyncio.sleep(delay)


def _bucket(rate: float | None) -> TokenBucket | None:
    if rate is None:
        return None
    return TokenBucket(rate, max(1.0, rate * BURST_SECONDS))


def store_key(store: Any) -> Hashable:
    """What identifies ``store`` for budgets: stores with equal keys share one.

    An S3 bucket is its endpoint (None for AWS) and bucket name; a GCS bucket its name;
    an Azure container its account and container; an HTTP store its scheme and host; a
    local directory its absolute path. The prefix within a bucket does not count: one
    bucket is one budget. A wrapper (a :class:`~cairn.stores.ForwardingStore`) is the
    store it wraps; any other store, a memory store among them, is itself alone.

    Args:
        store: A :class:`~cairn.stores.Store` or an obstore store.

    Returns:
        The key.
    """
    while isinstance(store, ForwardingStore):
        store = store.inner
    if isinstance(store, ObstoreStore):
        store = store.obstore
    if isinstance(store, S3Store):
        config: dict[str, Any] = dict(store.config)
        endpoint = config.get("endpoint")
        return ("s3", endpoint.rstrip("/") if isinstance(endpoint, str) else None, config["bucket"])
    if isinstance(store, GCSStore):
        return ("gs", dict(store.config).get("bucket"))
    if isinstance(store, AzureStore):
        config = dict(store.config)
        return ("az", config.get("account_name"), config.get("container_name"))
    if isinstance(store, HTTPStore):
        scheme, _, rest = store.url.partition("://")
        return ("http", scheme.lower(), rest.split("/", 1)[0].lower())
    if isinstance(store, LocalStore):
        return ("file", str(store.root))
    return ("object", id(store))  # a memory store, or a store cairn cannot see into


_shared: weakref.WeakValueDictionary[Hashable, SharedBudget] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def shared_budget(store: Any, budget: RequestBudget) -> SharedBudget:
    """The one :class:`SharedBudget` of ``store`` in this process, made on first use.

    Args:
        store: The store (see :func:`store_key`).
        budget: Its limits.

    Returns:
        The shared budget; the caller keeps it alive while it uses it.

    Raises:
        InvalidInputError: ``budget`` is not a :class:`RequestBudget`, or the store's
            shared budget in use has other limits.
    """
    if not isinstance(budget, RequestBudget):
        raise InvalidInputError(f"budget must be a RequestBudget, got {budget!r}")
    key = store_key(store)
    with _shared_lock:
        existing = _shared.get(key)
        if existing is None:
            existing = _shared[key] = SharedBudget(budget)
        elif existing.budget != budget:
            raise InvalidInputError(
                f"{store!r} already has {existing.budget!r} in this process, shared by its "
                f"checkpointers; got {budget!r}: give every checkpointer of a store the same "
                "budget"
            )
        return existing


def is_remote(url: str) -> bool:
    """Whether a URL names a remote store (one that obstore reaches over HTTP).

    Args:
        url: A store URL, or a local directory's path.

    Returns:
        True for S3, GCS, Azure and HTTP URLs; False for a directory or ``memory://``.

    Raises:
        InvalidStoreUrlError: ``url`` is malformed (see :func:`~cairn.stores.store_url`).
    """
    return store_url(url).split(":", 1)[0].lower() in REMOTE_SCHEMES


def open_remote(url: str, parts_in_flight: PartsInFlight | int | None = None) -> Store:
    """The remote store a URL names, opened with obstore's own HTTP retry off
    (:data:`NO_CLIENT_RETRY`), so that cairn sees, and counts, every request.

    Args:
        url: The store's URL (see :func:`is_remote`).
        parts_in_flight: As :class:`~cairn.stores.ObstoreStore` takes it.

    Returns:
        The store.

    Raises:
        InvalidStoreUrlError: A URL that :func:`~cairn.open_store` cannot open.
    """
    return ObstoreStore(open_store(url, retry_config=NO_CLIENT_RETRY), parts_in_flight)
