"""Where every object of a checkpoint store lives, and the rules its names follow. Pure: no I/O.

Every object's path, the attempt tokens that make names unique to one save attempt, and
the names cairn writes (:func:`is_cairn_name`) are specified in docs/format.md, section
"Layout".

Invariants:

* every artifact of a checkpoint is under ``checkpoint_dir(id)`` (which ends in ``/``), so
  listing that prefix reaches that checkpoint's objects and no other checkpoint's; what
  else it may hold is not cairn's (:func:`is_cairn_name`) and is never deleted;
* operator and source names are validated before they become path segments, so no name
  can climb out of its checkpoint or collide with another object's path;
* an object name that carries an attempt token (:func:`new_attempt`) is written by one
  save attempt only, so no write through cairn replaces an object that another
  attempt's manifest names; a manifest part is named by the SHA-256 of its bytes, so
  writing it again writes the same bytes;
* paths recorded in manifests are relative to the checkpoint directory, so a checkpoint
  copied to another prefix or store still resolves; :func:`validate_relative_path`
  rejects any relative path that is absolute or climbs out;
* every name that validates can be stored in a local directory and restored by
  ``cairn restore``: each path component stays within the 255-byte limit of common file
  systems (ext4, XFS, APFS, NTFS), including the temporary names their writers use
  (see :data:`MAX_SOURCE_NAME_BYTES`).
"""

from __future__ import annotations

import functools
import re
import secrets

from cairn.errors import InvalidInputError, InvalidNameError
from cairn.format._validate import is_int
from cairn.format.ids import CheckpointId

__all__ = [
    "LEGACY_BASE_PREFIX",
    "MAX_CHECKPOINT_NAME_BYTES",
    "MAX_NAME_BYTES",
    "MAX_PARTITION",
    "MAX_RELATIVE_PATH_BYTES",
    "MAX_SOURCE_NAME_BYTES",
    "CheckpointPaths",
    "is_attempt_artifact",
    "is_cairn_name",
    "is_intent",
    "new_attempt",
    "short_repr",
    "validate_checkpoint_name",
    "validate_name",
    "validate_partition",
    "validate_relative_path",
]

MAX_NAME_BYTES = 255
"""The longest operator name, in UTF-8 bytes: it is a directory name (``operators/{op}/``),
and 255 bytes is the file-name limit of ext4, XFS, APFS and NTFS."""

_TEMP_NAME_ROOM = 14
"""Bytes a writer of a file may add to its name for a temporary twin: ``cairn restore``
writes ``.{name}.XXXXXXXX.tmp`` (14 more) and obstore's local store ``{name}#{n}``."""

_SOURCE_SUFFIX = ".json"

MAX_SOURCE_NAME_BYTES = MAX_NAME_BYTES - len(_SOURCE_SUFFIX) - _TEMP_NAME_ROOM
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

LEGACY_BASE_PREFIX = "checkpoints/"
"""The default base prefix of cairn 0.1; a checkpointer given no ``paths`` still finds
checkpoints there (see :func:`cairn.protocol.discover.default_paths`)."""

MANIFEST_NAME = "manifest.json"
LATEST_NAME = "_latest"
WRITER_NAME = "_writer"
CLOCK_NAME = "_clock"
INTENT_NAME = "intent.json"

