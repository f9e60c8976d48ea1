"""The catalog: which checkpoints are committed, and which one is the latest.

Invariants:

* a checkpoint is committed exactly when its ``manifest.json`` exists and is not a
  tombstone (an empty manifest: GC's claim, see :mod:`cairn.protocol._lease`);
* the order of :func:`latest_candidates` ranks committed checkpoints: first what
  ``_latest`` names, unless a checkpoint committed after it outranks it (its writer
  stopped between its commit and its pointer swap); then every committed checkpoint the
  writer record admits (a fenced writer's late commit never counts, see
  :mod:`cairn.protocol._pointer`), ranked by writer generation, epoch and id;
* two words name checkpoints in that order, with one meaning each in the library and on
  the command line: the *newest* is the first whose manifest reads
  (:func:`newest_id`, ``newest_id``, ``cairn ... newest``); the *latest* is the first
  that loads and verifies, every artifact read (:func:`first_that_loads`:
  ``load_latest``, ``latest_id``, ``cairn ... latest``). They differ only when the
  newest is damaged;
* a *name* (a label some writers record, see :class:`~cairn.CheckpointManifest`) means
  the newest checkpoint that carries it: :func:`named_candidates` tries the admitted
  committed checkpoints with that name newest first, by writer generation, then id (the
  time a save began), not by epoch: a later save under a name replaces the earlier one
  in meaning, whatever epoch it records;
* ranking reads every manifest but decodes only its three ranking fields. A manifest
  whose header decodes but whose whole does not fails when it is loaded, so the order
  tried is exactly that of decoding every manifest in full: a valid manifest's header is
  its content. A manifest a newer cairn wrote (its ``requires`` names a feature this one
  does not know, its checksum verified) is ranked too, by what its header says, or, when
  even that does not decode, above every other: the search stops there;
* the search for the latest never restores older state past a checkpoint it cannot
  read because a newer cairn wrote it: it raises
  :class:`~cairn.errors.NewerFormatError`, unless the caller opts into falling back
  (``skip_newer_format``), and then it says, with a warning, which one it passed over.
  One it cannot read that ranks below the one that loads is never reached.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from cairn.errors import (
    CheckpointNotFoundError,
    CorruptManifestError,
    IntegrityError,
    NewerFormatError,
)
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.format.manifest import (
    MAX_INT64,
    CheckpointManifest,
    dec_hook,
    decode_header,
    decode_root,
)
from cairn.format.signing import SigningKeys
from cairn.observe import _dispatch
from cairn.protocol import _lease, _parts, _pointer
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context, check_id
from cairn.stores import ListDirResult, ObjectInfo

__all__ = [
    "DAMAGE",
    "FirstLook",
    "checkpoint_names",
    "committed",
    "first_that_loads",
    "latest_candidates",
    "list_checkpoints",
    "listed_ids",
    "load_manifest",
    "load_partition_manifest",
    "named_candidates",
    "newest_id",
    "passed_over_newer",
    "read_latest",
]

log = logging.getLogger("cairn")
T = TypeVar("T")

DAMAGE = (CheckpointNotFoundError, IntegrityError)
"""What makes one checkpoint unloadable without saying anything of the others.

A manifest not signed by the reader's keys is a :class:`~cairn.errors.SignatureError`
(an :class:`IntegrityError`): damage, so readers fall back past a forged checkpoint.

A manifest naming a codec nobody knows is a :class:`CorruptManifestError` (damage). Not
damage, so raised: a :class:`~cairn.errors.StoreError` (a store that refuses or fails a
read would refuse the older checkpoints too, and answering None, "no checkpoint", would
be a lie) and a :class:`~cairn.errors.CodecError` (a known codec this environment lacks:
restoring older state silently would hide a missing install).

