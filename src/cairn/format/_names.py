"""The rules names follow, and the names cairn writes in a checkpoint directory. Pure: no I/O.

Specified in docs/format.md, section "Layout". The public path of these names is
:mod:`cairn.format.layout`, which re-exports them and lists them in its ``__all__``.

Invariants:

* operator and source names are validated before they become path segments, so no name
  can climb out of its checkpoint or collide with another object's path;
* :func:`validate_relative_path` rejects any relative path that is absolute or climbs out,
  so a manifest entry never points outside its checkpoint directory;
* every name that validates can be stored in a local directory and restored by
  ``cairn restore``: each path component stays within the 255-byte limit of common file
  systems (ext4, XFS, APFS, NTFS), including the temporary names their writers use
  (see :data:`MAX_SOURCE_NAME_BYTES`);
* :func:`is_cairn_name` is true only of names cairn writes in a checkpoint directory, each
  with a valid operator or source name and partition: GC and deletion remove no other.
"""

from __future__ import annotations

import re
import secrets

from cairn.errors import InvalidInputError, InvalidNameError
from cairn.format._validate import is_int
from cairn.format.ids import CheckpointId

MAX_NAME_BYTES = 255
"""The longest operator name, in UTF-8 bytes: it is a directory name (``operators/{op}/``),
and 255 bytes is the file-name limit of ext4, XFS, APFS and NTFS."""

_TEMP_NAME_ROOM = 14
"""Bytes a writer of a file may add to its name for a temporary twin: ``cairn restore``
writes ``.{name}.XXXXXXXX.tmp`` (14 more) and obstore's local store ``{name}#{n}``."""

SOURCE_SUFFIX = ".json"

MAX_SOURCE_NAME_BYTES = MAX_NAME_BYTES - len(SOURCE_SUFFIX) - _TEMP_NAME_ROOM
"""The longest source name, in UTF-8 bytes (236). A source name becomes a file name,
``offsets/{source}.json``, and its temporary twin must fit in 255 bytes too."""

MAX_PARTITION = 2**32 - 1

MAX_RELATIVE_PATH_BYTES = 1024
"""The longest artifact path relative to a checkpoint directory, in UTF-8 bytes. The
longest path cairn makes is ``operators/{255 bytes}/partition-4294967295.delta`` (292);
the bound leaves room and keeps every full path far below the 4096 of ``PATH_MAX``."""

_NAME_LIMITS = {"source": MAX_SOURCE_NAME_BYTES}

MAX_CHECKPOINT_NAME_BYTES = 1024
"""The longest checkpoint name (a label recorded in a manifest), in UTF-8 bytes."""

MANIFEST_NAME = "manifest.json"
INTENT_NAME = "intent.json"

ATTEMPT_HEX = 12
_ATTEMPT = re.compile(rf"[0-9a-f]{{{ATTEMPT_HEX}}}")
# operators/{operator}/partition-{p}.{attempt}.{snap|delta}, as relative_artifact writes
# it, or .file-{n}, one file of a directory partition, as relative_file writes it.
_ATTEMPT_ARTIFACT = re.compile(
    rf"operators/[^/]+/partition-(?:0|[1-9][0-9]*)\.[0-9a-f]{{{ATTEMPT_HEX}}}"
    r"\.(?:snap|delta|file-(?:0|[1-9][0-9]*))"
    # packs/pack-{n}.{attempt}.pack, as relative_pack writes it
    rf"|packs/pack-(?:0|[1-9][0-9]*)\.[0-9a-f]{{{ATTEMPT_HEX}}}\.pack"
)
_PACK = re.compile(rf"packs/pack-(?:0|[1-9][0-9]*)\.[0-9a-f]{{{ATTEMPT_HEX}}}\.pack")
_MANIFEST_PART = re.compile(r"parts/part-[0-9a-f]{64}\.json")
# intent.{attempt}.json, as intent() names a save's; intent.json, the intent shared by the
# processes that upload parts of one save.
_INTENT = re.compile(rf"intent(?:\.[0-9a-f]{{{ATTEMPT_HEX}}})?\.json")
# operators/{operator}/partition-{p}.{snap|delta}: the reference's attempt-less names
# (save_snapshot, save_delta, and stored checkpoints whose names carry no attempt).
_PLAIN_ARTIFACT = re.compile(
    r"operators/(?P<operator>[^/]+)/partition-(?P<partition>0|[1-9][0-9]*)\.(?:snap|delta)"
)
# operators/{operator}/partition-{p}..., any name above with its operator and partition.
_OPERATOR_PARTITION = re.compile(r"operators/(?P<operator>[^/]+)/partition-(?P<partition>[0-9]+)\.")
# offsets/{source}.json: copies of source offsets that checkpoints of cairn 0.1 hold.
_SOURCE_OFFSET = re.compile(rf"offsets/(?P<source>[^/]+){re.escape(SOURCE_SUFFIX)}")


