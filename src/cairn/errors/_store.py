"""Errors of the object store: what failed (operation, path, the store's own words and
status), and of which kind, so a caller can tell a retry from a fix of configuration.

Invariant: each is a :class:`StoreError` carrying ``operation``, ``path``, ``reason`` and
``status`` as plain values, never the store's own exception object (errors cross
processes, and no obstore exception reaches a caller).
"""

from __future__ import annotations

from cairn.errors._checkpoints import CheckpointNotFoundError
from cairn.errors._root import CheckpointerError

__all__ = [
    "NotDurableError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "PreconditionFailedError",
    "StoreCredentialsError",
    "StoreError",
    "StoreNotFoundError",
    "TransientStoreError",
]


class StoreError(CheckpointerError):
    """The object store failed while doing ``operation`` on ``path``.

    Attributes:
        operation: The store operation that failed (``"get"``, ``"put"``, ...).
        path: The store path it was about.
        reason: What the store said, in words.
        status: The HTTP status the store answered the failed request with, when it
            answered one (None for connection failures, timeouts and non-HTTP stores).
    """

    def __init__(
        self, operation: str, path: str, reason: str, *, status: int | None = None
    ) -> None:
        self.operation, self.path, self.reason, self.status = operation, path, reason, status
        super().__init__(f"store {operation} failed for {path!r}: {reason}")


class ObjectNotFoundError(CheckpointNotFoundError, StoreError):
    """The store has no object at ``path`` (a :class:`StoreError` like every store failure,
    and a :class:`CheckpointNotFoundError` for code that catches that).

    Attributes:
        operation: The store operation that found nothing.
        path: The store path.
        what: What was looked for, in words (``"object"`` unless told).
    """

    def __init__(self, operation: str, path: str, what: str = "object") -> None:
        StoreError.__init__(self, operation, path, "no such object")
        self.what = what


class TransientStoreError(StoreError):
    """A store failure that may succeed if tried again (timeout, connection, 5xx, throttling)."""


class ObjectExistsError(StoreError):
    """A create-only write found an object already at ``path``."""


class NotDurableError(StoreError):
    """A write reached the store but could not be made durable (a local store's fsync
    failed). Treat it as failed: the object may be readable now and gone, or damaged,
    after a crash. Not retried: the kernel reports such a failure once, so a second
    fsync would succeed without making anything durable."""


class PreconditionFailedError(StoreError):
    """A compare-and-swap write found another version of the object at ``path``."""


class StoreNotFoundError(StoreError):
    """The bucket or container of the store does not exist (not an object in it).

    Not a :class:`CheckpointNotFoundError`: nothing can be saved to or loaded from the
    store until the bucket is created or the URL corrected, so it is never taken to mean
    "no checkpoint yet".

    Attributes:
        operation: The store operation that failed.
        path: The store path it was about.
        kind: ``"bucket"`` (S3, GCS) or ``"container"`` (Azure).
        name: Its name (None when the store's answer does not say).
        code: The store's error code (``NoSuchBucket``, ``ContainerNotFound``).
        status: The HTTP status of the answer, if any.
    """

    def __init__(
        self,
        operation: str,
        path: str,
        kind: str,
        name: str | None,
        code: str,
        *,
        status: int | None = None,
    ) -> None:
        self.kind, self.name, self.code = kind, name, code
        named = f" {name!r}" if name else ""
        reason = (
            f"the {kind}{named} does not exist (the store answered {status or 404} {code} to "
            f"{operation} {path!r}): create it, or correct the {kind} name in the store URL"
        )
        StoreError.__init__(self, operation, path, reason, status=status)
        CheckpointerError.__init__(self, reason)


class StoreCredentialsError(StoreError):
    """The store's credentials are missing or were refused; nothing was read or written.

    Not transient: the request for a token was already retried, and what fails is the
    configuration.

    Args:
        operation: The store operation that failed.
        path: The store path it was about.
        store: The kind of store (``"GCS"``, ``"Azure"``, ``"S3"``).
        problem: What is missing or refused, in words.
        remedy: What to set (environment variables, or :func:`~cairn.open_store` options).
        status: The HTTP status of the answer, if any.

    Attributes:
        store: The kind of store.
        remedy: What to set.
    """

    def __init__(
        self,
        operation: str,
        path: str,
        store: str,
        problem: str,
        remedy: str,
        *,
        status: int | None = None,
    ) -> None:
        self.store, self.remedy = store, remedy
        reason = f"{problem}; {remedy}"
        StoreError.__init__(self, operation, path, reason, status=status)
        CheckpointerError.__init__(self, reason)
