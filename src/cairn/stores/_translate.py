"""obstore's exceptions into cairn's: the one place an obstore (or OS) error becomes a
:mod:`cairn.errors` type naming the operation and the path.

Invariant: retryability is decided by the error's kind and HTTP status (see
:func:`translate_error`), never by words in its message; nothing but cairn errors leaves.
A bucket or container that does not exist is :class:`StoreNotFoundError` (never an
absent object), and credentials that are missing or refused are
:class:`StoreCredentialsError` naming what to set, for every operation alike.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)

from cairn.errors import (
    CheckpointerError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreCredentialsError,
    StoreError,
    StoreNotFoundError,
    TransientStoreError,
)
from cairn.stores import _shutdown
from cairn.stores._types import ObjectInfo

__all__ = [
    "Failure",
    "call",
    "credentials_error",
    "debug_form",
    "first_line",
    "http_failure",
    "info_of",
    "token_request_store",
    "translate_error",
]

T = TypeVar("T")

_S3_ERROR_CODE = re.compile(r"<Code>(\w+)</Code>")

_TRANSIENT_S3_CODES = frozenset({"RequestTimeout"})
"""S3 error codes (the ``<Code>`` of its XML error document) that are transient although
their status is not: ``400 RequestTimeout`` (the socket was idle too long mid-upload)."""


# Retryability is decided by what a failure is, never by words in its message: a 400
# whose body says "connection closed" is not retried, and a 503 is, whatever its body.
#
# obstore (0.12.1, and its newest stubs alike) raises exception classes without
# attributes: the class tells not-found, already-exists, precondition, permission and
# the like apart, and is used for those; but no HTTP status and no connection-failure
# kind is exposed, so those are read here, and only here, from the text. What would let
# this parser go: obstore exceptions that carry object_store's RetryError status and
# HttpErrorKind as attributes; no obstore release does yet.
#
# Every message obstore builds is object_store's Display text, then "\n\nDebug
# source:\n", then the pretty Debug form of the same Rust error. The Debug form is
# structured: object_store's RetryError prints its outcome as ``inner: Status {`` /
# ``Response {`` followed by a ``status: NNN,`` field line, or ``Http(HttpError {``
# followed by a ``kind: K,`` field line (HttpErrorKind: Connect, Request, Timeout,
# Interrupted, Decode, Unknown); a body stream that fails mid-response is an
# ``HttpError`` too. Strings in a Debug form are quoted and escaped (a newline is printed
# as ``\n``), so a response body or a path can never produce the line structure matched
# below, and the Debug form is taken after the *last* marker, so a body that contains the
# marker text cannot move it. tests/stores/test_throttling.py pins these shapes against live
# obstore errors.

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
(see :mod:`cairn.stores.retry`). ``Decode`` (an unparseable response) and ``Unknown`` are not
retried, by either."""


_TOKEN_REQUEST = re.compile(r'\bstore: "(\w+)",\n[ \t]*source: TokenRequest \{\n')
"""object_store's error for a failed request for an access token (GCS, Azure): the
credentials are missing or refused. Its HTTP request was already retried by obstore,
and what fails is the configuration, so it is never transient. Group 1: the store."""

_GENERIC_REQUEST = re.compile(r'\bGeneric \{\n[ \t]*store: "(\w+)",\n[ \t]*source: RetryError\(')
"""object_store's error for a request that failed on its own, not wrapped in a token
request: an S3 store reports its requests to the instance metadata service for
credentials this way. Group 1: the store."""

_S3_METADATA_PATHS = ("/latest/api/token", "/latest/meta-data/iam/security-credentials")
"""The paths object_store asks the EC2 instance metadata service for when an S3 store
has no credentials configured: a session token (IMDSv2), then the role's credentials.
The service answers only on AWS's own machines."""


@dataclass(frozen=True, slots=True)
class Failure:
    """What obstore's Debug form says about a failed HTTP exchange."""

    status: int | None = None  # the status the server answered, if it answered
    error_in_success: bool = False  # S3's 200 response whose body is an error
    kind: str | None = None  # HttpErrorKind, if no response came back
    s3_code: str | None = None  # the S3 error code in the response body, if any


def debug_form(exc: BaseException) -> str:
    """The Debug form obstore appends to the message of ``exc`` (all of it if none is)."""
    return str(exc).rpartition(_DEBUG_SOURCE)[2]


def http_failure(exc: BaseException) -> Failure:
    """The status, S3 error code or connection-failure kind recorded in ``exc``."""
    debug = debug_form(exc)
    request_error = _REQUEST_ERROR.search(debug)
    if request_error is not None:
        code = _S3_ERROR_CODE.search(debug, request_error.end())
        return Failure(
            status=int(request_error.group(2)),
            error_in_success=request_error.group(1) == "Response",
            s3_code=code.group(1) if code else None,
        )
    http_error = _HTTP_ERROR.search(debug)
    return Failure(kind=http_error.group(1) if http_error else None)