_ATTEMPT_HEX = 12
_ATTEMPT = re.compile(rf"[0-9a-f]{{{_ATTEMPT_HEX}}}")
# operators/{operator}/partition-{p}.{attempt}.{snap|delta}, as relative_artifact writes
# it, or .file-{n}, one file of a directory partition, as relative_file writes it.
_ATTEMPT_ARTIFACT = re.compile(
    rf"operators/[^/]+/partition-(?:0|[1-9][0-9]*)\.[0-9a-f]{{{_ATTEMPT_HEX}}}"
    r"\.(?:snap|delta|file-(?:0|[1-9][0-9]*))"
    # packs/pack-{n}.{attempt}.pack, as relative_pack writes it
    rf"|packs/pack-(?:0|[1-9][0-9]*)\.[0-9a-f]{{{_ATTEMPT_HEX}}}\.pack"
)
_PACK = re.compile(rf"packs/pack-(?:0|[1-9][0-9]*)\.[0-9a-f]{{{_ATTEMPT_HEX}}}\.pack")
_MANIFEST_PART = re.compile(r"parts/part-[0-9a-f]{64}\.json")
# intent.{attempt}.json, as intent() names a save's; intent.json, the intent shared by the
# processes that upload parts of one save.
_INTENT = re.compile(rf"intent(?:\.[0-9a-f]{{{_ATTEMPT_HEX}}})?\.json")
# operators/{operator}/partition-{p}.{snap|delta}: the reference's attempt-less names
# (save_snapshot, save_delta, and stored checkpoints whose names carry no attempt).
_PLAIN_ARTIFACT = re.compile(
    r"operators/(?P<operator>[^/]+)/partition-(?P<partition>0|[1-9][0-9]*)\.(?:snap|delta)"
)
# operators/{operator}/partition-{p}..., any name above with its operator and partition.
_OPERATOR_PARTITION = re.compile(r"operators/(?P<operator>[^/]+)/partition-(?P<partition>[0-9]+)\.")
# offsets/{source}.json: copies of source offsets that checkpoints of cairn 0.1 hold.
_SOURCE_OFFSET = re.compile(rf"offsets/(?P<source>[^/]+){re.escape(_SOURCE_SUFFIX)}")