Nor is a :class:`~cairn.errors.NewerFormatError` (a checkpoint a newer cairn wrote): the
searches for the latest raise it unless their caller opts into passing over it
(:func:`passed_over_newer`).
"""


def passed_over_newer(cid: CheckpointId, exc: NewerFormatError, skip_newer_format: bool) -> None:
    """Let a search for the latest pass over ``cid``, which a newer cairn wrote (``exc``),
    when ``skip_newer_format``: with a warning naming it. Otherwise raise ``exc``: older
    state is never restored in silence past a checkpoint this cairn cannot read."""
    if not skip_newer_format:
        raise exc
    log.warning(
        "passing over checkpoint %s, which this cairn cannot read (%s): loading an older one",
        cid,
        exc,
    )


async def load_manifest(ctx: Context, checkpoint_id: CheckpointId) -> CheckpointManifest:
    """The checked manifest of ``checkpoint_id``, every entry in place (a large one's
    parts read and checked, see :mod:`cairn.protocol._parts`).

    Raises :class:`CheckpointNotFoundError` if it is not committed,
    :class:`CorruptManifestError` if the bytes there are not its valid manifest (or a
    part of it is missing or damaged), and, when the context has signing keys,
    :class:`~cairn.errors.SignatureError` if it is not signed by one of them.
    """
    path, root = await _load_root(ctx, checkpoint_id)
    return await _parts.read_whole(ctx.store, ctx.paths, path, root)


async def load_partition_manifest(
    ctx: Context, checkpoint_id: CheckpointId, operator: str, partition: int
) -> CheckpointManifest:
    """:func:`load_manifest`, reading of a large manifest's parts only the one that holds
    ``partition`` of ``operator``: the manifest returned has that partition's entries
    (and, from a manifest stored whole, every other entry too)."""
    path, root = await _load_root(ctx, checkpoint_id)
    return await _parts.read_partition(ctx.store, ctx.paths, path, root, operator, partition)


async def _load_root(ctx: Context, checkpoint_id: CheckpointId) -> tuple[str, CheckpointManifest]:
    """The path of ``checkpoint_id``'s manifest and its checked root."""
    check_id(checkpoint_id)
    path = ctx.paths.manifest(checkpoint_id)
    try:
        blob = await ctx.store.get(path)
    except CheckpointNotFoundError:
        raise CheckpointNotFoundError(path, f"checkpoint {checkpoint_id}") from None
    if _lease.is_tombstone(blob.data):
        raise CheckpointNotFoundError(path, f"checkpoint {checkpoint_id} (aborted by GC)")
    root = decode_root(path, blob.data, ctx.keys)
    if root.checkpoint_id != checkpoint_id:
        raise CorruptManifestError(
            path, f"it describes checkpoint {root.checkpoint_id}, not {checkpoint_id}"
        )
    return path, root


async def committed(ctx: Context, cid: CheckpointId) -> bool:
    """True when ``cid`` is committed: one HEAD of its manifest, which is not a tombstone."""
    return await _manifest_info(ctx, cid) is not None


async def read_latest(ctx: Context) -> CheckpointId | None:
    """The id ``_latest`` names; None when it is absent (or unreadable, with a warning)."""
    pointer, _, _ = await _pointer.read_pointer(ctx.store, ctx.paths.latest_pointer())
    return pointer.checkpoint_id if pointer is not None else None


async def listed_ids(ctx: Context) -> list[CheckpointId]:
    """Every checkpoint directory under the base, oldest first (committed or not)."""
    return _ids_in(ctx, await ctx.store.list_dir(ctx.paths.base_prefix))


def _ids_in(ctx: Context, listing: ListDirResult) -> list[CheckpointId]:
    """The checkpoint directories of a listing of the base, oldest first."""
    return sorted(
        cid
        for prefix in listing.prefixes
        if (cid := ctx.paths.parse_checkpoint_dir(prefix)) is not None
    )


@dataclass(frozen=True)
class FirstLook:
    """What a call read of the base while it chose the layout, which "latest" reads
    first: ``_writer`` (None: damaged), ``_latest`` (None: missing or damaged) and the
    listing of the base (see :func:`latest_candidates`)."""

    record: _pointer.WriterRecord | None
    pointer: _pointer.LatestPointer | None
    listing: ListDirResult


LISTING_DECIDES_OBJECTS = 20
"""Objects per checkpoint up to which one recursive listing decides what is committed
faster than a HEAD per checkpoint: a listing page names about 1,000 objects for the
price of a few HEADs (about 6 on moto's S3, measured: bench/bench_list.py --s3), and
in memory a listed object costs about a twentieth of a HEAD."""

_MANIFEST_BYTES_PER_OBJECT = 200
"""A manifest grows by at least this many bytes per artifact it lists (an entry takes
about 240): its size bounds the objects of its checkpoint from above."""


_SIZE_PROBES = 3
"""Directories, newest first, whose manifest is read (with the HEAD the answer needs
anyway) to learn the size of a checkpoint: the newest is often a save in progress."""


