"""Leases and claims: how a save in progress and a GC agree on who owns an uncommitted id.

A save uploads for a while before it commits; GC must neither sweep what a running save
uploaded nor wait for ever on what a crashed save left. The protocol:

* **Lease.** Before it reads or uploads anything, a save writes its intent,
  ``{id}/intent.{attempt}.json`` (the parent it builds on, if any, and the lease
  duration; each save its own, so two writers of one id never overwrite each other's;
  the processes that only upload parts of one save share ``{id}/intent.json``). While
  the save runs it rewrites the intent every third of the lease, so the object's
  modification time is the start of the current lease. GC treats an uncommitted
  directory with an intent younger than its lease as a save in progress: it deletes
  nothing in it and keeps the parents' chains, whatever its ``min_age``; and it never
  claims or sweeps a directory such a save builds on. A committed save deletes its
  intents once it has published; the protection ends with the save.
* **Claim.** GC reclaims an uncommitted directory only after claiming its id: a
  create-only write of an empty ``manifest.json``, the *tombstone*. The manifest path is
  the one object that a commit (which writes it create-only too) and a claim race for,
  so the store lets exactly one of them win: a save whose id was claimed fails at its
  commit with :class:`~cairn.errors.CheckpointAbortedError` and nothing of it is
  committed; a GC whose claim meets a real manifest spares the directory as committed.

* **Retirement.** A committed checkpoint whose directory still holds an intent belongs
  to a save that has not finished: a create of its manifest that it retries after a lost
  reply would write the manifest again once a deletion removed it, over objects deleted
  since. And a checkpoint a fence names (where a fenced writer generation ended, see
  :mod:`cairn.protocol._pointer`) must not be committed again by a fenced writer of the same id,
  which readers would take for exactly where its generation ended. Deleting such a
  checkpoint claims its id instead (:func:`retire`): the manifest is replaced by a
  tombstone, and the directory is swept like any claimed one.

So clocks decide only *when* GC tries to claim (liveness), never whether a commit and a
sweep can both happen (safety); and the clock that decides is the store's: a lease's age
is the store's time (:func:`cairn.protocol.retention.store_now`) less the ``last_modified`` the
store stamped on the intent, so a GC whose own clock is days off claims no live lease.
Readers take a zero-byte ``manifest.json`` for "not committed" (no manifest is ever
empty; :func:`is_tombstone` is the one test). GC removes a tombstone once nothing else is
left in its directory and it is older than :data:`TOMBSTONE_RETENTION` by the store's
time. A save stalled for longer than that between its check of the artifacts and its
create could then commit over a swept directory; it checks the artifacts again after
the create and rolls its manifest back if any is gone (:mod:`cairn.protocol._commit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import weakref

import msgspec

from cairn.errors import (
    CheckpointerError,
    CheckpointNotFoundError,
    InvalidInputError,
    ObjectExistsError,
    PreconditionFailedError,
)
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.format.manifest import dec_hook, enc_hook
from cairn.stores import IfMatch, ObjectInfo, Store

__all__ = [
    "DEFAULT_LEASE",
    "STAMP_RESOLUTION",
    "TOMBSTONE",
    "TOMBSTONE_RETENTION",
    "Intent",
    "Lease",
    "checked_lease",
    "claim",
    "decode_intent",
    "is_live",
    "is_tombstone",
    "retire",
    "stamp_margin",
]

log = logging.getLogger("cairn")

DEFAULT_LEASE = dt.timedelta(seconds=60)
"""How long a save's intent protects its directory without being renewed."""
TOMBSTONE = b""
"""The content of a claimed id's ``manifest.json``."""
TOMBSTONE_RETENTION = dt.timedelta(days=1)
"""How long GC keeps a tombstone after its directory was swept."""


def checked_lease(lease: object) -> dt.timedelta:
    """``lease`` if it is a positive :class:`~datetime.timedelta` (a save's lease);
    :class:`InvalidInputError` naming it otherwise."""
    if not isinstance(lease, dt.timedelta) or lease <= dt.timedelta(0):
        raise InvalidInputError(f"lease must be a positive timedelta, got {lease!r}")
    return lease