def new_attempt() -> str:
    """A fresh attempt token: 12 random lowercase hex digits (48 bits).

    Each save attempt draws its own, and every artifact it uploads carries it, so two
    writers of the same checkpoint id (a job re-run beside a zombie of the old run) write
    disjoint objects.
    """
    return secrets.token_hex(_ATTEMPT_HEX // 2)


def is_attempt_artifact(relative_path: str) -> bool:
    """True when ``relative_path`` is an artifact name that carries an attempt token."""
    return _ATTEMPT_ARTIFACT.fullmatch(relative_path) is not None


def is_intent(relative_path: str) -> bool:
    """True when ``relative_path``, relative to a checkpoint directory, names an intent:
    ``intent.{attempt}.json`` (:meth:`CheckpointPaths.intent`), or ``intent.json`` as
    cairn wrote it before intents carried their save's attempt."""
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
    if CheckpointPaths.is_manifest_part(relative_path) or CheckpointPaths.is_pack(relative_path):
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


def _normalize_base(base_prefix: str) -> str:
    if not isinstance(base_prefix, str):
        raise InvalidInputError(f"base_prefix must be a string, got {base_prefix!r}")
    if base_prefix == "":
        return ""
    base = base_prefix if base_prefix.endswith("/") else base_prefix + "/"
    if base.startswith("/"):
        raise InvalidInputError(f"base_prefix must be relative to the store: {base_prefix!r}")
    for segment in base[:-1].split("/"):
        if segment in ("", ".", ".."):
            raise InvalidInputError(
                f"base_prefix has an empty, '.' or '..' segment: {base_prefix!r}"
            )
    return base


@functools.lru_cache(maxsize=65536)
def _id_of_directory(name: str) -> CheckpointId | None:
    # Cached: a store listing names each checkpoint directory once per object in it.
    try:
        return CheckpointId.parse(name)
    except InvalidInputError:
        return None


class CheckpointPaths:
    """The object paths of a checkpoint store rooted at ``base_prefix``.

    A missing trailing ``/`` on the base is added; ``""``, the default, means the store
    root: the store (a directory, a bucket path) is where the checkpoints are, as with
    torch DCP and orbax. (cairn 0.1 defaulted to ``"checkpoints/"``,
    :data:`LEGACY_BASE_PREFIX`.)

    Args:
        base_prefix: The prefix under which the checkpoints are, relative to the store
            root; ``""`` (the default) is the root itself.

    Raises:
        InvalidInputError: ``base_prefix`` is not a string, is absolute, or holds an
            empty, ``.`` or ``..`` segment.
    """

    __slots__ = ("_base",)

    def __init__(self, base_prefix: str = "") -> None:
        self._base = _normalize_base(base_prefix)

    @property
    def base_prefix(self) -> str:
        """The normalized base prefix: ``""`` or a path ending in ``/``."""
        return self._base

    def __repr__(self) -> str:
        return f"CheckpointPaths({self._base!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CheckpointPaths) and other._base == self._base

    def __hash__(self) -> int:
        return hash(self._base)

    def is_record(self, path: str) -> bool:
        """True when ``path`` is one of the store-wide records under the base
        (``_latest``, ``_writer``).

        Args:
            path: A store path.

        Returns:
            Whether it is one of them.
        """
        return path in (self.latest_pointer(), self.writer_record())

    def latest_pointer(self) -> str:
        """The ``_latest`` pointer object.

        Returns:
            Its store path.
        """
        return f"{self._base}{LATEST_NAME}"

    def writer_record(self) -> str:
        """The fencing record holding the current writer generation.

        Returns:
            Its store path.
        """
        return f"{self._base}{WRITER_NAME}"

    def checkpoint_dir(self, checkpoint_id: CheckpointId) -> str:
        """The directory (prefix, ending in ``/``) that holds everything of one checkpoint.

        Args:
            checkpoint_id: The checkpoint.

        Returns:
            The prefix.
        """
        return f"{self._base}{checkpoint_id}/"

    def manifest(self, checkpoint_id: CheckpointId) -> str:
        """The manifest object: the commit marker of ``checkpoint_id``.

        Args:
            checkpoint_id: The checkpoint.

        Returns:
            Its store path.
        """
        return f"{self.checkpoint_dir(checkpoint_id)}{MANIFEST_NAME}"

    def clock(self) -> str:
        """The object GC writes to read the store's own time (its ``last_modified``).

        Returns:
            Its store path.
        """
        return f"{self._base}{CLOCK_NAME}"

    def intent(self, checkpoint_id: CheckpointId, attempt: str | None = None) -> str:
        """The intent a save of ``checkpoint_id`` writes first and renews (its lease),
        naming the parent it builds on, for GC: ``intent.{attempt}.json``, one per save
        that commits, so that two writers of one id never share one; without
        ``attempt``, ``intent.json``, the one the processes that upload parts of one save
        share (and every save's, before intents carried attempts).

        Args:
            checkpoint_id: The checkpoint being saved.
            attempt: The save attempt's token (:func:`new_attempt`), or None.

        Returns:
            The intent's store path.

        Raises:
            InvalidInputError: ``attempt`` is not an attempt token.
        """
        if attempt is None:
            return f"{self.checkpoint_dir(checkpoint_id)}{INTENT_NAME}"
        if _ATTEMPT.fullmatch(attempt) is None:
            raise InvalidInputError(f"not an attempt token: {attempt!r}")
        return f"{self.checkpoint_dir(checkpoint_id)}intent.{attempt}.json"

    def is_intent_path(self, path: str) -> bool:
        """Whether store ``path`` is an intent in a checkpoint directory.

        Args:
            path: A store path.

        Returns:
            True for an intent.
        """
        cid = self.checkpoint_of(path)
        return cid is not None and is_intent(path[len(self.checkpoint_dir(cid)) :])

    def snapshot(self, checkpoint_id: CheckpointId, operator: str, partition: int) -> str:
        """The full-state artifact of one operator partition (the reference's name).

        Args:
            checkpoint_id: The checkpoint.
            operator: The operator's name.
            partition: The partition number.

        Returns:
            Its store path.

        Raises:
            InvalidNameError: ``operator`` or ``partition`` is not allowed.
        """
        return self.resolve(checkpoint_id, self.relative_artifact(operator, partition, False))

    def delta(self, checkpoint_id: CheckpointId, operator: str, partition: int) -> str:
        """The incremental-delta artifact of one operator partition (the reference's name).

        Args:
            checkpoint_id: The checkpoint.
            operator: The operator's name.
            partition: The partition number.

        Returns:
            Its store path.

        Raises:
            InvalidNameError: ``operator`` or ``partition`` is not allowed.
        """
        return self.resolve(checkpoint_id, self.relative_artifact(operator, partition, True))

    def source_offset(self, checkpoint_id: CheckpointId, source: str) -> str:
        """The offsets object of one source.

        Args:
            checkpoint_id: The checkpoint.
            source: The source's name.

        Returns:
            Its store path.

        Raises:
            InvalidNameError: ``source`` is not allowed.
        """
        return self.resolve(checkpoint_id, self.relative_source_offset(source))

    @staticmethod
    def relative_artifact(
        operator: str, partition: int, is_delta: bool, attempt: str | None = None
    ) -> str:
        """An artifact's path relative to its checkpoint directory (as stored in manifests).

        With ``attempt`` (see :func:`new_attempt`) the name carries that save attempt's
        token: ``partition-{p}.{attempt}.snap``; without, the reference's name.

        Args:
            operator: The operator's name.
            partition: The partition number.
            is_delta: True for a delta (``.delta``), False for a snapshot (``.snap``).
            attempt: The save attempt's token, or None.

        Returns:
            The relative path.

        Raises:
            InvalidNameError: ``operator`` or ``partition`` is not allowed.
            InvalidInputError: ``attempt`` is not an attempt token.
        """
        validate_name("operator", operator)
        validate_partition(partition)
        suffix = "delta" if is_delta else "snap"
        if attempt is None:
            return f"operators/{operator}/partition-{partition}.{suffix}"
        if not isinstance(attempt, str) or not _ATTEMPT.fullmatch(attempt):
            raise InvalidInputError(
                f"not an attempt token ({_ATTEMPT_HEX} hex digits): {attempt!r}"
            )
        return f"operators/{operator}/partition-{partition}.{attempt}.{suffix}"

    @staticmethod
    def relative_file(operator: str, partition: int, attempt: str, index: int) -> str:
        """The object of file ``index`` of a directory partition saved by ``attempt``,
        relative to its checkpoint directory: ``partition-{p}.{attempt}.file-{index}``.

        Args:
            operator: The operator's name.
            partition: The partition number.
            attempt: The save attempt's token.
            index: The file's index in the partition.

        Returns:
            The relative path.

        Raises:
            InvalidNameError: ``operator`` or ``partition`` is not allowed.
            InvalidInputError: ``attempt`` is not an attempt token.
        """
        stem = CheckpointPaths.relative_artifact(operator, partition, False, attempt)
        return f"{stem.removesuffix('.snap')}.file-{index}"

    @staticmethod
    def relative_pack(index: int, attempt: str) -> str:
        """Pack ``index`` (0, 1, ...) of the save attempt ``attempt``, relative to its
        checkpoint directory: ``packs/pack-{index}.{attempt}.pack``.

        Only attempt-named: no other writer, of this id or any other, can produce it.

        Args:
            index: The pack's index, an int >= 0.
            attempt: The save attempt's token.

        Returns:
            The relative path.

        Raises:
            InvalidInputError: ``index`` is negative or not an int, or ``attempt`` is not
                an attempt token.
        """
        if not is_int(index) or index < 0:
            raise InvalidInputError(f"a pack index must be an int >= 0, got {short_repr(index)}")
        if not isinstance(attempt, str) or not _ATTEMPT.fullmatch(attempt):
            raise InvalidInputError(
                f"not an attempt token ({_ATTEMPT_HEX} hex digits): {attempt!r}"
            )
        return f"packs/pack-{index}.{attempt}.pack"

    @staticmethod
    def is_pack(path: object) -> bool:
        """Whether relative ``path`` names a pack (:meth:`relative_pack`).

        Args:
            path: A path relative to a checkpoint directory (any value).

        Returns:
            True for a pack.
        """
        return isinstance(path, str) and _PACK.fullmatch(path) is not None

    @staticmethod
    def relative_manifest_part(sha256: str) -> str:
        """The manifest part whose bytes hash to ``sha256``, relative to its checkpoint
        directory: ``parts/part-{sha256}.json``.

        Args:
            sha256: The part's SHA-256 digest, 64 lowercase hex digits.

        Returns:
            The relative path.

        Raises:
            InvalidInputError: ``sha256`` is not a SHA-256 hex digest.
        """
        path = f"parts/part-{sha256}.json"
        if not isinstance(sha256, str) or _MANIFEST_PART.fullmatch(path) is None:
            raise InvalidInputError(f"not a SHA-256 hex digest: {short_repr(sha256)}")
        return path

    @staticmethod
    def is_manifest_part(path: object) -> bool:
        """Whether relative ``path`` names a manifest part (:meth:`relative_manifest_part`).

        Args:
            path: A path relative to a checkpoint directory (any value).

        Returns:
            True for a manifest part.
        """
        return isinstance(path, str) and _MANIFEST_PART.fullmatch(path) is not None

    @staticmethod
    def is_file_of(path: str, operator: str, partition: int) -> bool:
        """Whether relative ``path`` names a file object of that directory partition.

        Args:
            path: A path relative to a checkpoint directory.
            operator: The operator's name.
            partition: The partition number.

        Returns:
            True for one of its file objects.
        """
        prefix = f"operators/{operator}/partition-{partition}."
        return path.startswith(prefix) and is_attempt_artifact(path) and ".file-" in path

    @staticmethod
    def is_artifact_of(path: str, operator: str, partition: int, is_delta: bool) -> bool:
        """True when relative ``path`` names that partition's artifact, with or without an
        attempt token (what a manifest entry may record).

        Args:
            path: A path relative to a checkpoint directory.
            operator: The operator's name.
            partition: The partition number.
            is_delta: True to match the delta, False the snapshot.

        Returns:
            True for that artifact.

        Raises:
            InvalidNameError: ``operator`` or ``partition`` is not allowed.
        """
        plain = CheckpointPaths.relative_artifact(operator, partition, is_delta)
        if path == plain:
            return True
        stem, _, suffix = plain.rpartition(".")
        if not (path.startswith(stem + ".") and path.endswith("." + suffix)):
            return False
        token = path[len(stem) + 1 : -len(suffix) - 1]
        return _ATTEMPT.fullmatch(token) is not None

    @staticmethod
    def relative_source_offset(source: str) -> str:
        """A source-offset object's path relative to its checkpoint directory.

        Args:
            source: The source's name.

        Returns:
            The relative path.

        Raises:
            InvalidNameError: ``source`` is not allowed.
        """
        validate_name("source", source)
        return f"offsets/{source}{_SOURCE_SUFFIX}"

    def resolve(self, checkpoint_id: CheckpointId, relative_path: str) -> str:
        """The full store path of ``relative_path`` inside ``checkpoint_id``'s directory.

        Args:
            checkpoint_id: The checkpoint.
            relative_path: A path relative to its directory.

        Returns:
            The store path.

        Raises:
            InvalidInputError: ``relative_path`` is empty, absolute, or leaves the directory.
        """
        return self.checkpoint_dir(checkpoint_id) + validate_relative_path(relative_path)

    def parse_checkpoint_dir(self, common_prefix: str) -> CheckpointId | None:
        """The id named by a listed directory under the base.

        Args:
            common_prefix: A prefix a listing of the base returned.

        Returns:
            The checkpoint id, or None if it names none.
        """
        name = common_prefix[len(self._base) :] if common_prefix.startswith(self._base) else ""
        return _id_of_directory(name.rstrip("/"))

    def checkpoint_of(self, path: str) -> CheckpointId | None:
        """The checkpoint whose directory holds object ``path``.

        Args:
            path: A store path.

        Returns:
            The checkpoint id, or None when ``path`` is in no checkpoint directory.
        """
        if not path.startswith(self._base):
            return None
        head, slash, _ = path[len(self._base) :].partition("/")
        return _id_of_directory(head) if slash else None