async def list_checkpoints(ctx: Context) -> list[CheckpointId]:
    """Committed checkpoints, oldest first.

    One delimiter listing names the directories; the newest ones' manifests are read
    with a HEAD each (up to :data:`_SIZE_PROBES`, until one is committed). Then, if that
    manifest's size says checkpoints are small (at most :data:`LISTING_DECIDES_OBJECTS`
    objects each; a manifest that small is read once to count the entries of its parts,
    should it be the root of a large one), one recursive listing decides the rest (a
    directory is committed when its ``manifest.json`` is listed and is not a tombstone);
    otherwise, or when no probe found a manifest, one HEAD per directory does. Both
    answer the same question: the listing costs pages of objects, the HEADs one request
    per checkpoint.
    """
    candidates = await listed_ids(ctx)
    rest = list(candidates)
    probed: list[bool] = []
    objects = None
    while rest and len(probed) < _SIZE_PROBES and objects is None:
        cid = rest.pop()
        info = await _manifest_info(ctx, cid)
        probed.append(info is not None)
        if info is not None:
            objects = await _objects_of(ctx, cid, info)
    if (
        objects is not None
        and len(rest) > ctx.max_concurrent_downloads
        and objects <= LISTING_DECIDES_OBJECTS
    ):
        found = await _committed_by_listing(ctx, rest)
    else:

        def probe(cid: CheckpointId) -> Callable[[], Awaitable[bool]]:
            return lambda: committed(ctx, cid)

        found = await bounded_gather(ctx.max_concurrent_downloads, map(probe, rest))
    return [cid for cid, ok in zip(candidates, found + probed[::-1], strict=True) if ok]


async def _objects_of(ctx: Context, cid: CheckpointId, info: ObjectInfo) -> int:
    """At least how many objects checkpoint ``cid`` has, from the HEAD of its manifest
    (``info``): its size bounds them from above, unless it is a root whose entries are
    in parts (see :mod:`cairn.format.manifest`), so a manifest small enough to decide for the
    listing is read to count its parts' entries."""
    objects = 2 + info.size // _MANIFEST_BYTES_PER_OBJECT
    if objects > LISTING_DECIDES_OBJECTS:
        return objects
    try:
        blob = await ctx.store.get(info.path)
        parts = _header_decoder.decode(blob.data).parts
    except (CheckpointNotFoundError, msgspec.DecodeError, RecursionError):
        return objects  # gone or damaged since the HEAD: the listing tells
    return objects + sum(part.entries for part in parts)


async def _manifest_info(ctx: Context, cid: CheckpointId) -> ObjectInfo | None:
    """The HEAD of ``cid``'s manifest if it is committed (not missing, not a tombstone)."""
    try:
        info = await ctx.store.head(ctx.paths.manifest(cid))
    except CheckpointNotFoundError:
        return None
    return None if _lease.is_tombstone(info) else info


async def _committed_by_listing(ctx: Context, ids: list[CheckpointId]) -> list[bool]:
    """Whether each of ``ids`` is committed, from one recursive listing of the base."""
    manifest_of = ctx.paths.manifest
    wanted = {manifest_of(cid): index for index, cid in enumerate(ids)}
    found = [False] * len(ids)
    for info in await ctx.store.list(ctx.paths.base_prefix):
        index = wanted.get(info.path)
        if index is not None and not _lease.is_tombstone(info):
            found[index] = True
    return found


async def latest_candidates(
    ctx: Context, seen: FirstLook | None = None
) -> AsyncIterator[CheckpointId]:
    """Committed checkpoints in the order "latest" tries them (see the module docstring).

    Lazy: when what ``_latest`` names is current and loads, nothing else is read. The
    records and the listing it starts from are read at once, or taken from ``seen``.
    """
    if seen is None:
        # At once: a checkpoint committed between the reads is either listed (and ranked
        # against what the pointer names) or published and named by it.
        writer, latest, ids = await asyncio.gather(
            _pointer.read_writer(ctx.store, ctx.paths.writer_record()),
            _pointer.read_latest(ctx.store, ctx.paths.latest_pointer(), ctx.hints.latest),
            listed_ids(ctx),  # one listing serves the staleness check and the ranking
            return_exceptions=True,
        )
        # Each ends first, and the same error is raised whichever answers first.
        if isinstance(writer, BaseException):
            raise writer
        if isinstance(latest, BaseException):
            raise latest
        if isinstance(ids, BaseException):
            raise ids
        (record, _, _), pointer, listed = writer, latest, ids
    else:
        record, pointer, listed = seen.record, seen.pointer, _ids_in(ctx, seen.listing)
    named = pointer.checkpoint_id if pointer is not None else None
    tried = None
    if named is not None and await _pointer_is_current(ctx, named, record, listed):
        tried = named
        yield named
    elif named is None:
        log.info("no usable _latest pointer: ranking the committed checkpoints")
    ids = [cid for cid in listed if cid != tried]
    headers = await _read_headers(ctx, ids[::-1])
    ranked = sorted(
        (h for h in headers if h is not None and _admitted(record, h)), key=_rank, reverse=True
    )
    for header in ranked:
        yield header.checkpoint_id


