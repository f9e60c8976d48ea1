"""obstore's exceptions into cairn's: the one place an obstore (or OS) error becomes a
:mod:`cairn.errors` type naming the operation and the path.

Invariant: retryability is decided by the error's kind and HTTP status (see
:func:`translate_error`), never by words in its message; nothing but cairn errors leaves.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)

from cairn import _shutdown
from cairn._storetypes import ObjectInfo
from cairn.errors import (
    CheckpointerError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
)

__all__ = [
    "_DEBUG_SOURCE",
    "_HTTP_ERROR",
    "_REQUEST_ERROR",
    "_TOKEN_REQUEST",
    "_TRANSIENT_HTTP_KINDS",
    "_TRANSIENT_STATUSES",
    "_Failure",
    "_call",
    "_first_line",
    "_http_failure",
    "_info",
    "_is_transient",
    "translate_error",
]

T = TypeVar("T")

_S3_ERROR_CODE = re.compile(r"<Code>(\w+)</Code>")

_TRANSIENT_S3_CODES = frozenset({"RequestTimeout"})
"""S3 error codes (the ``<Code>`` of its XML error document) that are transient although
their status is not: ``400 RequestTimeout`` (the socket was idle too long mid-upload)."""


_DEBUG_SOURCE = "\n\nDebug source:\n"


_REQUEST_ERROR = re.compile(r"\b(Status|Response) \{\n[ \t]*status: (\d{3}),\n")


_HTTP_ERROR = re.compile(r"\bHttpError \{\n[ \t]*kind: (\w+),\n")


_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Request Timeout, Too Many Requests (throttling), and the server-side 5xx that mean
"try again": internal error, bad gateway, service unavailable (S3's SlowDown), gateway
timeout. 501 and 505 are permanent; other 4xx are the request's own fault."""


_TRANSIENT_HTTP_KINDS = frozenset({"Connect", "Request", "Timeout", "Interrupted"})
"""The HttpErrorKinds object_store itself retries: no connection, a request that could
not be sent, a timeout, a connection reset or closed mid-exchange. object_store retries
the last two only for idempotent requests; every :class:`Store` call is safe to repeat
(see :mod:`cairn.retry`). ``Decode`` (an unparseable response) and ``Unknown`` are not
retried, by either."""


_TOKEN_REQUEST = re.compile(r'\bstore: "(\w+)",\n[ \t]*source: TokenRequest \{\n')
"""object_store's error for a failed request for an access token (GCS, Azure): the
credentials are missing or refused. Its HTTP request was already retried by obstore,
and what fails is the configuration, so it is never transient. Group 1: the store."""


@dataclass(frozen=True, slots=True)
class _Failure:
    """What obstore's Debug form says about a failed HTTP exchange."""

    status: int | None = None  # the status the server answered, if it answered
    error_in_success: bool = False  # S3's 200 response whose body is an error
    kind: str | None = None  # HttpErrorKind, if no response came back
    s3_code: str | None = None  # the S3 error code in the response body, if any


def _http_failure(exc: BaseException) -> _Failure:
    debug = str(exc).rpartition(_DEBUG_SOURCE)[2]
    request_error = _REQUEST_ERROR.search(debug)
    if request_error is not None:
        code = _S3_ERROR_CODE.search(debug, request_error.end())
        return _Failure(
            status=int(request_error.group(2)),
            error_in_success=request_error.group(1) == "Response",
            s3_code=code.group(1) if code else None,
        )
    http_error = _HTTP_ERROR.search(debug)
    return _Failure(kind=http_error.group(1) if http_error else None)


def _is_transient(failure: _Failure) -> bool:
    if failure.error_in_success:
        # object_store raises Response only for a 2xx whose body is an S3 InternalError
        # or SlowDown, which it retries like a 5xx.
        return True
    if failure.status is not None:
        return failure.status in _TRANSIENT_STATUSES or (
            failure.status == 400 and failure.s3_code in _TRANSIENT_S3_CODES
        )
    return failure.kind in _TRANSIENT_HTTP_KINDS


def _first_line(exc: BaseException) -> str:
    text = str(exc).split("\n\nDebug source:", 1)[0].strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate_error(operation: str, path: str, exc: BaseException) -> CheckpointerError:
    """The :mod:`cairn.errors` error for an exception raised by obstore (or the OS).

    Classified by kind, then by HTTP status, never by the wording of the message:
    obstore's not-found, already-exists, precondition, permission, authentication and
    not-supported classes map to their own errors; Python's ``TimeoutError`` and
    ``ConnectionError`` are transient; for any other obstore error (or OS error) the
    status or connection-failure kind recorded in obstore's structured Debug form
    decides: 408, 429, 500, 502, 503, 504 (and S3's ``400 RequestTimeout``, and S3's
    200 carrying an error) and connect, send, timeout and interrupted failures are
    :class:`TransientStoreError`; everything else is a plain :class:`StoreError`. A
    failed request for an access token (object_store's ``TokenRequest``: credentials
    missing or refused, after obstore's own retries of it) is a plain
    :class:`StoreError` whatever its status. The HTTP status, when there was one, is
    kept as ``status`` on the error.
    """
    if isinstance(exc, CheckpointerError):
        return exc
    reason = _first_line(exc)
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(operation, path)
    failure = _http_failure(exc) if isinstance(exc, BaseError | OSError) else _Failure()
    status = failure.status
    if isinstance(exc, AlreadyExistsError):
        return ObjectExistsError(operation, path, reason, status=status)
    if isinstance(exc, PreconditionError):
        return PreconditionFailedError(operation, path, reason, status=status)
    if isinstance(
        exc, PermissionDeniedError | UnauthenticatedError | NotSupportedError | NotImplementedError
    ):
        return StoreError(operation, path, reason, status=status)
    if isinstance(exc, BaseError) and _TOKEN_REQUEST.search(str(exc).rpartition(_DEBUG_SOURCE)[2]):
        return StoreError(operation, path, reason, status=status)
    if isinstance(exc, TimeoutError | ConnectionError) or _is_transient(failure):
        return TransientStoreError(operation, path, reason, status=status)
    return StoreError(operation, path, reason, status=status)


async def _call(operation: str, path: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except (BaseError, OSError, NotImplementedError) as exc:
        raise translate_error(operation, path, exc) from exc
    finally:
        _shutdown.note_store_call()


def _info(meta: Any, *, quote_e_tag: bool = False) -> ObjectInfo:
    e_tag = meta.get("e_tag")
    if quote_e_tag and e_tag is not None and not e_tag.startswith(('"', "W/")):
        e_tag = f'"{e_tag}"'
    return ObjectInfo(
        path=meta["path"],
        size=meta["size"],
        e_tag=e_tag,
        last_modified=meta["last_modified"],
        version=meta.get("version"),
    )