def new_attempt() -> str:
    """A fresh attempt token: 12 random lowercase hex digits (48 bits).

    Each save attempt draws its own, and every artifact it uploads carries it, so two
    writers of the same checkpoint id (a job re-run beside a zombie of the old run) write
    disjoint objects.
    """
    return secrets.token_hex(ATTEMPT_HEX // 2)


def is_attempt(token: object) -> bool:
    """True when ``token`` is an attempt token, as :func:`new_attempt` draws them."""
    return isinstance(token, str) and _ATTEMPT.fullmatch(token) is not None


def is_pack(relative_path: object) -> bool:
    """True when ``relative_path`` (any value) names a pack: ``packs/pack-{n}.{attempt}.pack``."""
    return isinstance(relative_path, str) and _PACK.fullmatch(relative_path) is not None


def is_manifest_part(relative_path: object) -> bool:
    """True when ``relative_path`` (any value) names a manifest part:
    ``parts/part-{sha256}.json``."""
    return isinstance(relative_path, str) and _MANIFEST_PART.fullmatch(relative_path) is not None


def is_attempt_artifact(relative_path: str) -> bool:
    """True when ``relative_path`` is an artifact name that carries an attempt token."""
    return _ATTEMPT_ARTIFACT.fullmatch(relative_path) is not None


def is_intent(relative_path: str) -> bool:
    """True when ``relative_path``, relative to a checkpoint directory, names an intent:
    ``intent.{attempt}.json`` (:meth:`~cairn.format.layout.CheckpointPaths.intent`), or
    ``intent.json`` as cairn wrote it before intents carried their save's attempt."""
    return _INTENT.fullmatch(relative_path) is not None


def is_cairn_name(relative_path: str) -> bool:
    """True when ``relative_path``, relative to a checkpoint directory, is a name cairn
    writes there: ``manifest.json`` (or its tombstone), an intent (:func:`is_intent`), an
    attempt-named artifact, file of a directory partition or pack (:func:`is_attempt_artifact`; DCP
    saves write these too), a manifest part, the reference's attempt-less
    ``operators/{operator}/partition-{p}.snap|.delta``, or ``offsets/{source}.json`` of a
    cairn 0.1 checkpoint, each with a valid operator or source name and partition.

    GC and ``delete_checkpoint`` delete only such names: anything else under a directory
    named like a checkpoint id is another application's, and stays.
    """
    if relative_path == MANIFEST_NAME or is_intent(relative_path):
        return True
    if is_manifest_part(relative_path) or is_pack(relative_path):
        return True
    if is_attempt_artifact(relative_path) or _PLAIN_ARTIFACT.fullmatch(relative_path):
        # Every such name other than a pack's begins operators/{operator}/partition-{p}.
        named = _OPERATOR_PARTITION.match(relative_path)
        return (
            named is not None
            and _is_valid_name("operator", named["operator"])
            and int(named["partition"]) <= MAX_PARTITION
        )
    source = _SOURCE_OFFSET.fullmatch(relative_path)
    return source is not None and _is_valid_name("source", source["source"])


def _is_valid_name(kind: str, name: str) -> bool:
    """True when :func:`validate_name` accepts ``name`` as a ``kind`` name."""
    try:
        validate_name(kind, name)
    except InvalidNameError:
        return False
    return True


# Exactly the characters of Unicode categories Cc (C0, DEL, C1) and Cs (surrogates), both
# fixed by Unicode's stability policy: one regex scan instead of a unicodedata lookup per
# character (validation runs for every artifact path of every save and load).
_CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def short_repr(value: object, limit: int = 160) -> str:
    """``repr(value)``, cut to about ``limit`` characters: damaged records can hold
    megabytes in one string, and an error message names the value, not all of it."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def validate_name(kind: str, name: object, *, max_bytes: int | None = None) -> str:
    """Return ``name`` if it is a usable operator or source name; else raise InvalidNameError.

    Allowed: any non-empty text that is not ``.`` or ``..``, has no ``/``, ``\\``, control
    character or unpaired surrogate, and is at most :data:`MAX_NAME_BYTES` UTF-8 bytes
    for an operator, :data:`MAX_SOURCE_NAME_BYTES` for a ``"source"`` (``max_bytes``
    overrides the limit). Spaces, ``%`` and unicode are fine and round-trip exactly.
    """
    if not isinstance(name, str):
        raise InvalidNameError(kind, name, "must be a string")
    if name in ("", ".", ".."):
        raise InvalidNameError(kind, name, "must not be empty, '.' or '..'")
    if "/" in name or "\\" in name:
        raise InvalidNameError(kind, name, "must not contain '/' or '\\'")
    if _CONTROL_OR_SURROGATE.search(name):
        raise InvalidNameError(kind, name, "must not contain control or surrogate characters")
    limit = max_bytes if max_bytes is not None else _NAME_LIMITS.get(kind, MAX_NAME_BYTES)
    size = len(name.encode("utf-8"))
    if size > limit:
        raise InvalidNameError(kind, name, f"is {size} UTF-8 bytes, the limit is {limit}")
    return name


def validate_checkpoint_name(name: object) -> str:
    """Return ``name`` if it is a usable checkpoint name; else raise InvalidNameError.

    A checkpoint name is a label recorded in a manifest (``step-100``, ``run-3/step-100``;
    see :mod:`cairn.torch`), never a path of the store: the checkpoint's objects stay
    under its id. Allowed: ``/``-separated segments, none empty, ``.`` or ``..``; no
    ``\\``, control character or unpaired surrogate; at most
    :data:`MAX_CHECKPOINT_NAME_BYTES` UTF-8 bytes; and not a checkpoint id's text (a
    UUIDv7), which names the checkpoint with that id instead.
    """
    if not isinstance(name, str):
        raise InvalidNameError("checkpoint name", name, "must be a string")
    if any(segment in ("", ".", "..") for segment in name.split("/")):
        raise InvalidNameError(
            "checkpoint name", name, "must be '/'-separated segments, none empty, '.' or '..'"
        )
    if "\\" in name:
        raise InvalidNameError("checkpoint name", name, "must not contain '\\'")
    if _CONTROL_OR_SURROGATE.search(name):
        raise InvalidNameError(
            "checkpoint name", name, "must not contain control or surrogate characters"
        )
    size = len(name.encode("utf-8"))
    if size > MAX_CHECKPOINT_NAME_BYTES:
        limit = MAX_CHECKPOINT_NAME_BYTES
        raise InvalidNameError(
            "checkpoint name", name, f"is {size} UTF-8 bytes, the limit is {limit}"
        )
    if CheckpointId.is_valid(name):
        raise InvalidNameError("checkpoint name", name, "is a checkpoint id, not a name")
    return name


def validate_partition(partition: object) -> int:
    """Return ``partition`` if it is an int in 0..2**32-1; else raise InvalidNameError."""
    if not is_int(partition):
        raise InvalidNameError("partition", partition, "must be an int")
    if not 0 <= partition <= MAX_PARTITION:
        raise InvalidNameError("partition", partition, f"must be in 0..{MAX_PARTITION}")
    return partition


def validate_relative_path(path: object) -> str:
    """Return ``path`` if it is a safe path relative to a checkpoint directory.

    Rejects absolute paths, empty segments, ``.`` and ``..`` segments, backslashes and
    control characters, so a manifest entry can never point outside its checkpoint; and
    a segment over :data:`MAX_NAME_BYTES` or a path over :data:`MAX_RELATIVE_PATH_BYTES`
    UTF-8 bytes, which no store could hold in a local directory.
    """
    if not isinstance(path, str) or not path:
        raise InvalidInputError(f"artifact path must be a non-empty string, got {short_repr(path)}")
    if path.startswith("/") or "\\" in path:
        raise InvalidInputError(f"artifact path must be relative: {short_repr(path)}")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidInputError(
                f"artifact path must not climb out or be empty: {short_repr(path)}"
            )
    if _CONTROL_OR_SURROGATE.search(path):
        raise InvalidInputError(f"artifact path has control characters: {short_repr(path)}")
    size = len(path.encode("utf-8"))
    if size > MAX_RELATIVE_PATH_BYTES:
        raise InvalidInputError(
            f"artifact path is {size} UTF-8 bytes, over {MAX_RELATIVE_PATH_BYTES}: "
            f"{short_repr(path)}"
        )
    for segment in path.split("/"):
        if len(segment.encode("utf-8")) > MAX_NAME_BYTES:
            raise InvalidInputError(
                f"artifact path has a segment over {MAX_NAME_BYTES} UTF-8 bytes: {short_repr(path)}"
            )
    return path