class Intent(msgspec.Struct, frozen=True, omit_defaults=True):
    """Content of ``intent.json``: what a save in progress builds on, and its lease.

    ``lease_ms`` 0 (an intent stored without a lease) protects nothing by itself:
    GC then goes by the age of the directory's objects (``min_age``).
    """

    parent_id: CheckpointId | None = None
    lease_ms: int = 0


_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
_decoder = msgspec.json.Decoder(Intent, dec_hook=dec_hook)


def decode_intent(data: bytes) -> Intent | None:
    """The intent in ``data``; None when it is damaged (it then protects nothing)."""
    try:
        intent = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError, NotImplementedError):
        return None
    return intent if intent.lease_ms >= 0 else None


STAMP_RESOLUTION = dt.timedelta(seconds=1)
"""How coarse a store's ``last_modified`` may be: S3, GCS and Azure state it in whole
seconds (HTTP dates), so two such stamps taken within one second can compare either way."""


def stamp_margin(*stamps: dt.datetime) -> dt.timedelta:
    """What to allow for the stamps' resolution: :data:`STAMP_RESOLUTION` when any of them
    is a whole second (a store that cuts them), nothing for finer ones (memory, local)."""
    coarse = any(stamp.microsecond == 0 for stamp in stamps)
    return STAMP_RESOLUTION if coarse else dt.timedelta(0)


def is_live(info: ObjectInfo, intent: Intent | None, now: dt.datetime) -> bool:
    """True unless the intent at ``info`` was surely (re)written over its lease ago.

    ``now`` is the store's time (:func:`cairn.protocol.retention.store_now`); on a store whose
    stamps are whole seconds a lease counts as lapsed only :data:`STAMP_RESOLUTION`
    past its end (:func:`stamp_margin`).
    """
    if intent is None or intent.lease_ms <= 0:
        return False
    lease = dt.timedelta(milliseconds=intent.lease_ms)
    return info.last_modified + lease + stamp_margin(info.last_modified, now) > now


def is_tombstone(found: ObjectInfo | Buffer) -> bool:
    """True when a ``manifest.json`` is a claim, not a commit: ``found`` is what a HEAD or
    a listing reported of it, or the bytes a GET read (the one test of a tombstone)."""
    size = found.size if isinstance(found, ObjectInfo) else memoryview(found).nbytes
    return size == len(TOMBSTONE)


