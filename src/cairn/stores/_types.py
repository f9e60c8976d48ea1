"""The values the store boundary speaks in: object info, blobs, listings, put modes, the
capabilities a store declares, and the argument types its methods share. Pure: no I/O."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from cairn.errors import InvalidInputError
from cairn.format._buffer import Buffer

__all__ = [
    "Blob",
    "IfMatch",
    "ListDirResult",
    "Metadata",
    "ObjectInfo",
    "OpenChunks",
    "PutMode",
    "StoreCall",
    "StoreCapabilities",
    "StoreMethod",
    "capabilities_of",
    "empty_range",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a HEAD or a listing tells about one object.

    A compare-and-swap of this version is ``IfMatch(info.e_tag, info.version)``.

    Attributes:
        path: The object's store path.
        size: Its size in bytes.
        e_tag: Its entity tag, or None where the store gives none.
        last_modified: When this version was written, as the store reports it.
        version: The store's own name for this version, where it keeps one: GCS's
            generation (on every ``get``, ``head``, ``stat`` and ``put``; GCS listings
            carry none), S3's or Azure's version id where versioning is on, None
            elsewhere.
    """

    path: str
    size: int
    e_tag: str | None
    last_modified: dt.datetime
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Blob:
    """An object's bytes with the metadata of the version that was read.

    Attributes:
        data: The bytes.
        info: The metadata of the version they are.
    """

    data: Buffer
    info: ObjectInfo


@dataclass(frozen=True, slots=True)
class ListDirResult:
    """One level of a listing: sub-directories and objects.

    Attributes:
        prefixes: The sub-directories, each ending in ``/``.
        objects: The objects directly at this level.
    """

    prefixes: list[str]
    objects: list[ObjectInfo]


@dataclass(frozen=True, slots=True)
class IfMatch:
    """Put mode: replace the object only if it is still the version read before.

    Stores compare what they keep: the e-tag (memory, S3, Azure, a local directory), or
    the version where that is the only identity a write can be conditioned on: GCS
    compares generations alone (its e-tag is the MD5 of the bytes, the same for two
    writes of the same bytes) and refuses a compare-and-swap without ``version``.

    Attributes:
        e_tag: The e-tag of the version read, as :class:`ObjectInfo` gives it.
        version: Its version, as :class:`ObjectInfo` gives it, or None.
    """

    e_tag: str
    version: str | None = None


PutMode = Literal["overwrite", "create"] | IfMatch
"""``"overwrite"``, ``"create"`` (fail if the object exists) or :class:`IfMatch`."""


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """What a store declares about how it does the :class:`Store` operations.

    Every store does every operation, with the meaning the protocol states; a capability
    says *how*, where backends differ in a way a caller or the store contract must know.
    The defaults claim nothing: they are what :func:`capabilities_of` assumes of a store
    that declares none.

    Attributes:
        native_compare_and_swap: ``put(mode=IfMatch(...))`` is done by the backend
            itself, atomically for every client. False where cairn emulates it (a local
            directory, under an OS file lock that holds between the processes of one
            host only) or cannot tell.
        user_metadata: ``put``'s ``metadata`` is stored and :meth:`Store.stat` returns
            it. Where False, it is dropped.
        local_path: For a store whose objects are the files below a local directory,
            that directory. Symbolic links can appear there; cairn's local store never
            follows them. None for every other store.
    """

    native_compare_and_swap: bool = False
    user_metadata: bool = False
    local_path: Path | None = None


def capabilities_of(store: object) -> StoreCapabilities:
    """The :class:`StoreCapabilities` that ``store`` declares as ``capabilities``.

    A store without that attribute (or with one of another type) gets
    ``StoreCapabilities()``, which claims nothing.

    Args:
        store: Any store.

    Returns:
        Its declared capabilities, or ``StoreCapabilities()``.
    """
    declared = getattr(store, "capabilities", None)
    return declared if isinstance(declared, StoreCapabilities) else StoreCapabilities()


StoreMethod = Literal[
    "get",
    "get_range",
    "head",
    "put",
    "put_stream",
    "stat",
    "list_dir",
    "list",
    "delete",
    "delete_prefix",
]
"""The name of one :class:`Store` method, as :meth:`ForwardingStore._around` receives it."""

Metadata = Mapping[str, str] | None
"""A put's user metadata (kept where ``user_metadata`` is declared)."""

OpenChunks = Callable[[], AsyncIterator[Buffer]]
"""What ``put_stream`` calls, once per attempt, for the chunks of the object."""

StoreCall = Callable[[], Awaitable[T]]
"""One call of a store method, as :meth:`ForwardingStore._around` receives it."""


def empty_range(path: str, start: int, end: int) -> bool:
    """Whether ``get_range(path, start, end)`` asks for no bytes; :class:`InvalidInputError`
    unless ``0 <= start <= end`` (obstore raises a bare ValueError for those)."""
    if not 0 <= start <= end:
        raise InvalidInputError(
            f"get_range of {path!r}: a byte range needs 0 <= start <= end, "
            f"got start={start!r}, end={end!r}"
        )
    return start == end
