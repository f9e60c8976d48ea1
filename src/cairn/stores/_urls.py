"""Opening stores by URL: one parser for every way a store is named, in the library and
on the command line (a plain path is a local directory)."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from obstore.exceptions import (
    BaseError,
)
from obstore.store import (
    LocalStore,
    MemoryStore,
    ObjectStore,
    from_url,
)

from cairn.errors import (
    InvalidStoreUrlError,
    StoreCredentialsError,
    StoreNotFoundError,
)
from cairn.stores._translate import credentials_error, first_line

__all__ = [
    "DEFAULT_CLIENT_RETRY",
    "REMOTE_SCHEMES",
    "explain_store_error",
    "local_directory",
    "open_store",
    "store_url",
]


_S3_SCHEMES = frozenset({"s3", "s3a"})

_S3_ENDPOINT_KEYS = (
    "aws_endpoint_url_s3",
    "endpoint_url_s3",
    "aws_endpoint_url",
    "endpoint_url",
    "aws_endpoint",
    "endpoint",
)


DEFAULT_CLIENT_RETRY: dict[str, Any] = {
    "max_retries": 2,
    "backoff": {
        "init_backoff": dt.timedelta(milliseconds=100),
        "max_backoff": dt.timedelta(seconds=2),
        "base": 2,
    },
    "retry_timeout": dt.timedelta(seconds=30),
}
"""obstore's own HTTP retry for stores opened by URL.

