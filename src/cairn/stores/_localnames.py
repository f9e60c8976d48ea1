"""Object paths of a local store and the files that hold them, as obstore lays them out.

An object is the file at its path below the root; a write stages its bytes in
``{name}#{n}`` beside it, a name no listing shows and no path addresses; the metadata of
an object (size, e-tag, modification time) is what obstore's local store reports, so a
directory either wrote reads the same through the other.

Invariant: a path that is not a valid object path (an empty, ``.`` or ``..`` segment, a
NUL) is a :class:`~cairn.errors.StoreError` naming it, before any file is touched, so no
object path reaches above the root.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets

from cairn.errors import StoreError
from cairn.stores._types import ObjectInfo

__all__ = ["is_staging", "is_utf8", "object_info", "object_parts", "path_parts", "staging_name"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def path_parts(operation: str, path: str) -> list[str]:
    """The components of an object path, as obstore parses them; StoreError if invalid."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    for part in parts:
        if part in ("", ".", "..") or "\x00" in part:
            raise StoreError(operation, path, f"not a valid object path (segment {part!r})")
    return parts


def object_parts(operation: str, path: str) -> list[str]:
    """The components of a path that names an object: not the root, not a staging file."""
    parts = path_parts(operation, path)
    if not parts:
        raise StoreError(operation, path, "not an object path")
    if is_staging(parts[-1]):
        raise StoreError(operation, path, "a name ending in '#<digits>' is no object")
    return parts


def is_staging(name: str) -> bool:
    """Whether ``name`` is a write's staging file, ``{name}#{n}`` (obstore's too)."""
    _, hash_sign, suffix = name.partition("#")
    return bool(hash_sign) and suffix.isascii() and suffix.isdigit()


def staging_name(name: str) -> str:
    """A fresh staging name for a write of ``name``."""
    return f"{name}#{secrets.randbelow(10**9)}"


def is_utf8(name: str) -> bool:
    """Whether ``name`` is UTF-8: one that is not (decoded with surrogate escapes) is no
    object path."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def object_info(path: str, st: os.stat_result) -> ObjectInfo:
    """The metadata obstore's local store reports, so that a listing and a HEAD agree."""
    micros = st.st_mtime_ns // 1000
    return ObjectInfo(
        path=path,
        size=st.st_size,
        e_tag=f'"{st.st_ino:x}-{max(micros, 0):x}-{st.st_size:x}"',
        last_modified=_EPOCH + dt.timedelta(microseconds=micros),
    )