def token_request_store(debug: str) -> tuple[str, int] | None:
    """The store (``"GCS"``, ...) of a failed token request in a Debug form, and where
    its source begins; None if the form records none."""
    token = _TOKEN_REQUEST.search(debug)
    return (token.group(1), token.end()) if token is not None else None


def _is_transient(failure: Failure) -> bool:
    if failure.error_in_success:
        # object_store raises Response only for a 2xx whose body is an S3 InternalError
        # or SlowDown, which it retries like a 5xx.
        return True
    if failure.status is not None:
        return failure.status in _TRANSIENT_STATUSES or (
            failure.status == 400 and failure.s3_code in _TRANSIENT_S3_CODES
        )
    return failure.kind in _TRANSIENT_HTTP_KINDS


def first_line(exc: BaseException) -> str:
    """The first line of the message of ``exc`` before obstore's Debug form."""
    text = str(exc).split(_DEBUG_SOURCE.rstrip("\n"), 1)[0].strip()
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
    missing or refused, after obstore's own retries of it) is a
    :class:`StoreCredentialsError` whatever its status (:func:`credentials_error`). A
    404 whose body carries the code of a missing bucket or container (``NoSuchBucket``,
    ``ContainerNotFound``) is a :class:`StoreNotFoundError` naming it, whatever obstore's
    class (its not-found class included). The HTTP status, when there was one, is kept
    as ``status`` on the error.

    Args:
        operation: The store operation that failed, for the error.
        path: The path it was about, for the error.
        exc: What obstore (or the OS) raised.

    Returns:
        The error to raise in its place (returned, not raised).
    """
    if isinstance(exc, CheckpointerError):
        return exc
    reason = first_line(exc)
    failure = http_failure(exc) if isinstance(exc, BaseError | OSError) else Failure()
    status = failure.status
    missing = _store_not_found(operation, path, failure, exc)
    if missing is not None:
        return missing
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(operation, path)
    if isinstance(exc, AlreadyExistsError):
        return ObjectExistsError(operation, path, reason, status=status)
    if isinstance(exc, PreconditionError):
        return PreconditionFailedError(operation, path, reason, status=status)
    if isinstance(
        exc, PermissionDeniedError | UnauthenticatedError | NotSupportedError | NotImplementedError
    ):
        return StoreError(operation, path, reason, status=status)
    credentials = credentials_error(operation, path, exc)
    if credentials is not None:
        return credentials
    if isinstance(exc, TimeoutError | ConnectionError) or _is_transient(failure):
        return TransientStoreError(operation, path, reason, status=status)
    return StoreError(operation, path, reason, status=status)


_MISSING_CONTAINER_CODES = {
    "NoSuchBucket": "bucket",
    "ContainerNotFound": "container",
}
"""The error codes (S3's and GCS's XML API, Azure Blob's) of a 404 for a bucket or
container that does not exist, and what each calls it."""

_BUCKET_NAME = re.compile(r"<BucketName>([^<]+)</BucketName>")

_URI = re.compile(r"\buri: Some\(\n[ \t]*(\S+?),?\n")

_NOT_FOUND_PATH = re.compile(r'^NotFound \{\n[ \t]*path: "((?:[^"\\]|\\.)*)",\n', re.MULTILINE)

_MISSING_ACCOUNT = re.compile(r'\bstore: "(\w+)",\n[ \t]*source: MissingAccount\b')

_STORE_NAMES = {"MicrosoftAzure": "Azure", "GCS": "GCS", "S3": "S3"}
"""object_store's names of its stores (its Debug form's ``store:``), as users say them."""

_METADATA_TOKEN_PATHS = {
    "GCS": "/computeMetadata/v1/instance/service-accounts/",
    "Azure": "/metadata/identity/oauth2/token",
}
"""Where object_store asks the cloud's metadata server for a token when no credentials
are configured: it answers only on that cloud's own machines."""

_METADATA_SERVERS = {
    "GCS": "the GCE metadata server",
    "Azure": "the Azure instance metadata service",
    "S3": "the EC2 instance metadata service",
}

_CLOUDS = {"GCS": "Google Cloud", "Azure": "Azure", "S3": "AWS"}

_CREDENTIALS_TO_SET = {
    "GCS": (
        "set GOOGLE_SERVICE_ACCOUNT to the path of a service-account key file (or "
        "GOOGLE_SERVICE_ACCOUNT_KEY to its JSON, or GOOGLE_APPLICATION_CREDENTIALS), or pass "
        "service_account_key= to open_store"
    ),
    "Azure": (
        "set AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY, or AZURE_CLIENT_ID, "
        "AZURE_CLIENT_SECRET and AZURE_TENANT_ID), or pass account_key= to open_store"
    ),
    "S3": (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
        "access_key_id= and secret_access_key= to open_store"
    ),
}

_CREDENTIALS_TO_CHECK = {
    "GCS": (
        "check the service-account key (GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY "
        "or GOOGLE_APPLICATION_CREDENTIALS)"
    ),
    "Azure": "check AZURE_CLIENT_ID, AZURE_CLIENT_SECRET and AZURE_TENANT_ID",
    "S3": "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_PROFILE",
}