async def newest_id(
    ctx: Context, *, skip_newer_format: bool = False, seen: FirstLook | None = None
) -> CheckpointId | None:
    """The newest checkpoint: the first of :func:`latest_candidates` whose manifest
    loads (artifacts unread); None when nothing is committed.

    One a newer cairn wrote raises :class:`NewerFormatError`, unless
    ``skip_newer_format`` (see :func:`passed_over_newer`).
    """
    async for cid in latest_candidates(ctx, seen):
        try:
            await load_manifest(ctx, cid)
        except DAMAGE as exc:
            log.warning("checkpoint %s has no readable manifest (%s)", cid, exc)
            continue
        except NewerFormatError as exc:
            passed_over_newer(cid, exc, skip_newer_format)
            continue
        return cid
    return None


async def first_that_loads(
    ctx: Context,
    load: Callable[[CheckpointId], Awaitable[T]],
    *,
    skip_newer_format: bool = False,
    seen: FirstLook | None = None,
) -> T | None:
    """``load`` of the first of :func:`latest_candidates` that loads; None when none does.

    A checkpoint that does not load for :data:`DAMAGE` is logged, reported to the
    observers (:func:`cairn.observe._dispatch.fell_back`) and passed over. One a newer
    cairn wrote raises :class:`NewerFormatError`, unless ``skip_newer_format``: then it
    is passed over as damage is, with a warning naming it (:func:`passed_over_newer`).
    Any other failure is raised. ``seen``: see :func:`latest_candidates`.
    """
    async for cid in latest_candidates(ctx, seen):
        try:
            return await load(cid)
        except DAMAGE as exc:
            log.warning("checkpoint %s does not load (%s): trying the next one", cid, exc)
            _dispatch.fell_back(cid, exc)
        except NewerFormatError as exc:
            passed_over_newer(cid, exc, skip_newer_format)
            _dispatch.fell_back(cid, exc)
    return None


async def named_candidates(ctx: Context, name: str) -> AsyncIterator[CheckpointId]:
    """The committed checkpoints named ``name`` that the writer record admits, newest
    first (see the module docstring). Reads every manifest's header once."""
    record, _, _ = await _pointer.read_writer(ctx.store, ctx.paths.writer_record())
    ids = await listed_ids(ctx)
    headers = await _read_headers(ctx, ids[::-1])
    named = [h for h in headers if h is not None and h.name == name and _admitted(record, h)]
    named.sort(key=lambda h: (h.writer_generation or 0, h.checkpoint_id), reverse=True)
    for header in named:
        yield header.checkpoint_id


async def checkpoint_names(ctx: Context) -> list[str]:
    """The names the committed checkpoints carry, each once, sorted."""
    headers = await _read_headers(ctx, await listed_ids(ctx))
    return sorted({h.name for h in headers if h is not None and h.name is not None})


async def _pointer_is_current(
    ctx: Context,
    named: CheckpointId,
    record: _pointer.WriterRecord | None,
    listed: list[CheckpointId],
) -> bool:
    """False when a checkpoint committed after the one ``_latest`` names outranks it."""
    newer = [cid for cid in listed if cid > named]
    if not newer:
        return True
    own, *later = await _read_headers(ctx, [named, *newer])
    if own is None:
        log.warning("_latest names %s, whose manifest does not read: ranking", named)
        return False
    above = [h for h in later if h is not None and _admitted(record, h) and _rank(h) > _rank(own)]
    if above:
        best = max(above, key=_rank)
        log.warning(
            "_latest names %s (epoch %d), but %s (epoch %d) was committed after it and "
            "never published: its writer stopped between its commit and its pointer "
            "swap; ranking the committed checkpoints",
            named,
            own.epoch,
            best.checkpoint_id,
            best.epoch,
        )
        return False
    if any(h is not None for h in later):
        log.info(
            "_latest names %s; the checkpoints committed after it rank lower (an older "
            "epoch saved later, or a fenced writer's): following _latest",
            named,
        )
    return True


