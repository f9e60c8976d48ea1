"""The internal interface of cairn's integrations: what they may use beyond the public API.

The integrations, :mod:`cairn.integrations.distributed` and the packages
:mod:`cairn.torch` and :mod:`cairn.ray`, are built on the public modules (``cairn``,
``cairn.errors``, ``cairn.format.ids``, ``cairn.format.layout``, ``cairn.format.manifest``,
``cairn.data``, ``cairn.format.integrity``, ``cairn.format.signing``, ``cairn.stores``,
``cairn.checkpointer``, ``cairn.sync``, ``cairn.format.codecs``) and on this module
alone: they import no other private module. Everything private they need is named here,
so this list is the whole of their coupling to cairn's internals:

* a save in two phases, whose uploads and commit are separate calls (:func:`begin`,
  :class:`TwoPhaseSave`), optionally building on a parent whose admission it checks:
  its preconditions, its lease and its commit are the commit protocol's own
  (:mod:`cairn.protocol._save`, :mod:`cairn.protocol._commit`), the same as a one-call
  ``save``'s; it uploads partitions and
  directory partitions (the latter carrying unchanged files from that parent, as
  :mod:`cairn.protocol._directories` decides), and awaits beside its last upload those of
  the checkpoint still running in the same process (:class:`InFlight`);
* :func:`upload_part`, a part of a save that only uploads, which can tell each entry
  (:data:`Announce`) as soon as it is final, before its upload has ended, and skip the
  lookup of an id its committer generated;
* :func:`assemble_manifest`, the manifest of uploaded entries (:data:`Entry`) and
  directory partitions (:class:`~cairn.format.manifest.DirectoryEntry`);
* :class:`SaveMeter`, what a save measures of itself for the statistics its manifest
  records: its clock readings, and the store requests and retries of its committer and
  its workers;
* reading as ``load_latest`` does: :data:`DAMAGE`, :func:`latest_candidates`,
  :func:`named_candidates`, :func:`checkpoint_names`, :func:`load_manifest`,
  :func:`read_entry` (an artifact's bytes, verified) and :func:`read_sized` (the bytes
  from an offset to the end of an object of known size);
* :func:`run_blocking`, which runs a coroutine on the event-loop thread the blocking
  API (:mod:`cairn.sync`) runs on (:mod:`cairn.protocol._blocking`), and
  :func:`start_blocking`, which starts one there without waiting;
* :func:`discard_refused`, what a save refused before its commit leaves, removed;
* settings and checks: :data:`DEFAULT_LEASE`, :func:`is_int`, :func:`positive_int`,
  :data:`REMOTE_SCHEMES`; and helpers: :data:`Buffer`, :func:`bounded_gather`.

Invariant: nothing here has logic of its own beyond adapting a checkpointer to the
parts (its context, made of its public settings by
:func:`cairn.protocol._context.context_of`, and its observers); the parts keep theirs.
Nothing here reaches into a private name of a public module.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.data import ArtifactKey, DirectoryCheck
from cairn.errors import CheckpointerError
from cairn.format._buffer import Buffer
from cairn.format._validate import is_int, positive_int
from cairn.format.ids import CheckpointId
from cairn.format.manifest import CheckpointManifest, DirectoryEntry, PartitionSnapshotEntry
from cairn.observe import _dispatch
from cairn.protocol import _catalog, _commit, _directories, _read, _save, _upload
from cairn.protocol._blocking import run_blocking, start_blocking
from cairn.protocol._catalog import DAMAGE
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context, context_of
from cairn.protocol._lease import DEFAULT_LEASE
from cairn.protocol._meter import SaveMeter
from cairn.protocol._save import InFlight, assemble_manifest
from cairn.protocol._upload import Announce, Entry, PartitionUpload
from cairn.stores._urls import REMOTE_SCHEMES

__all__ = [
    "DAMAGE",
    "DEFAULT_LEASE",
    "REMOTE_SCHEMES",
    "Announce",
    "Buffer",
    "Entry",
    "InFlight",
    "SaveMeter",
    "TwoPhaseSave",
    "assemble_manifest",
    "begin",
    "bounded_gather",
    "checkpoint_names",
    "discard_refused",
    "is_int",
    "latest_candidates",
    "load_manifest",
    "named_candidates",
    "positive_int",
    "read_entry",
    "read_sized",
    "run_blocking",
    "start_blocking",
    "upload_part",
]

log = logging.getLogger("cairn")


async def _context(ckpt: ObjectStoreCheckpointer) -> Context:
    """What the parts need of ``ckpt``: its context, its layout resolved."""
    return context_of(ckpt, await ckpt.resolve_paths())


class TwoPhaseSave:
    """A save of one checkpoint whose uploads and commit are separate calls.

    Made by :func:`begin`, which checked the preconditions and took the lease; the
    lease is renewed until :meth:`commit` or :meth:`end` (or the ``async with`` block's
    end), however long the caller takes between its steps.
    """

    def __init__(self, ckpt: ObjectStoreCheckpointer, pending: _save.PendingSave) -> None:
        self._ckpt = ckpt
        self._pending = pending

    @property
    def checkpoint_id(self) -> CheckpointId:
        """The checkpoint being saved."""
        return self._pending.checkpoint_id

    def admits(self, parent: CheckpointManifest) -> bool:
        """True when ``parent`` may be built upon: not committed by a fenced writer after
        the takeover (judged by the writer record this save's preconditions read)."""
        record = self._pending.record
        generation = parent.writer_generation or 0
        return record is None or record.admits(
            generation, (parent.epoch, parent.checkpoint_id.uuid.int)
        )

    async def upload(
        self,
        uploads: Sequence[PartitionUpload],
        *,
        last: bool = False,
        ahead: CheckpointManifest | None = None,
        beside: InFlight | None = None,
    ) -> list[Entry]:
        """Upload partitions of the checkpoint (checked as ``save_partitions_concurrent``
        checks them); their entries. A failure ends the save. ``last``: the commit comes
        next, so ``_latest`` is read beside these uploads (when not known already), and
        the swap after the commit needs no read of its own. ``ahead`` (with ``last``): a
        manifest of this checkpoint naming what was uploaded before; the commit's check
        of those artifacts and its fence read run beside these uploads, and a commit
        naming no more than those, these and ``beside``'s (uploads of the checkpoint
        still running in this process, from :func:`upload_part`, awaited here)
        creates its manifest at once."""
        checked = _upload.check_uploads(uploads)
        if not last:
            return await self._pending.upload(checked, beside=beside)
        entries, _ = await asyncio.gather(
            self._pending.upload(checked, ahead=ahead, beside=beside),
            self._pending.read_latest(),
        )
        return entries

    async def upload_directories(
        self,
        directories: Mapping[ArtifactKey, str | os.PathLike[str]],
        *,
        check: DirectoryCheck = "mtime",
    ) -> tuple[DirectoryEntry, ...]:
        """Upload directory partitions of the checkpoint, ``(operator, partition)`` to a
        local directory saved file by file as ``save`` saves ``CheckpointData.directories``;
        their entries, for :func:`assemble_manifest`'s ``directories``.

        With a parent (given to :func:`begin`), a file its partition of the same key holds
        is carried by reference, decided by ``check`` as ``CheckpointData.directory_check``
        decides; the parent's other directory partitions are not carried. Bad input is
        :class:`~cairn.InvalidInputError` before any I/O; a failure ends the save.
        """
        checked = _directories.check_directories(directories, check)
        return await self._pending.upload_directories(checked, check)

    async def commit(
        self, manifest: CheckpointManifest, meter: SaveMeter | None = None
    ) -> CheckpointManifest:
        """Commit ``manifest`` as ``ObjectStoreCheckpointer.commit`` does; the lease ends.
        With ``meter``, the manifest records the save's statistics, measured up to the
        commit point (the commit's own requests counted in the meter too)."""
        with _dispatch.watching(self._ckpt.observers):
            if meter is None:
                return await self._pending.commit(manifest)
            with meter.counting():
                return await self._pending.commit(manifest, meter.finish(self._pending.ctx))

    async def end(self) -> None:
        """Stop renewing the lease (idempotent): the intent lapses unless committed."""
        await self._pending.end()

    async def __aenter__(self) -> TwoPhaseSave:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.end()


async def begin(
    ckpt: ObjectStoreCheckpointer,
    checkpoint_id: CheckpointId,
    parent_id: CheckpointId | None = None,
    *,
    generated: bool = False,
) -> TwoPhaseSave:
    """Begin a two-phase save of ``checkpoint_id`` through ``ckpt``, as the writer that
    will commit it, building on ``parent_id`` (its lease keeps the parent's objects from
    GC until the commit; None: no parent). ``generated``: the caller made the id
    (``CheckpointId.now()``), which no checkpoint can hold yet, so it is not looked up.

    Raises :class:`~cairn.FencedError` if a newer writer generation has taken over and
    :class:`~cairn.CheckpointExistsError` if the id is committed; nothing is left
    written then.
    """
    pending = await _save.start(await _context(ckpt), checkpoint_id, parent_id, generated=generated)
    return TwoPhaseSave(ckpt, pending)


async def upload_part(
    ckpt: ObjectStoreCheckpointer,
    checkpoint_id: CheckpointId,
    uploads: Sequence[PartitionUpload],
    *,
    announce: Announce | None = None,
    generated: bool = False,
) -> list[Entry]:
    """``ckpt.save_partitions_concurrent(checkpoint_id, uploads)``: a part of a save that
    only uploads; its entries, once all have ended. ``announce`` is told each upload's
    index and entry as soon as the entry is final: for an object of ranges put whole,
    before its put is sent (see :func:`cairn.protocol._upload.upload_partitions`).
    ``generated``: the committer made the id (``CheckpointId.now()``), which no
    checkpoint can hold yet, so it is not looked up."""
    checked = _upload.check_uploads(uploads)
    ctx = await _context(ckpt)
    return await _save.upload_partitions(ctx, checkpoint_id, checked, None, announce, generated)


async def discard_refused(ckpt: ObjectStoreCheckpointer, uploaded: CheckpointManifest) -> None:
    """Best effort: remove what the processes that uploaded parts of a save refused before
    its commit left, the attempt-named artifacts ``uploaded`` names as its own and their
    shared intent (see :func:`cairn.protocol._commit.discard_uncommitted`). Call it only
    once every upload of the save has ended. What is left is GC's job."""
    ctx = await _context(ckpt)
    await _commit.discard_uncommitted(ctx, uploaded)
    try:
        await ctx.store.delete([ctx.paths.intent(uploaded.checkpoint_id)])
    except CheckpointerError as exc:
        log.info("could not remove the intent of refused save %s: %s", uploaded.checkpoint_id, exc)


async def latest_candidates(ckpt: ObjectStoreCheckpointer) -> AsyncIterator[CheckpointId]:
    """The checkpoints ``load_latest`` would try through ``ckpt``, best first (see
    :func:`cairn.protocol._catalog.latest_candidates`)."""
    async for cid in _catalog.latest_candidates(await _context(ckpt)):
        yield cid


async def named_candidates(ckpt: ObjectStoreCheckpointer, name: str) -> AsyncIterator[CheckpointId]:
    """The committed checkpoints named ``name``, newest admitted first."""
    async for cid in _catalog.named_candidates(await _context(ckpt), name):
        yield cid


async def checkpoint_names(ckpt: ObjectStoreCheckpointer) -> list[str]:
    """The names the committed checkpoints carry, sorted."""
    return await _catalog.checkpoint_names(await _context(ckpt))


async def load_manifest(
    ckpt: ObjectStoreCheckpointer, checkpoint_id: CheckpointId
) -> CheckpointManifest:
    """The manifest of committed ``checkpoint_id``, whole and checked (see
    :func:`cairn.protocol._catalog.load_manifest`)."""
    return await _catalog.load_manifest(await _context(ckpt), checkpoint_id)


async def read_entry(
    ckpt: ObjectStoreCheckpointer, path: str, entry: PartitionSnapshotEntry, verify: bool
) -> Buffer:
    """The bytes of the artifact ``entry`` describes at ``path``, decoded, and verified when
    ``verify`` (see :func:`cairn.protocol._read.read_entry`)."""
    return await _read.read_entry(ckpt.store, path, entry, verify)


async def read_sized(ckpt: ObjectStoreCheckpointer, path: str, size: int, start: int = 0) -> Buffer:
    """The bytes of the ``size``-byte object at ``path`` from ``start`` to its end, in one
    request (see :func:`cairn.protocol._read.read_sized`)."""
    return await _read.read_sized(ckpt.store, path, size, start)