def _store_not_found(
    operation: str, path: str, failure: Failure, exc: BaseException
) -> StoreNotFoundError | None:
    """The :class:`StoreNotFoundError` ``exc`` records, if its 404 is a missing bucket."""
    kind = _MISSING_CONTAINER_CODES.get(failure.s3_code or "")
    if kind is None or failure.status != 404:
        return None
    assert failure.s3_code is not None
    name = _container_name(debug_form(exc))
    return StoreNotFoundError(operation, path, kind, name, failure.s3_code, status=404)


def _container_name(debug: str) -> str | None:
    """The bucket or container a failed request named: S3 says it in its answer
    (``<BucketName>``); otherwise it is the last segment of the request's URL path
    before the object's own path (path-style URLs, Azure's and GCS's XML API), or the
    first label of the host (S3's virtual-hosted style)."""
    named = _BUCKET_NAME.search(debug)
    if named is not None:
        return named.group(1)
    uri = _URI.search(debug)
    if uri is None:
        return None
    parts = urlsplit(uri.group(1))
    request_path = unquote(parts.path)
    object_path = _NOT_FOUND_PATH.search(debug)
    if object_path is not None:
        suffix = "/" + re.sub(r"\\(.)", r"\1", object_path.group(1))
        if request_path.endswith(suffix):
            request_path = request_path[: -len(suffix)]
    segments = [segment for segment in request_path.split("/") if segment]
    if segments:
        return segments[-1]
    host = parts.hostname or ""
    return host.split(".", 1)[0] or None


def credentials_error(
    operation: str, path: str, exc: BaseException
) -> StoreCredentialsError | None:
    """The :class:`StoreCredentialsError` for ``exc``, if it says the credentials are
    missing or refused: a failed token request (object_store asks a cloud's metadata
    server for one when none is configured: off that cloud nobody answers), or an Azure
    store built without an account (``MissingAccount``). None for anything else."""
    if not isinstance(exc, BaseError):
        return None
    debug = debug_form(exc)
    account = _MISSING_ACCOUNT.search(debug)
    if account is not None:
        store = _STORE_NAMES.get(account.group(1), account.group(1))
        return StoreCredentialsError(
            operation,
            path,
            store,
            f"no {store} storage account is configured",
            "set AZURE_STORAGE_ACCOUNT_NAME (and a credential such as "
            "AZURE_STORAGE_ACCOUNT_KEY), or pass account_name= to open_store",
        )
    token = token_request_store(debug) or _s3_metadata_request(debug)
    if token is None:
        return None
    store = _STORE_NAMES.get(token[0], token[0])
    failure = http_failure(exc)
    answer = "no answer"
    if failure.status is not None:
        answer = f"HTTP {failure.status}"
    elif failure.kind is not None:
        answer = f"no answer ({failure.kind.lower()} failed)"
    uri = _URI.search(debug, token[1])
    where = urlsplit(uri.group(1)).netloc if uri else "the token service"
    if uri is not None and _asks_metadata_server(store, uri.group(1)):
        server = _METADATA_SERVERS[store]
        problem = (
            f"no {store} credentials are configured, and {server} ({where}, only on "
            f"{_CLOUDS[store]}) gave no token: {answer} to {operation} {path!r}"
        )
        remedy = _CREDENTIALS_TO_SET.get(store, "configure the store's credentials")
    else:
        problem = (
            f"the {store} credentials were refused: the token request to {where} got "
            f"{answer} ({operation} {path!r})"
        )
        remedy = _CREDENTIALS_TO_CHECK.get(store, "check the store's credentials")
    return StoreCredentialsError(operation, path, store, problem, remedy, status=failure.status)


def _s3_metadata_request(debug: str) -> tuple[str, int] | None:
    """``("S3", where its source begins)`` when the Debug form records a failed request
    of an S3 store to the instance metadata service for credentials; None otherwise."""
    request = _GENERIC_REQUEST.search(debug)
    if request is None or request.group(1) != "S3":
        return None
    uri = _URI.search(debug, request.end())
    if uri is None or not _asks_metadata_server("S3", uri.group(1)):
        return None
    return "S3", request.end()


def _asks_metadata_server(store: str, uri: str) -> bool:
    """Whether ``uri`` is a request of ``store`` to its cloud's metadata server for
    credentials (made only when none are configured)."""
    if store == "S3":
        return urlsplit(uri).path.startswith(_S3_METADATA_PATHS)
    metadata = _METADATA_TOKEN_PATHS.get(store)
    return metadata is not None and metadata in uri


async def call(operation: str, path: str, awaitable: Awaitable[T]) -> T:
    """Await an obstore call; what it raises, translated (:func:`translate_error`)."""
    try:
        return await awaitable
    except (BaseError, OSError, NotImplementedError) as exc:
        raise translate_error(operation, path, exc) from exc
    finally:
        _shutdown.note_store_call()


def info_of(meta: Any, *, quote_e_tag: bool = False) -> ObjectInfo:
    """The :class:`ObjectInfo` of obstore's ``ObjectMeta`` (its e-tag quoted if asked)."""
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
