"""The checkpointer: the reference's interface, and its implementation over an object store.

:class:`Checkpointer` is the reference's interface (:mod:`cairn.protocol._reference`).
:class:`ObjectStoreCheckpointer` implements it as a façade: its writing, deleting and
fencing methods are here, its reading methods in :mod:`cairn.checkpointer._reads`, which it
inherits. Each of its jobs lives in a module of its own, with the invariant it keeps
written at its top:

============================  =========================================================
:mod:`cairn.protocol._commit`          the commit protocol, written down: commit, rollback
:mod:`cairn.protocol._save`            the ways to save: in one call, in two phases, in parts
:mod:`cairn.protocol._background`      saves in call order, and in the background
:mod:`cairn.protocol._delete`          deletion, and what it would break
:mod:`cairn.protocol._upload`          artifact upload, hashed while it travels
:mod:`cairn.protocol._download`        loading checkpoints and chains, verified; streamed restore
:mod:`cairn.protocol._chains`          restore chains, and what an incremental save carries over
:mod:`cairn.protocol._catalog`         what is committed, and which checkpoint is the latest
:mod:`cairn.protocol._pointer`         ``_latest`` and the writer generation (fencing)
:mod:`cairn.protocol._paths`           the layout: the one given, or one chosen from the store
:mod:`cairn.protocol._lease`           a save in progress against GC: leases and claims
:mod:`cairn.protocol.retention`        retention policies and GC
============================  =========================================================

Every store call goes through :class:`~cairn.stores.retry.RetryingStore`, which retries only
transient failures, with the checkpointer's :class:`~cairn.stores.retry.RetryPolicy`.
With a :class:`~cairn.stores.budget.RequestBudget`, every attempt beneath it first waits
for its turn in the budget its store shares in the process
(:class:`~cairn.stores._budgeted.BudgetedStore`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from obstore.store import ObjectStore

from cairn.checkpointer._reads import CheckpointReads
from cairn.data import CheckpointData
from cairn.data.inputs import ArtifactData
from cairn.errors import InvalidInputError
from cairn.format._validate import positive_int
from cairn.format.codecs import get_codec
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.format.signing import SigningKey, signing_keys
from cairn.observe import Observer, _dispatch
from cairn.protocol import _catalog, _commit, _delete, _lease, _pointer, _save, _upload
from cairn.protocol._background import BackgroundGc, BackgroundSaves, close_background
from cairn.protocol._context import Context, Hints, check_id, context_of
from cairn.protocol._lease import DEFAULT_LEASE
from cairn.protocol._paths import ChosenPaths
from cairn.protocol._reference import Checkpointer
from cairn.protocol._upload import PartitionUpload
from cairn.protocol.retention import GcResult, RetentionPolicy, run_gc
from cairn.stores import PartsInFlight, Store, as_store
from cairn.stores._budgeted import BudgetedStore
from cairn.stores._observed import ObservedStore
from cairn.stores.budget import BUDGETED_RETRY, RequestBudget, is_remote, open_remote, shared_budget
from cairn.stores.retry import RetryingStore, RetryPolicy

__all__ = ["Checkpointer", "ObjectStoreCheckpointer", "PartitionUpload"]


class ObjectStoreCheckpointer(CheckpointReads, Checkpointer):
    """Production checkpointer over any object store.

    Readers decompress whatever each entry records. ``background`` holds the saves in
    flight; both façades save through it. A retention GC, run after every commit, never
    delays the save, at most one runs at a time (commits meanwhile make one more run
    after it), a failure is logged and kept in ``background_gc.last_error`` instead of
    raised, and :meth:`close` waits for it.

    Use it as ``async with ObjectStoreCheckpointer(...) as ckpt:``: leaving the block
    closes it (see :meth:`__aexit__`).

    Every method that takes a checkpoint id takes a :class:`CheckpointId` or its text;
    those that read or change a committed checkpoint also take a short id, the unique
    start of one (8 characters or more, as ``cairn`` tables print them), resolved
    against the committed checkpoints with one listing (see
    :func:`cairn.protocol.discover.resolve_checkpoint_id`; several matches raise
    :class:`~cairn.errors.AmbiguousCheckpointIdError`, none
    :class:`CheckpointNotFoundError`).

    Args:
        store: An obstore store, a :class:`~cairn.stores.Store`, or a URL opened with
            :func:`~cairn.open_store`.
        paths: The layout; None (the default) chooses it on first use (see
            :meth:`resolve_paths`).
        max_concurrent_uploads: Uploads in flight at most, >= 1.
        retry: How transient store failures are retried; None: ``RetryPolicy()``, or
            :data:`~cairn.stores.budget.BUDGETED_RETRY` with a ``budget`` and a remote store's URL.
        max_concurrent_downloads: Downloads in flight at most, >= 1.
        compression: ``"zstd"`` stores artifacts compressed (see
            :mod:`cairn.format.codecs`); None stores them raw.
        lease: How long a save in progress holds its directory against GC, renewed every
            third of it, however long the save runs; 60 s by default (docs/format.md,
            "Intents and leases").
        max_saves_in_flight: Background saves (:meth:`save_async`) running at once at
            most, >= 1.
        observers: Told what the checkpointer does (see :mod:`cairn.observe`).
        signing_key: HMAC key bytes, a :class:`~cairn.format.signing.ManifestSigner`, or
            a sequence of them: the first signs every manifest committed, and every
            manifest used is refused with :class:`SignatureError` unless one of them
            signed it. None: signatures are ignored (see :mod:`cairn.format.signing`).
        retention: A policy every commit is followed by :meth:`gc` with, in the
            background (orbax's ``max_to_keep`` is ``RetentionPolicy(keep_last=n)``);
            None: no GC.
        budget: Requests and bytes per second at most, to this store, shared with every
            checkpointer of the same store (bucket) in the process (see
            :mod:`cairn.stores.budget`); None: no limit. Given a remote store's URL,
            the checkpointer opens it with obstore's own HTTP retry off, so that every
            request is counted.
        parts_in_flight: Parts of one object moved at once when cairn opens the store
            (a URL, an obstore store): a :class:`~cairn.stores.PartsInFlight`, an int
            (fixed), or None (the default: from 8, adapting between 2 and 16). Memory is
            at most its ``maximum`` times 8 MiB per object in flight. A
            :class:`~cairn.stores.Store` passed as ``store`` carries its own (see
            :class:`~cairn.stores.ObstoreStore`); a local directory has no parts.

    Raises:
        InvalidInputError: An argument is out of range or of the wrong type, or
            ``parts_in_flight`` is given with a :class:`~cairn.stores.Store`.
        InvalidStoreUrlError: ``store`` is a URL :func:`~cairn.open_store` cannot open.
        CodecError: ``compression`` names no known or installed codec.
    """

    def __init__(
        self,
        store: Store | ObjectStore | str,
        paths: CheckpointPaths | None = None,
        max_concurrent_uploads: int = 8,
        *,
        retry: RetryPolicy | None = None,
        max_concurrent_downloads: int = 8,
        compression: str | None = None,
        lease: dt.timedelta = DEFAULT_LEASE,
        max_saves_in_flight: int = 1,
        observers: Sequence[Observer] = (),
        signing_key: SigningKey | Sequence[SigningKey] | None = None,
        retention: RetentionPolicy | None = None,
        budget: RequestBudget | None = None,
        parts_in_flight: PartsInFlight | int | None = None,
    ) -> None:
        self._layout = ChosenPaths(paths)
        self.signing_keys = signing_keys(signing_key)
        self.codec = get_codec(compression) if compression is not None else None
        self.max_concurrent_uploads = positive_int("max_concurrent_uploads", max_concurrent_uploads)
        self.max_concurrent_downloads = positive_int(
            "max_concurrent_downloads", max_concurrent_downloads
        )
        self.lease = _lease.checked_lease(lease)
        if budget is not None and not isinstance(budget, RequestBudget):
            raise InvalidInputError(f"budget must be a RequestBudget, got {budget!r}")
        remote_url = budget is not None and isinstance(store, str) and is_remote(store)
        if retry is None:
            retry = BUDGETED_RETRY if remote_url else RetryPolicy()
        self.retry = retry
        self.observers = tuple(observers)
        for observer in self.observers:
            if not isinstance(observer, Observer):
                raise InvalidInputError(
                    f"observers must be cairn.observe.Observer, got {observer!r}"
                )
        # Beneath the retries, each attempt is one request: counted (a save's statistics)
        # and reported to the observers, and, with a budget, sent in its turn.
        base = (
            open_remote(store, parts_in_flight)
            if isinstance(store, str) and remote_url
            else as_store(store, parts_in_flight)
        )
        inner: Store = ObservedStore(base, self.observers)
        self.budget = None if budget is None else shared_budget(base, budget)
        if self.budget is not None:
            inner = BudgetedStore(inner, self.budget)
        self.store: Store = RetryingStore(inner, self.retry)
        self.writer_generation = 0
        self._hints = Hints()
        self.background = BackgroundSaves(
            positive_int("max_saves_in_flight", max_saves_in_flight),
            self._context,
            self.observers,
            self._committed,
        )
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise InvalidInputError(f"retention must be a RetentionPolicy, got {retention!r}")
        self.retention = retention
        self.background_gc = BackgroundGc(self._retention_gc)

    def __repr__(self) -> str:
        chosen = self._layout.chosen
        shown = "paths not resolved yet" if chosen is None else repr(chosen)
        return f"ObjectStoreCheckpointer({self.store!r}, {shown})"

    @property
    def paths(self) -> CheckpointPaths:
        """The layout of the store: the ``paths`` given, or the one :meth:`resolve_paths`
        chose. Given no ``paths``, the checkpointer chooses on first use, so before any
        of its coroutines has run this raises :class:`PathsUnresolvedError` (rather than
        name a prefix that may not be the one it will use)."""
        return self._layout.paths

    async def resolve_paths(self) -> CheckpointPaths:
        """The layout of the store, chosen on the first call when no ``paths`` was given.

        The default is the store's root (``CheckpointPaths("")``); a store whose root
        holds no checkpoints but whose ``checkpoints/`` does (cairn 0.1's default) keeps
        ``checkpoints/``, with a warning (see :func:`cairn.protocol.discover.default_paths`).
        Idempotent and safe to call concurrently: the store is read once, and the choice
        holds for the checkpointer's life. Every coroutine of the checkpointer calls it
        before its first store call; an explicit ``paths`` is returned as it is, no I/O.

        Returns:
            The layout.
        """
        return await self._layout.resolve(self.store)

    async def _context(self) -> Context:
        """What the checkpointer's parts share (store, layout, limits), as set now, once
        the layout is resolved: every coroutine's first step."""
        return context_of(self, await self.resolve_paths(), self._hints)

    async def _context_seeing_latest(self) -> tuple[Context, _catalog.FirstLook | None]:
        """:meth:`_context` for a call that finds the latest checkpoint: one that has to
        choose the layout first reads the root's ``_writer`` and ``_latest`` beside the
        listing that chooses it, and hands over all three when the root is chosen, so
        that the choice costs no round trip of its own."""
        if self._layout.chosen is not None:
            return await self._context(), None
        root = CheckpointPaths("")
        _, record, pointer = await asyncio.gather(
            self.resolve_paths(),
            _pointer.read_writer(self.store, root.writer_record()),
            _pointer.read_latest(self.store, root.latest_pointer(), self._hints.latest),
            return_exceptions=True,
        )
        context = await self._context()
        listing = self._layout.take_root_listing()
        if context.paths != root or listing is None:
            self._hints.latest.forget()  # what was read is not this layout's pointer
            return context, None
        if isinstance(record, BaseException) or isinstance(pointer, BaseException):
            return context, None  # read them again, and fail there if they fail
        return context, _catalog.FirstLook(record[0], pointer, listing)

    # -- writing: the commit protocol (protocol._commit, protocol._upload) ----------------

    async def save(self, data: CheckpointData) -> CheckpointManifest:
        """Upload every artifact, commit the manifest, and advance ``_latest``.

        With a ``parent_id``, every partition of the parent that ``data`` does not mention
        is carried over by reference (not uploaded again), and each delta is appended to the
        parent's chain for its partition. Nothing of the checkpoint is visible unless this
        returns (or fails after the commit point, as with :class:`FencedError` from the
        pointer update, in which case the manifest is rolled back). The save holds a lease
        on its directory from its first write to its commit; if GC claimed the id anyway
        (the lease lapsed, for instance because the process stalled), it raises
        :class:`CheckpointAbortedError` and commits nothing. A write whose reply was lost is
        resolved by reading back: a manifest that landed counts as committed (the save
        returns), and a pointer swap that runs out of retries after the commit leaves
        ``_latest`` behind (a hint: readers fall back to listing) but does not fail the
        save. One case stays open: if the store keeps failing so that the outcome cannot be
        learnt (the manifest cannot be read back, or the fence checked after a failed swap),
        that :class:`StoreError` propagates and the checkpoint may be committed
        (:meth:`exists` tells).

        Args:
            data: The checkpoint to save.

        Returns:
            The committed manifest.

        Raises:
            FencedError: A newer writer generation has taken over.
            CheckpointAbortedError: GC claimed the id; nothing is committed.
            StoreError: The store kept failing (see above).
        """
        return await self.background.save(data)

    async def save_async(
        self, data: CheckpointData, *, copy: bool = False
    ) -> asyncio.Task[CheckpointManifest]:
        """Start :meth:`save` in the background; returns its task once ``data`` is handed over.

        Waits only for a free slot: at most ``max_saves_in_flight`` background saves run
        at once, and a further call waits until one ends (back-pressure). Saves commit in
        call order, so ``_latest`` never moves backwards. The task's result is the
        committed manifest; a failure is raised from the task, and, if nobody awaited it,
        from the next :meth:`save_async`, :meth:`save`, :meth:`wait_for_saves` or
        :meth:`close` — never lost.

        The artifacts are read while the save runs, after this returns: do not change a
        buffer handed in until its task is done, or pass ``copy=True`` to have cairn copy
        every buffer before returning (files and streams are read in the background
        either way). A save still running when the event loop closes is cancelled and
        commits nothing: await :meth:`wait_for_saves` (or :meth:`close`) before that.

        Args:
            data: The checkpoint to save.
            copy: Copy every buffer of ``data`` before returning, so the caller may
                reuse them at once.

        Returns:
            The save's task; its result is the committed manifest.
        """
        return await self.background.save_async(data, copy=copy)

    async def wait_for_saves(self) -> None:
        """Wait until every background save has ended; raise a failure nobody looked at."""
        await self.background.wait()

    async def close(self) -> None:
        """Wait for the background saves (see :meth:`wait_for_saves`), then for the
        retention GC they started (whose failure is logged, not raised); nothing else to
        free. A failure of a save nobody looked at is raised after both have ended."""
        await close_background(self.background, self.background_gc)

    async def __aenter__(self) -> Self:
        """The checkpointer itself: ``async with ObjectStoreCheckpointer(...) as ckpt``."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """:meth:`close`: wait for the saves in flight and the retention GC.

        Saves in flight are waited for, never cancelled, also when the block raised: a
        save that was handed over commits or fails, it is not dropped. A save failure
        nobody looked at is raised from here after a block that ended normally; after a
        block that raised, the block's exception goes on, and the save failure is logged
        and added to it as a note, so that neither is lost.
        """
        await close_background(self.background, self.background_gc, exc)

    def _committed(self, manifest: CheckpointManifest) -> CheckpointManifest:
        """``manifest`` was committed: ask for the retention GC, if there is a policy."""
        if self.retention is not None:
            self.background_gc.request()
        return manifest

    async def _retention_gc(self) -> None:
        assert self.retention is not None
        await self.gc(self.retention)

    async def commit(self, manifest: CheckpointManifest) -> CheckpointManifest:
        """Commit an uploaded checkpoint: write its manifest, then advance ``_latest``.

        The second half of :meth:`save`, for callers that upload the artifacts
        themselves. Every artifact the manifest names must be in the store (else
        :class:`BrokenChainError`, and nothing is committed). If the manifest write fails
        before the commit point, what was uploaded for the checkpoint is removed; if GC
        claimed the id first, :class:`CheckpointAbortedError`; if a newer writer
        generation has taken over by the time ``_latest`` is swapped, the manifest is
        rolled back and :class:`FencedError` raised.

        Args:
            manifest: The manifest of the uploaded checkpoint.

        Returns:
            The committed manifest.

        Raises:
            BrokenChainError: An artifact the manifest names is not in the store.
            CheckpointAbortedError: GC claimed the id first.
            FencedError: A newer writer generation has taken over.
        """
        with _dispatch.watching(self.observers):
            return self._committed(await _commit.commit(await self._context(), manifest))

    async def save_manifest(self, manifest: CheckpointManifest) -> None:
        """Commit a manifest: write it only if no manifest exists for its id.

        Args:
            manifest: The manifest.

        Raises:
            CheckpointExistsError: A different manifest is committed there (an identical
                one means this commit already happened).
            CheckpointAbortedError: GC claimed the id.
            FencedError: A newer writer has taken over.
        """
        await _commit.save_manifest(await self._context(), manifest)

    async def save_snapshot(
        self, checkpoint_id: CheckpointId | str, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Upload the full state of one partition of an uncommitted checkpoint.

        Written to the reference's name, :meth:`CheckpointPaths.snapshot`, create-only: a
        name that holds other bytes already (another save of this id wrote it) raises
        :class:`ArtifactExistsError` and is left as it is. The payload is held whole in
        memory for the one create-only request; for large files or streams use
        :meth:`save` or :meth:`save_partitions_concurrent`, which stream.

        Args:
            checkpoint_id: The uncommitted checkpoint.
            operator: The operator.
            partition: The partition.
            data: Its full state.

        Returns:
            The SHA-256 of ``data``, in hex.

        Raises:
            ArtifactExistsError: The name holds other bytes already.
        """
        return await self._save_write_once(checkpoint_id, (operator, partition, False, data))

    async def save_delta(
        self, checkpoint_id: CheckpointId | str, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Upload an incremental delta of one partition of an uncommitted checkpoint.

        Written create-only to :meth:`CheckpointPaths.delta`, as :meth:`save_snapshot`.

        Args:
            checkpoint_id: The uncommitted checkpoint the delta is part of.
            operator: The operator whose state changed.
            partition: Which of its partitions changed.
            data: The delta on the parent's state.

        Returns:
            The delta's SHA-256, in hex.

        Raises:
            ArtifactExistsError: The name holds other bytes already.
        """
        return await self._save_write_once(checkpoint_id, (operator, partition, True, data))

    async def _save_write_once(
        self, checkpoint_id: CheckpointId | str, upload: PartitionUpload
    ) -> str:
        cid = check_id(checkpoint_id)
        [checked] = _upload.check_uploads([upload])
        entry = await _save.upload_write_once(await self._context(), cid, checked)
        return entry.sha256

    async def save_partitions_concurrent(
        self,
        checkpoint_id: CheckpointId | str,
        uploads: Sequence[PartitionUpload],
        *,
        metadata_key: str | None = None,
    ) -> list[tuple[str, PartitionSnapshotEntry]]:
        """Upload partitions of an uncommitted checkpoint concurrently, with their digests.

        At most ``max_concurrent_uploads`` uploads are in flight; digests are computed
        off the event loop. On the first failure no further upload starts, and the error
        is raised once those in flight have ended (what the call uploaded is removed).
        Writes no manifest. Every object's name carries a token of this call's own
        (``partition-{p}.{attempt}.snap``; each entry's ``path`` says it), so no other
        writer of the same id can replace it. The uploads hold the checkpoint's lease
        while they run; it lapses ``lease`` after they end unless the checkpoint is
        committed first.

        Args:
            checkpoint_id: The uncommitted checkpoint.
            uploads: ``(operator, partition, is_delta, data)`` for each partition.
            metadata_key: Hash each artifact before it is sent and store its digest as
                this user-metadata key (see :mod:`cairn.integrations.distributed`);
                None: no such key.

        Returns:
            ``(operator, entry)`` for each artifact, as a manifest lists them.

        Raises:
            CheckpointExistsError: The checkpoint is already committed (committed
                checkpoints are immutable).
        """
        cid = check_id(checkpoint_id)
        checked = _upload.check_uploads(uploads)
        return await _save.upload_partitions(await self._context(), cid, checked, metadata_key)

    async def delete_checkpoint(
        self, checkpoint_id: CheckpointId | str, *, force: bool = False
    ) -> None:
        """Delete every object of ``checkpoint_id``, the manifest first.

        Unlike the reference's, it never breaks another checkpoint: while
        :meth:`dependents` names any (a committed checkpoint whose restore chains carry
        its bytes or need its manifest, or a save in progress building on it), it raises
        :class:`CheckpointInUseError` naming them and deletes nothing. ``force=True``
        deletes it anyway, and those then no longer load. If ``_latest`` names it,
        ``_latest`` is moved, by compare-and-swap, to the newest checkpoint that remains
        (or to none). A checkpoint that does not exist is not an error.

        Args:
            checkpoint_id: The checkpoint (a short id too).
            force: Delete it even while others build on it.

        Raises:
            CheckpointInUseError: Others build on it, and not ``force``; nothing was
                deleted.
        """
        await _delete.delete_checkpoint(await self._context(), await self._id(checkpoint_id), force)

    async def dependents(self, checkpoint_id: CheckpointId | str) -> list[CheckpointId]:
        """What deleting ``checkpoint_id`` would break, oldest first.

        The committed checkpoints whose restore chains need it (they carry its bytes by
        reference, or list a delta whose base it holds, the reference's way), and the
        saves in progress that build on it (a live lease). Reads every manifest of the
        store: one listing and one GET each; writes nothing.

        Args:
            checkpoint_id: The checkpoint (a short id too).

        Returns:
            Their ids, oldest first.
        """
        return await _delete.dependents(await self._context(), await self._id(checkpoint_id))

    # -- fencing and the latest pointer (cairn.protocol._commit, _pointer) -----------------------

    async def take_over(self) -> int:
        """Become the writer of this store, fencing every earlier writer.

        Raises the writer generation recorded in the store above every one visible,
        ends every save still in flight, this checkpointer's own included (its id
        claimed), and claims ``_latest`` for the new generation. From then on a
        checkpointer of an older generation cannot commit: its ``save`` raises
        :class:`FencedError` or :class:`CheckpointAbortedError`.

        Returns:
            The new writer generation.
        """
        self.writer_generation = await _commit.take_over(self.store, await self.resolve_paths())
        return self.writer_generation

    async def update_latest(
        self, checkpoint_id: CheckpointId | str, *, force: bool = False
    ) -> bool:
        """Point ``_latest`` at committed ``checkpoint_id``, by compare-and-swap.

        Args:
            checkpoint_id: The checkpoint (a short id too).
            force: Move it even backwards; by default it only moves forwards (to a
                greater epoch, then id).

        Returns:
            Whether it moved.

        Raises:
            CheckpointNotFoundError: The id is not committed.
            FencedError: A newer writer owns the store.
        """
        return await _commit.update_latest(
            await self._context(), await self._id(checkpoint_id), force
        )

    # -- retention (cairn.protocol.retention) -----------------------------------------------------

    async def gc(
        self,
        policy: RetentionPolicy,
        *,
        dry_run: bool = False,
        min_age: dt.timedelta = dt.timedelta(hours=1),
    ) -> GcResult:
        """Delete the checkpoints ``policy`` does not keep, and sweep orphans.

        Never deletes the checkpoint ``_latest`` names or any newer one, a retained or
        pinned one, or any artifact reachable from one; a save in progress (a live lease,
        or objects younger than ``min_age``) is left alone. See
        :mod:`cairn.protocol.retention`. A run that meets a checkpoint a newer cairn wrote
        deletes nothing and names it in :attr:`GcResult.newer_format`.

        Args:
            policy: Which committed checkpoints to keep.
            dry_run: Delete nothing; the result says what would be deleted.
            min_age: An uncommitted directory with an object younger than this is a
                save in progress, left alone; >= 0.

        Returns:
            What the run deleted and kept.

        Raises:
            InvalidInputError: A pinned id does not exist, or ``min_age`` is negative.
        """
        async with self.observed("gc") as op:
            paths = await self.resolve_paths()
            op.gc = await run_gc(
                self.store,
                paths,
                policy,
                dry_run=dry_run,
                min_age=min_age,
                cache=self._hints.manifests,
            )
            return op.gc
