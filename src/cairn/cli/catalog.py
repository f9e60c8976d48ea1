"""Finding checkpoints: resolving ``ID|latest`` and reading many manifests at once.

An ``ID`` is a whole checkpoint id or a short one, the unique start of one (at least 8
characters, as the tables print them): the library resolves both
(:func:`cairn.protocol.discover.resolve_checkpoint_id`), so the command line takes what the
library takes.

``latest`` and ``newest`` mean what they mean in the library:

* ``latest`` (:meth:`ObjectStoreCheckpointer.latest_id`) is the checkpoint
  ``load_latest`` returns: the newest committed one that loads and verifies, found by
  reading and verifying its artifacts (passing over newer ones that are damaged);
* ``newest`` (:meth:`ObjectStoreCheckpointer.newest_id`) is the newest committed one
  whose manifest reads, its artifacts unread: the one ``cairn verify newest`` checks.

Both rank checkpoints as ``load_latest`` does: the one the ``_latest`` pointer names,
unless a checkpoint committed after it outranks it (its writer died between its commit
and its pointer swap); a fenced writer's late commit never counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from cairn import (
    CheckpointId,
    CheckpointManifest,
    CheckpointNotFoundError,
    NewerFormatError,
    ObjectStoreCheckpointer,
)
from cairn.cli.errors import CliError, ExitCode, needs_newer_text
from cairn.protocol.discover import MIN_SHORT_ID, is_short_id, resolve_checkpoint_id

__all__ = [
    "LATEST",
    "MARK_VERIFIES_OBJECTS_UP_TO",
    "MARK_VERIFIES_UP_TO",
    "NEWEST",
    "REF_WORDS",
    "Latest",
    "Listed",
    "check_refs",
    "latest_mark",
    "parse_id",
    "parse_ref",
    "read_manifests",
    "resolve",
    "resolve_many",
]

LATEST = "latest"
NEWEST = "newest"
REF_WORDS = (LATEST, NEWEST)


@dataclass(frozen=True)
class Listed:
    """A committed checkpoint with its manifest, or why the manifest did not load:
    ``error`` in words, and ``newer`` when it is not damage but a checkpoint a newer
    cairn wrote (:func:`cairn.cli.errors.needs_newer_text`)."""

    checkpoint_id: CheckpointId
    manifest: CheckpointManifest | None
    error: str | None = None
    newer: bool = False

    @property
    def status(self) -> str:
        """``ok``, ``damaged`` (its manifest does not read) or ``newer``."""
        if self.manifest is not None:
            return "ok"
        return "newer" if self.newer else "damaged"


def parse_id(text: str) -> CheckpointId:
    """The checkpoint id ``text`` names; a usage error (exit 2) if it is not one."""
    if not CheckpointId.is_valid(text):
        raise CliError(
            f"not a checkpoint id: {text!r} (expected a 36-character UUIDv7, 'latest' or 'newest')",
            ExitCode.USAGE,
        )
    return CheckpointId.parse(text)


def parse_ref(text: str) -> str:
    """``text`` if it is a checkpoint id, a short one, ``latest`` or ``newest``; a usage
    error (exit 2) otherwise.

    No I/O: commands call it before they open the store.
    """
    if text.lower() in REF_WORDS or is_short_id(text) or CheckpointId.is_valid(text):
        return text
    raise CliError(
        f"not a checkpoint id: {text!r} (expected a checkpoint id, at least its first "
        f"{MIN_SHORT_ID} characters, 'latest' or 'newest')",
        ExitCode.USAGE,
    )


def check_refs(refs: list[str], every: bool) -> list[str]:
    """The ``ID|latest`` arguments of a command that also takes ``--all``, checked (no I/O)."""
    if every and refs:
        raise CliError("give checkpoint ids or --all, not both", ExitCode.USAGE)
    if not every and not refs:
        raise CliError(
            "name a checkpoint (an id, 'latest' or 'newest'), or pass --all", ExitCode.USAGE
        )
    return [parse_ref(ref) for ref in refs]


async def resolve(
    ckpt: ObjectStoreCheckpointer, ref: str, where: str, *, skip_newer_format: bool = False
) -> CheckpointId:
    """The committed checkpoint ``ref`` (an id, ``latest`` or ``newest``) names in
    ``ckpt``'s store.

    Raises :class:`CliError` (exit 2) for a malformed id, an empty store, or an id that
    is not committed there, and :class:`cairn.AmbiguousCheckpointIdError` (exit 2) for a
    short id that several checkpoints start with. ``latest`` is a :class:`CliError`
    (exit 1) when committed checkpoints have readable manifests and none of them
    loads. ``latest`` and ``newest`` raise :class:`cairn.NewerFormatError` (exit 5)
    when they reach a checkpoint that needs a newer cairn, unless ``skip_newer_format``
    (see :meth:`ObjectStoreCheckpointer.load_latest`).
    """
    word = ref.lower()
    if word in REF_WORDS:
        if word == NEWEST:
            found = await ckpt.newest_id(skip_newer_format=skip_newer_format)
        else:
            found = await ckpt.latest_id(skip_newer_format=skip_newer_format)
        if found is not None:
            return found
        signed = " signed by a key of CAIRN_SIGNING_KEY" if ckpt.signing_keys else ""
        # Checkpoints whose manifests read, none of which loads: damage, not an empty store.
        if word == LATEST and await ckpt.newest_id(skip_newer_format=skip_newer_format):
            committed = len(await ckpt.list_checkpoints())
            raise CliError(
                f"no checkpoint{signed} in {where} loads: all {committed} committed "
                "checkpoint(s) are damaged (cairn verify --all names the damage)",
                ExitCode.INTEGRITY,
            )
        raise CliError(f"no checkpoints{signed} in {where}", ExitCode.USAGE)
    parse_ref(ref)
    try:
        cid = await resolve_checkpoint_id(ref, ckpt.list_checkpoint_dirs, ckpt.exists)
    except CheckpointNotFoundError:
        raise CliError(f"no checkpoint {ref} in {where}", ExitCode.USAGE) from None
    if not await ckpt.exists(cid):
        raise CliError(f"no checkpoint {cid} in {where}", ExitCode.USAGE)
    return cid


async def resolve_many(
    ckpt: ObjectStoreCheckpointer, refs: list[str], every: bool, where: str
) -> list[CheckpointId]:
    """The ids of ``refs``, or every committed checkpoint with ``every`` (oldest first)."""
    if every and refs:
        raise CliError("give checkpoint ids or --all, not both", ExitCode.USAGE)
    if every:
        return await ckpt.list_checkpoints()
    if not refs:
        raise CliError(
            "name a checkpoint (an id, 'latest' or 'newest'), or pass --all", ExitCode.USAGE
        )
    found: list[CheckpointId] = []
    for ref in refs:
        cid = await resolve(ckpt, ref, where)
        if cid not in found:
            found.append(cid)
    return found


async def read_manifests(ckpt: ObjectStoreCheckpointer, ids: list[CheckpointId]) -> list[Listed]:
    """The manifest of each of ``ids`` (:meth:`ObjectStoreCheckpointer.load_manifests`), in
    the order given; one that is corrupt, or was deleted since it was listed, is reported in
    :attr:`Listed.error` instead of failing the whole listing."""
    read = await ckpt.load_manifests(ids)
    return [_listed(cid, got) for cid, got in zip(ids, read, strict=True)]


def _listed(cid: CheckpointId, got: CheckpointManifest | Exception) -> Listed:
    if isinstance(got, NewerFormatError):
        return Listed(cid, None, needs_newer_text(got), newer=True)
    if isinstance(got, Exception):
        return Listed(cid, None, str(got))
    return Listed(cid, got)


MARK_VERIFIES_UP_TO = 64 * 1024 * 1024
"""The most bytes of artifacts ``list`` and ``show`` read to find the latest checkpoint:
a newest checkpoint larger than this is marked newest, unverified, rather than read
whole by a command meant to be quick (``cairn verify latest`` finds it, reading all)."""

MARK_VERIFIES_OBJECTS_UP_TO = 1024
"""The most objects ``list`` and ``show`` read to find the latest checkpoint (a pack
counts once): a request each, so a newest of more (many small unpacked partitions,
directory files) is marked newest, unverified, as one of too many bytes is."""


@dataclass(frozen=True)
class Latest:
    """What a listing marks: ``latest``, the checkpoint ``load_latest`` returns, and
    ``newest``, the newest committed checkpoint, which differs from it only when it
    does not load (damaged artifacts); either is None when there is none. A checkpoint
    that needs a newer cairn is both (this cairn cannot load it, and it is not damage).
    ``verified`` is False when the newest was too large to read here
    (:data:`MARK_VERIFIES_UP_TO`, :data:`MARK_VERIFIES_OBJECTS_UP_TO`): ``latest`` is
    then None, unknown, not absent."""

    latest: CheckpointId | None
    newest: CheckpointId | None
    verified: bool = True

    @property
    def newest_fails(self) -> bool:
        """True when the newest checkpoint is not the latest: it does not load."""
        return self.verified and self.newest is not None and self.newest != self.latest


async def latest_mark(ckpt: ObjectStoreCheckpointer) -> Latest:
    """The latest and the newest checkpoint, as a listing marks them: the latest only
    when the newest's artifacts are at most :data:`MARK_VERIFIES_UP_TO` bytes in at most
    :data:`MARK_VERIFIES_OBJECTS_UP_TO` objects."""
    try:
        newest = await ckpt.newest_id()
    except NewerFormatError as exc:
        found = _newer_id(exc)
        return Latest(found, found)
    if newest is None:
        return Latest(None, None)
    manifest = await ckpt.load_manifest(newest)
    if (
        manifest.total_size_bytes > MARK_VERIFIES_UP_TO
        or len(manifest.stored_objects()) > MARK_VERIFIES_OBJECTS_UP_TO
    ):
        return Latest(None, newest, verified=False)
    try:
        return Latest(await ckpt.latest_id(), newest)
    except NewerFormatError as exc:
        return Latest(_newer_id(exc), newest)


def _newer_id(exc: NewerFormatError) -> CheckpointId | None:
    """The checkpoint a newer cairn wrote that ``exc`` names, if it names one."""
    return None if exc.checkpoint_id is None else CheckpointId.parse(exc.checkpoint_id)
