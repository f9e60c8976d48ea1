"""Where every object of a checkpoint store lives: the layout of one base prefix. Pure: no I/O.

Every object's path and the attempt tokens that make names unique to one save attempt are
specified in docs/format.md, section "Layout"; the rules names follow, and which names
are cairn's (:func:`is_cairn_name`), are kept in :mod:`cairn.format._names` and
re-exported here.

Invariants:

* every artifact of a checkpoint is under ``checkpoint_dir(id)`` (which ends in ``/``), so
  listing that prefix reaches that checkpoint's objects and no other checkpoint's; what
  else it may hold is not cairn's (:func:`is_cairn_name`) and is never deleted;
* every path is built from validated names (operator, source, partition, relative path),
  so none climbs out of its checkpoint or collides with another object's path;
* an object name that carries an attempt token (:func:`new_attempt`) is written by one
  save attempt only, so no write through cairn replaces an object that another
  attempt's manifest names; a manifest part is named by the SHA-256 of its bytes, so
  writing it again writes the same bytes;
* paths recorded in manifests are relative to the checkpoint directory, so a checkpoint
  copied to another prefix or store still resolves.
"""

from __future__ import annotations

import functools

from cairn.errors import InvalidInputError

# What names may be, and which are cairn's, is kept in _names: re-exported here, the
# rules first, then the names of a checkpoint directory.
# isort: off
from cairn.format._names import (
    MAX_CHECKPOINT_NAME_BYTES,
    MAX_NAME_BYTES,
    MAX_PARTITION,
    MAX_RELATIVE_PATH_BYTES,
    MAX_SOURCE_NAME_BYTES,
    short_repr,
    validate_checkpoint_name,
    validate_name,
    validate_partition,
    validate_relative_path,
    ATTEMPT_HEX,
    INTENT_NAME,
    MANIFEST_NAME,
    SOURCE_SUFFIX,
    new_attempt,
    is_attempt,
    is_attempt_artifact,
    is_cairn_name,
    is_intent,
    is_manifest_part,
    is_pack,
)

# isort: on
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

LEGACY_BASE_PREFIX = "checkpoints/"
"""The default base prefix of cairn 0.1; a checkpointer given no ``paths`` still finds
checkpoints there (see :func:`cairn.protocol.discover.default_paths`)."""

LATEST_NAME = "_latest"
WRITER_NAME = "_writer"
CLOCK_NAME = "_clock"


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


def _check_attempt(attempt: object) -> None:
    """Raise InvalidInputError naming ``attempt`` unless it is an attempt token."""
    if not is_attempt(attempt):
        raise InvalidInputError(f"not an attempt token ({ATTEMPT_HEX} hex digits): {attempt!r}")


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
        """The fencing record: the generation of the newest writer, which fences off
        every older one (:class:`~cairn.errors.FencedError`).

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
        if not is_attempt(attempt):
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
        """The full-state artifact of one operator partition, under the reference's
        name: ``operators/{operator}/partition-{partition}.snap`` in the checkpoint's
        directory, without an attempt token (:meth:`relative_artifact`).

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
            Its store path: the :meth:`snapshot`'s, with ``.delta`` in place of
            ``.snap``.

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
        _check_attempt(attempt)
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
        _check_attempt(attempt)
        return f"packs/pack-{index}.{attempt}.pack"

    @staticmethod
    def is_pack(path: object) -> bool:
        """Whether relative ``path`` names a pack (:meth:`relative_pack`).

        Args:
            path: A path relative to a checkpoint directory (any value).

        Returns:
            True for a pack.
        """
        return is_pack(path)

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
        if not isinstance(sha256, str) or not is_manifest_part(path):
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
        return is_manifest_part(path)

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
        return is_attempt(token)

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
        return f"offsets/{source}{SOURCE_SUFFIX}"

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
