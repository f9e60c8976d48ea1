"""What a DCP ``checkpoint_id`` names in a cairn store. Pure but for ``realpath``.

``dcp.save(..., checkpoint_id=X)`` and ``dcp.load(..., checkpoint_id=X)`` hand ``X`` to
the storage's ``reset``. DCP's own file-system writer takes ``X`` as a directory;
torchtitan and torchtune pass ``f"{folder}/step-{n}"``. cairn keeps every checkpoint
under its own id (a fresh UUIDv7 for each save), so ``X`` is read as follows:

1. a :class:`~cairn.CheckpointId`, or its text (a UUIDv7): that checkpoint id;
2. an ``os.PathLike`` is its ``os.fspath`` (text; bytes paths are refused);
3. a *location*, that is a URL (``s3://bucket/run/step-10``, ``file:///data/run/step-10``:
   text that starts with the scheme of a store cairn opens) or an absolute path
   (``/data/run/step-10``), must lie inside the store the writer or
   reader was given: the part below the store's root is kept (``run/step-10``). A
   location anywhere else, or one the store cannot be compared with (a memory store, a
   wrapper that hides where its store is), raises :class:`~cairn.CheckpointLocationError` (an
   :class:`~cairn.InvalidInputError`): nothing is ever written to, or read from, a place
   other than the one the checkpoint_id names. Local paths are compared after
   resolving symbolic links, URLs by scheme (``s3a`` is ``s3``, ``azure`` is ``az``),
   bucket and key prefix;
4. anything else is relative text, taken as it is, relative to the store's root (never
   to the working directory): ``step-100``, ``runs/a/step-100``, ``./step-100``;
5. the kept text is normalised (empty and ``.`` segments dropped; ``..`` is refused). If
   it is a checkpoint id, or ``{prefix}{id}`` (the directory cairn keeps that checkpoint
   in), it is that id; otherwise it is the checkpoint's *name*
   (:func:`~cairn.format.layout.validate_checkpoint_name`).

A save under a name commits a new checkpoint (a fresh id) whose manifest records the
name; a load by a name loads the newest committed checkpoint with that name (see
:func:`cairn.protocol._catalog.named_candidates`). Saving twice under one name makes two
checkpoints: the earlier one keeps its bytes and stays loadable by its id.

``validate_checkpoint_id`` (a class method: it knows no store) answers steps 1, 2, 4 and
5, and for a location whether it is well formed: it is True exactly for what ``reset``
accepts from a writer whose store holds the location.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from obstore.store import AzureStore, GCSStore, LocalStore, S3Store

from cairn.errors import CheckpointLocationError, InvalidInputError, InvalidStoreUrlError
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths, short_repr, validate_checkpoint_name
from cairn.integrations._interface import REMOTE_SCHEMES
from cairn.stores import ForwardingStore, ObstoreStore, capabilities_of, store_url

__all__ = [
    "StoreLocation",
    "Target",
    "interpret",
    "store_location",
    "well_formed",
]

Target = CheckpointId | str
"""What a checkpoint_id names: a checkpoint id, or a checkpoint name (text)."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_STORE_SCHEMES = REMOTE_SCHEMES | {"file", "memory"}
_FAMILIES = {"s3a": "s3", "azure": "az"}


@dataclass(frozen=True)
class StoreLocation:
    """Where a store's root is: a scheme family, a bucket (or host), and path segments.

    ``family`` is ``"file"`` for a local directory (``segments`` of its real path),
    ``"s3"``, ``"gs"``, ``"az"``, or another URL scheme as given. ``shown`` names it in
    messages.
    """

    family: str
    bucket: str
    segments: tuple[str, ...]
    shown: str


def _segments(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part not in ("", "."))


def _local(path: str | os.PathLike[str]) -> StoreLocation:
    real = os.path.realpath(os.fspath(path))
    return StoreLocation("file", "", _segments(real), f"file://{real}")


def _from_url(url: str) -> StoreLocation | None:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        return None
    if scheme == "file":
        return _local(unquote(parts.path))
    family = _FAMILIES.get(scheme, scheme)
    return StoreLocation(family, parts.netloc, _segments(unquote(parts.path)), url)