class Lease:
    """A held lease: its intent renewed in the background until :meth:`stop`.

    :meth:`start` writes the intent and starts renewing it every third of the lease
    (:meth:`begin` starts the write and returns at once). A lease nobody stops is
    stopped when it is garbage-collected, so a save abandoned between its steps (a
    two-phase save whose commit never comes) stops renewing, and its intent lapses.
    """

    def __init__(
        self,
        renewal: asyncio.Task[None],
        stopping: asyncio.Event,
        path: str,
        first: asyncio.Future[None],
    ) -> None:
        self.path = path
        """The intent this lease renews."""
        self._renewal = renewal
        self._stopping = stopping
        self._first = first
        loop = renewal.get_loop()
        self._finalizer = weakref.finalize(self, _cancel_soon, loop, renewal)
        self._finalizer.atexit = False  # at exit the loop's own shutdown ends the task

    @classmethod
    async def start(
        cls, store: Store, path: str, parent_id: CheckpointId | None, duration: dt.timedelta
    ) -> Lease:
        """Write the intent at ``path`` (naming ``parent_id``) and renew it every third of
        ``duration`` until :meth:`stop`: :meth:`begin`, returning once the intent is
        written.

        A renewal that fails is logged and tried again at the next period: the lease may
        then lapse, which costs the save its commit (GC may claim the id), never
        correctness.
        """
        lease = cls.begin(store, path, parent_id, duration)
        try:
            await lease.written()
        except BaseException:
            await lease.stop()
            raise
        return lease

    @classmethod
    def begin(
        cls, store: Store, path: str, parent_id: CheckpointId | None, duration: dt.timedelta
    ) -> Lease:
        """Start writing the intent at ``path`` (naming ``parent_id``), then renew it
        every third of ``duration`` until :meth:`stop`; returns at once, so that what
        does not depend on the intent (a save's uploads) runs beside its write.
        :meth:`written` returns once it is written, and raises if the write failed: what
        must come after the intent (the fence read, the commit) waits for it.
        """
        body = _encoder.encode(Intent(parent_id, int(duration.total_seconds() * 1000)))
        period = duration.total_seconds() / 3
        stopping = asyncio.Event()
        first = asyncio.get_running_loop().create_future()

        async def write_then_renew() -> None:
            try:
                await store.put(path, body)
            except Exception as exc:  # for written() to raise: nothing to renew
                first.set_exception(exc)
                return
            except BaseException:
                first.cancel()
                raise
            first.set_result(None)
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), period)
                    return
                try:
                    await store.put(path, body)
                except CheckpointerError as exc:
                    log.warning("could not renew the lease %s: %s", path, exc)

        return cls(asyncio.create_task(write_then_renew()), stopping, path, first)

    async def written(self) -> None:
        """Return once the intent is written; raise what its write raised."""
        await asyncio.shield(self._first)

    async def stop(self) -> None:
        """Stop renewing (idempotent); returns once no renewal is in flight. The intent
        stays until deleted: the lease lapses.

        A renewal already sent is awaited to its reply, not cancelled: a cancelled request
        may still reach the store, after the caller's delete of the intent, and write it
        back (the save's directory would then look busy to GC for one more lease).
        """
        self._finalizer.detach()
        self._stopping.set()
        # shielded: a caller cancelled while it waits leaves the renewal to end by itself
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self._renewal)
        if not self._renewal.done():  # the caller was cancelled: say so
            raise asyncio.CancelledError
        if self._first.done() and not self._first.cancelled():
            self._first.exception()  # a failed first write is written()'s to report


def _cancel_soon(loop: asyncio.AbstractEventLoop, renewal: asyncio.Task[None]) -> None:
    """Cancel ``renewal`` on its own loop (a finalizer may run on any thread)."""
    if not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(renewal.cancel)


async def retire(store: Store, listed: ObjectInfo) -> bool:
    """Delete a committed checkpoint by replacing its manifest with a tombstone.

    For a checkpoint whose directory still holds an intent: the save that committed it
    has not finished (its lease ends only after its create returned), and a create it
    retries after a lost reply would write the manifest again once it is gone, over
    objects deleted meanwhile. A tombstone keeps the id claimed (a create fails on it)
    until GC removes it with the rest of the directory. ``listed`` is the manifest as a
    listing reported it: only that version is replaced (compare-and-swap), and a manifest
    deleted meanwhile is claimed with a create-only tombstone. Returns True when the
    tombstone stands, False when the path holds a manifest other than the one listed.
    """
    try:
        current = await store.head(listed.path)
    except CheckpointNotFoundError:
        return await claim(store, listed.path)
    if is_tombstone(current):
        return True
    if current.e_tag is None or current.e_tag != listed.e_tag:
        return False
    try:
        await store.put(listed.path, TOMBSTONE, mode=IfMatch(current.e_tag, current.version))
    except PreconditionFailedError:
        return False
    return True


async def claim(store: Store, manifest_path: str) -> bool:
    """Claim an uncommitted id for GC by writing its tombstone; False if it is committed.

    True also when the id was claimed before (an empty manifest is already there).
    """
    try:
        await store.put(manifest_path, TOMBSTONE, mode="create")
    except ObjectExistsError:
        try:
            return is_tombstone(await store.head(manifest_path))
        except CheckpointNotFoundError:
            return False  # deleted meanwhile: claim again in a later run
    return True