obstore retries a failed HTTP request (connection errors, 5xx, timeouts of safe
requests) inside one call; cairn's :class:`~cairn.RetryPolicy` retries the whole
operation on what is still transient after that. Keeping obstore's layer short bounds a
persistent fault to ``(max_retries + 1) * RetryPolicy.attempts`` HTTP requests per
operation (3 x 4 = 12 with the defaults) instead of obstore's default of 11 per attempt.
Pass ``retry_config=...`` to :func:`open_store` to choose otherwise.
"""


REMOTE_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https"})
"""The URL schemes of the remote object stores :func:`open_store` opens."""


_URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


_URL_SHAPES = {
    "memory": "memory://",
    "file": "an absolute path: file:///abs/dir",
    "s3": "s3://bucket/prefix",
    "s3a": "s3a://bucket/prefix",
    "gs": "gs://bucket/prefix",
    "http": "http://host/path",
    "https": "https://host/path",
}


def store_url(location: str) -> str:
    """The URL of a store ``location``: a URL as given, a plain path as a ``file://`` URL.

    A location with no scheme is a local directory, made absolute against the current
    directory (``~`` expanded): ``checkpoints``, ``./dir``, ``/abs/dir``. A location that
    starts with a scheme (``s3:``) must be a URL: the scheme followed by ``//``. Anything
    else raises :class:`InvalidStoreUrlError` naming the location, with the same message
    wherever it is met (:func:`open_store`, the checkpointers, the ``cairn`` command):
    ``s3:/x`` is a malformed URL, not a directory. A local directory whose name has a
    colon is written with a slash first (``./a:b``).

    Args:
        location: A store URL, or a local directory's path.

    Returns:
        The URL.

    Raises:
        InvalidStoreUrlError: ``location`` is not a string, is empty, or is a malformed URL.
    """
    if not isinstance(location, str):
        raise InvalidStoreUrlError(repr(location), "a store URL must be a string")
    if not location.strip():
        raise InvalidStoreUrlError(location, "the store URL is empty")
    scheme = _URL_SCHEME.match(location)
    if scheme is None:
        return Path(os.path.abspath(os.path.expanduser(location))).as_uri()
    name = scheme.group(1).lower()
    slashes = location[scheme.end() :].startswith("//")
    if name not in REMOTE_SCHEMES and name not in ("memory", "file"):
        hint = "" if slashes else f" (a local directory named so is written ./{location})"
        raise InvalidStoreUrlError(
            location, f"unknown scheme {scheme.group(1)!r}; use memory, file, s3, gs or az{hint}"
        )
    if not slashes:
        shape = _URL_SHAPES.get(name, f"{name}://container/prefix")
        raise InvalidStoreUrlError(
            location, f"malformed URL: {scheme.group(0)} must be followed by // ({shape})"
        )
    return location


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _check_plain_http(url: str, options: Mapping[str, Any]) -> None:
    """Refuse an S3 endpoint over plain HTTP unless HTTP is allowed, before any request.

    object_store refuses such requests one by one with a bare "builder error"; the
    setting that allows them is named here instead.
    """
    lowered = {key.lower(): value for key, value in options.items()}
    config = lowered.get("config")
    if isinstance(config, Mapping):
        lowered = {**{key.lower(): value for key, value in config.items()}, **lowered}
    endpoint = next(
        (value for key in _S3_ENDPOINT_KEYS if isinstance(value := lowered.get(key), str)),
        None,
    )
    if endpoint is None:
        endpoint = next(
            (
                value
                for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
                if (value := os.environ.get(name))
            ),
            None,
        )
    if endpoint is None or not endpoint.lower().startswith("http://"):
        return
    client = lowered.get("client_options")
    allowed = isinstance(client, Mapping) and _flag(
        {key.lower(): value for key, value in client.items()}.get("allow_http", False)
    )
    if allowed or _flag(os.environ.get("AWS_ALLOW_HTTP", "")):
        return
    raise InvalidStoreUrlError(
        url,
        f"the S3 endpoint {endpoint} is plain HTTP, which is refused unless allowed: set "
        "AWS_ALLOW_HTTP=true (or pass client_options={'allow_http': True}), or use https://",
    )


def open_store(url: str, **options: Any) -> ObjectStore:
    """Open the obstore store a URL (or a plain path) names; ``options`` go to obstore.

    ``memory://`` (a new, empty in-memory store), ``file:///abs/dir`` or a plain path
    such as ``./dir`` (a local directory, created if missing), ``s3://bucket/prefix``,
    ``gs://bucket/prefix``, ``az://container/prefix`` (and the other URL forms obstore
    knows for those services). An unknown scheme or a malformed URL raises
    :class:`InvalidStoreUrlError` naming the URL (see :func:`store_url`), as does an S3
    endpoint over plain HTTP while HTTP is not allowed (``AWS_ALLOW_HTTP``). A store
    that cannot be built for want of credentials (an Azure URL without an account)
    raises :class:`~cairn.StoreCredentialsError` naming what to set.

    Args:
        url: The store's URL, or a local directory's path.
        **options: Passed to obstore's store for the scheme (credentials, region, ...).

    Returns:
        The obstore store.

    Raises:
        InvalidStoreUrlError: An unknown scheme, a malformed URL, or plain HTTP not allowed.
        StoreCredentialsError: The store cannot be built for want of credentials.
    """
    url, parts = _split(url)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        if parts.netloc or parts.path.strip("/") or options:
            raise InvalidStoreUrlError(url, "memory:// takes no path and no options")
        return MemoryStore()
    if scheme == "file":
        root = _local_root(url, parts)
        unknown = set(options) - {"automatic_cleanup", "mkdir"}
        if unknown:
            raise InvalidStoreUrlError(url, f"unknown option(s) for file stores: {sorted(unknown)}")
        try:
            if options.get("mkdir", True):
                root.mkdir(parents=True, exist_ok=True)
            return LocalStore(root, **options)
        except (BaseError, OSError) as exc:
            raise InvalidStoreUrlError(url, first_line(exc)) from None
    if not parts.netloc:
        raise InvalidStoreUrlError(url, "missing bucket or container name")
    if scheme in _S3_SCHEMES:
        _check_plain_http(url, options)
    options.setdefault("retry_config", DEFAULT_CLIENT_RETRY)
    try:
        return from_url(url, **options)
    except (BaseError, ValueError, TypeError) as exc:
        credentials = credentials_error("open", url, exc)
        if credentials is not None:
            raise credentials from exc
        raise InvalidStoreUrlError(url, first_line(exc)) from None


def explain_store_error(exc: BaseException, url: str | None = None) -> str | None:
    """What is wrong and what to do, for the store failures a newcomer meets; None when
    there is nothing better to say than ``str(exc)``.

    The library raises those failures as their own errors, whose messages say it all:
    :class:`~cairn.StoreNotFoundError` (a bucket or container that does not exist) and
    :class:`~cairn.StoreCredentialsError` (credentials missing or refused). This returns
    that message.

    Args:
        exc: The failure.
        url: Accepted, and unused.

    Returns:
        The explanation, or None.
    """
    del url
    if isinstance(exc, StoreNotFoundError | StoreCredentialsError):
        return str(exc)
    return None


def _split(url: str) -> tuple[str, SplitResult]:
    url = store_url(url)
    try:
        return url, urlsplit(url)
    except ValueError as exc:
        raise InvalidStoreUrlError(url, str(exc)) from None


def _local_root(url: str, parts: SplitResult) -> Path:
    """The directory a ``file://`` URL names."""
    if parts.netloc not in ("", "localhost"):
        raise InvalidStoreUrlError(url, f"file URLs name a local path, not host {parts.netloc!r}")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise InvalidStoreUrlError(url, "file URLs need an absolute path (file:///abs/dir)")
    return Path(path)


def local_directory(url: str) -> Path | None:
    """The local directory a URL or plain path names (made if missing), None if the URL
    names another kind of store; :class:`InvalidStoreUrlError` as :func:`open_store`."""
    url, parts = _split(url)
    if parts.scheme.lower() != "file":
        return None
    root = _local_root(url, parts)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidStoreUrlError(url, first_line(exc)) from None
    return root
