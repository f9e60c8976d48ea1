"""The catalog: which checkpoints are committed, and which one is the latest.

Invariants:

* a checkpoint is committed exactly when its ``manifest.json`` exists and is not a
  tombstone (an empty manifest: GC's claim, see :mod:`cairn._lease`);
* "latest" has one meaning, used by ``load_latest``, ``latest_id`` and the command line:
  the order of :func:`latest_candidates`. First what ``_latest`` names, unless a
  checkpoint committed after it outranks it (its writer stopped between its commit and
  its pointer swap); then every committed checkpoint the writer record admits (a fenced
  writer's late commit never counts, see :mod:`cairn._pointer`), ranked by writer
  generation, epoch and id;
* ranking reads every manifest but decodes only its three ranking fields. A manifest
  whose header decodes but whose whole does not fails when it is loaded, so the order
  tried is exactly that of decoding every manifest in full: a valid manifest's header is
  its content.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from cairn import _lease, _pointer
from cairn._buffer import Buffer
from cairn._concurrency import bounded_gather
from cairn._context import Context, check_id
from cairn.errors import CheckpointNotFoundError, CorruptManifestError, IntegrityError
from cairn.ids import CheckpointId
from cairn.manifest import CheckpointManifest, dec_hook, decode_manifest

__all__ = [
    "DAMAGE",
    "committed",
    "latest_candidates",
    "list_checkpoints",
    "listed_ids",
    "load_manifest",
]

log = logging.getLogger("cairn")

DAMAGE = (CheckpointNotFoundError, IntegrityError)
"""What makes one checkpoint unloadable without saying anything of the others.

A manifest naming a codec nobody knows is a :class:`CorruptManifestError` (damage). Not
damage, so raised: a :class:`~cairn.errors.StoreError` (a store that refuses or fails a
read would refuse the older checkpoints too, and answering None, "no checkpoint", would
be a lie) and a :class:`~cairn.errors.CodecError` (a known codec this environment lacks:
restoring older state silently would hide a missing install).
"""


async def load_manifest(ctx: Context, checkpoint_id: CheckpointId) -> CheckpointManifest:
    """The checked manifest of ``checkpoint_id``.

    Raises :class:`CheckpointNotFoundError` if it is not committed and
    :class:`CorruptManifestError` if the bytes there are not its valid manifest.
    """
    check_id(checkpoint_id)
    path = ctx.paths.manifest(checkpoint_id)
    try:
        blob = await ctx.store.get(path)
    except CheckpointNotFoundError:
        raise CheckpointNotFoundError(path, f"checkpoint {checkpoint_id}") from None
    if memoryview(blob.data).nbytes == 0:
        raise CheckpointNotFoundError(path, f"checkpoint {checkpoint_id} (aborted by GC)")
    manifest = decode_manifest(path, blob.data)
    if manifest.checkpoint_id != checkpoint_id:
        raise CorruptManifestError(
            path, f"it describes checkpoint {manifest.checkpoint_id}, not {checkpoint_id}"
        )
    return manifest


async def committed(ctx: Context, cid: CheckpointId) -> bool:
    """True when ``cid`` is committed: one HEAD of its manifest, which is not a tombstone."""
    try:
        info = await ctx.store.head(ctx.paths.manifest(cid))
    except CheckpointNotFoundError:
        return False
    return not _lease.is_tombstone(info)


async def listed_ids(ctx: Context) -> list[CheckpointId]:
    """Every checkpoint directory under the base, oldest first (committed or not)."""
    listing = await ctx.store.list_dir(ctx.paths.base_prefix)
    return sorted(
        cid
        for prefix in listing.prefixes
        if (cid := ctx.paths.parse_checkpoint_dir(prefix)) is not None
    )


async def list_checkpoints(ctx: Context) -> list[CheckpointId]:
    """Committed checkpoints, oldest first: one delimiter listing, one HEAD per directory."""
    candidates = await listed_ids(ctx)

    def probe(cid: CheckpointId) -> Callable[[], Awaitable[bool]]:
        return lambda: committed(ctx, cid)

    found = await bounded_gather(ctx.max_concurrent_downloads, map(probe, candidates))
    return [cid for cid, ok in zip(candidates, found, strict=True) if ok]


async def latest_candidates(ctx: Context) -> AsyncIterator[CheckpointId]:
    """Committed checkpoints in the order "latest" tries them (see the module docstring).

    Lazy: when what ``_latest`` names is current and loads, nothing else is read.
    """
    record, _, _ = await _pointer.read_writer(ctx.store, ctx.paths.writer_record())
    pointer, _, _ = await _pointer.read_pointer(ctx.store, ctx.paths.latest_pointer())
    named = pointer.checkpoint_id if pointer is not None else None
    tried = None
    if named is not None and await _pointer_is_current(ctx, named, record):
        tried = named
        yield named
    elif named is None:
        log.info("no usable _latest pointer: ranking the committed checkpoints")
    ids = [cid for cid in await listed_ids(ctx) if cid != tried]
    headers = await _read_headers(ctx, ids[::-1])
    ranked = sorted(
        (h for h in headers if h is not None and _admitted(record, h)), key=_rank, reverse=True
    )
    for header in ranked:
        yield header.checkpoint_id


async def _pointer_is_current(
    ctx: Context, named: CheckpointId, record: _pointer.WriterRecord | None
) -> bool:
    """False when a checkpoint committed after the one ``_latest`` names outranks it."""
    newer = [cid for cid in await listed_ids(ctx) if cid > named]
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


class _ManifestHeader(msgspec.Struct, frozen=True):
    """The fields of a manifest that rank it; decoding skips the rest (no checks)."""

    checkpoint_id: CheckpointId
    epoch: int
    writer_generation: int | None = None


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
            return _decode_header(path, cid, blob.data)

        return job

    return await bounded_gather(ctx.max_concurrent_downloads, map(read, ids))


def _decode_header(path: str, cid: CheckpointId, data: Buffer) -> _ManifestHeader | None:
    """The ranking fields of the manifest at ``path``; None (with a warning) if unreadable."""
    if memoryview(data).nbytes == 0:
        return None  # a tombstone: GC claimed this id
    try:
        header = _header_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        log.warning("skipping checkpoint %s: corrupt manifest at %r: %s", cid, path, exc)
        return None
    if header.checkpoint_id != cid:
        log.warning("skipping checkpoint %s: %r describes %s", cid, path, header.checkpoint_id)
        return None
    return header