class _PartCount(msgspec.Struct, frozen=True):
    """How many entries a part of a large manifest holds (see :mod:`cairn.format.manifest`)."""

    entries: int = 0


class _ManifestHeader(msgspec.Struct, frozen=True):
    """The fields of a manifest that rank it, its name, and its parts' entry counts;
    decoding skips the rest (no checks)."""

    checkpoint_id: CheckpointId
    epoch: int
    writer_generation: int | None = None
    name: str | None = None
    parts: tuple[_PartCount, ...] = ()


_header_decoder = msgspec.json.Decoder(_ManifestHeader, dec_hook=dec_hook)


def _rank(header: _ManifestHeader) -> tuple[int, int, CheckpointId]:
    """The order in which "latest" tries checkpoints, highest first."""
    return (header.writer_generation or 0, header.epoch, header.checkpoint_id)


def _admitted(record: _pointer.WriterRecord | None, header: _ManifestHeader) -> bool:
    """Whether the writer record lets this checkpoint count (a damaged record: all do)."""
    order = (header.epoch, header.checkpoint_id.uuid.int)
    return record is None or record.admits(header.writer_generation or 0, order)


async def _read_headers(ctx: Context, ids: list[CheckpointId]) -> list[_ManifestHeader | None]:
    """The ranking fields of each manifest of ``ids``; None where there is none."""

    def read(cid: CheckpointId) -> Callable[[], Awaitable[_ManifestHeader | None]]:
        async def job() -> _ManifestHeader | None:
            path = ctx.paths.manifest(cid)
            try:
                blob = await ctx.store.get(path)
            except CheckpointNotFoundError:
                return None  # not committed (or deleted since the listing)
            return _decode_header(path, cid, blob.data, ctx.keys)

        return job

    return await bounded_gather(ctx.max_concurrent_downloads, map(read, ids))


def _decode_header(
    path: str, cid: CheckpointId, data: Buffer, keys: SigningKeys | None
) -> _ManifestHeader | None:
    """The ranking fields of the manifest at ``path``; None (with a warning) if unreadable.

    A header that does not decode may be a newer cairn's (see :func:`_newer_header`).
    """
    if _lease.is_tombstone(data):
        return None  # a tombstone: GC claimed this id
    try:
        header = _header_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        newer = _newer_header(path, cid, data, keys)
        if newer is None:
            log.warning("skipping checkpoint %s: corrupt manifest at %r: %s", cid, path, exc)
        return newer
    if header.checkpoint_id != cid:
        log.warning("skipping checkpoint %s: %r describes %s", cid, path, header.checkpoint_id)
        return None
    return header


class _LenientHeader(msgspec.Struct, frozen=True):
    """The ranking fields of a newer cairn's manifest, read as whatever they hold."""

    epoch: object = None
    writer_generation: object = None
    name: object = None


_lenient_decoder = msgspec.json.Decoder(_LenientHeader)


def _newer_header(
    path: str, cid: CheckpointId, data: Buffer, keys: SigningKeys | None
) -> _ManifestHeader | None:
    """The ranking fields of ``cid``'s manifest at ``path``, whose header does not decode,
    when a newer cairn wrote it (its checksum and, with ``keys``, its signature checked,
    see :func:`cairn.format.manifest.decode_header`); None when it is damage.

    Each field is taken where it holds what this cairn would write; when the epoch or
    the generation does not, the checkpoint ranks above every other, so that the search
    for the latest stops at it rather than restore older state past it.
    """
    try:
        decode_header(path, data, keys)
    except NewerFormatError as exc:
        if exc.checkpoint_id != str(cid):
            return None
    except IntegrityError:
        return None
    else:
        return None  # its header decodes strictly, so it is damage elsewhere
    try:
        seen = _lenient_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    name = seen.name if isinstance(seen.name, str) else None
    epoch, generation = seen.epoch, seen.writer_generation
    if isinstance(epoch, int) and _is_int64(epoch):
        if generation is None:
            return _ManifestHeader(cid, epoch, None, name)
        if isinstance(generation, int) and _is_int64(generation):
            return _ManifestHeader(cid, epoch, generation, name)
    log.warning(
        "checkpoint %s was written by a newer cairn whose header this one cannot rank: "
        "ranking it above every other",
        cid,
    )
    return _ManifestHeader(cid, MAX_INT64, MAX_INT64, name)


def _is_int64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT64