def store_location(store: Any) -> StoreLocation | None:
    """Where ``store`` (a URL or path, an obstore store, a cairn store) keeps its objects;
    None when that cannot be told (a memory store, a wrapper of an unknown kind)."""
    if isinstance(store, str):
        try:
            return _from_url(store_url(store))
        except InvalidStoreUrlError:
            return None
    if isinstance(store, ObstoreStore):
        return store_location(store.obstore)
    if isinstance(store, ForwardingStore):
        return store_location(store.inner)
    if (root := capabilities_of(store).local_path) is not None:  # cairn's local store
        return _local(root)
    prefix = str(getattr(store, "prefix", None) or "")
    if isinstance(store, LocalStore):
        return _local(prefix or "/")
    bucket = None
    if isinstance(store, S3Store):
        family, bucket = "s3", store.config.get("bucket")
    elif isinstance(store, GCSStore):
        family, bucket = "gs", store.config.get("bucket")
    elif isinstance(store, AzureStore):
        family, bucket = "az", store.config.get("container_name")
    if bucket is None:
        return None
    segments = _segments(prefix)
    return StoreLocation(family, bucket, segments, f"{family}://{bucket}/{'/'.join(segments)}")


def _text(value: object, what: str) -> str | CheckpointId:
    if isinstance(value, CheckpointId):
        return value
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InvalidInputError(
            f"{what} must be a checkpoint id, a name or a path (str or os.PathLike of "
            f"str), got {short_repr(value)}"
        )
    return value


def _is_location(text: str) -> bool:
    """An absolute path, or text that starts with a store URL's scheme (``s3:``): a URL,
    if malformed a refused one, never a name (``step:1`` is a name)."""
    scheme = _SCHEME.match(text)
    return text.startswith("/") or (
        scheme is not None and scheme.group(1).lower() in _STORE_SCHEMES
    )


def _location_of(text: str) -> StoreLocation:
    """The location ``text`` (a URL or an absolute path) names; InvalidInputError if it
    is not a well-formed one."""
    if text.startswith("/"):
        return _local(text)
    try:
        location = _from_url(store_url(text))
    except InvalidStoreUrlError as exc:
        raise InvalidInputError(f"checkpoint_id {text!r} is not a usable URL: {exc}") from None
    if location is None:
        raise InvalidInputError(f"checkpoint_id {text!r}: a memory store has no locations")
    return location


def _normalized(text: str, what: str) -> str:
    parts = _segments(text)
    if ".." in parts:
        raise InvalidInputError(f"{what} {text!r} climbs out with '..': give a plain name")
    if not parts:
        raise InvalidInputError(f"{what} {text!r} names no checkpoint: give a name")
    return "/".join(parts)


def _final(rest: str, paths: CheckpointPaths | None, what: str) -> Target:
    name = _normalized(rest, what)
    if CheckpointId.is_valid(name):
        return CheckpointId.parse(name)
    if paths is not None:
        base = paths.base_prefix
        tail = name[len(base) :] if base and name.startswith(base) else None
        if tail is not None and CheckpointId.is_valid(tail):
            return CheckpointId.parse(tail)
    validate_checkpoint_name(name)
    return name


def well_formed(value: object) -> bool:
    """Whether ``value`` is a checkpoint_id :func:`interpret` can accept (for some store)."""
    try:
        text = _text(value, "checkpoint_id")
        if isinstance(text, CheckpointId):
            return True
        if _is_location(text):
            _location_of(text)
            return True
        _final(text, None, "checkpoint_id")
    except InvalidInputError:
        return False
    return True


def interpret(value: object, store: Any, paths: CheckpointPaths, what: str) -> Target:
    """What a DCP checkpoint_id names in a store (see the module docstring).

    Args:
        value: The checkpoint_id, as DCP hands it to ``reset``.
        store: The store the writer or reader was given.
        paths: The checkpoint layout in it (a ``{prefix}{id}`` text names that id).
        what: What error messages call ``value`` (``"checkpoint_id"``).

    Returns:
        A checkpoint id, or a checkpoint name.

    Raises:
        CheckpointLocationError: ``value`` is a location outside ``store``, its root,
            or one ``store`` cannot be compared with.
        InvalidInputError: ``value`` names nothing there; the message names ``what``.
    """
    text = _text(value, what)
    if isinstance(text, CheckpointId):
        return text
    if not _is_location(text):
        return _final(text, paths, what)
    wanted = _location_of(text)
    root = store_location(store)
    if root is None:
        raise CheckpointLocationError(
            text, short_repr(store, 80), "is a location, and this store has none to compare"
        )
    inside = (
        wanted.family == root.family
        and wanted.bucket == root.bucket
        and wanted.segments[: len(root.segments)] == root.segments
    )
    if not inside:
        raise CheckpointLocationError(text, root.shown, "is a location outside the store")
    rest = wanted.segments[len(root.segments) :]
    if not rest:
        raise CheckpointLocationError(
            text, root.shown, "is the store's root itself, not a checkpoint in it"
        )
    return _final(posixpath.join(*rest), paths, what)
