"""Reading a store through a checkpointer: what is committed, what is latest, and every
byte of a checkpoint, verified.

:class:`CheckpointReads` holds the reading half of
:class:`~cairn.ObjectStoreCheckpointer` (which inherits it; the API reference shows its
methods there). Each method is a façade over the module that does the job:
:mod:`cairn.protocol._catalog` (what is committed, what "latest" means),
:mod:`cairn.protocol._download` and :mod:`cairn.protocol._read` (loads, verified),
:mod:`cairn.protocol._directories` (directory partitions), :mod:`cairn.protocol.discover`
(finding checkpoints for tools).

Invariant: no method here writes to the store, and every byte it returns or writes out
was checked against the SHA-256 its manifest records (``verify=False`` excepted).
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, BinaryIO

from cairn.data import ChainLink, LoadedCheckpoint
from cairn.errors import CheckpointNotFoundError
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.format.keygroups import KeyGroups
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest, FileEntry
from cairn.format.rescale import KeyedAssignment, NonKeyedMode, RestorePlan
from cairn.observe import Observer, Operation, _dispatch
from cairn.protocol import _catalog, _directories, _download, _keyed, _read
from cairn.protocol._context import Context, check_id
from cairn.protocol._download import RESTORE_CHUNK
from cairn.protocol.discover import (
    ManifestOrDamage,
    checkpoint_dirs,
    load_manifests,
    resolve_checkpoint_id,
)
from cairn.stores import Store

__all__ = ["CheckpointReads"]


@contextlib.asynccontextmanager
async def _observed_with(
    observers: Sequence[Observer], name: str, attributes: dict[str, Any]
) -> AsyncIterator[Operation]:
    with _dispatch.watching(observers):
        async with _dispatch.observed(None, name, **attributes) as op:
            yield op


class CheckpointReads(abc.ABC):
    """The reading methods of :class:`~cairn.ObjectStoreCheckpointer`, over the store,
    layout and observers the checkpointer holds."""

    store: Store
    observers: tuple[Observer, ...]

    @abc.abstractmethod
    async def resolve_paths(self) -> CheckpointPaths:
        """The layout of the store (:meth:`cairn.ObjectStoreCheckpointer.resolve_paths`).

        Returns:
            The layout.
        """

    @abc.abstractmethod
    async def _context(self) -> Context:
        """What the checkpointer's parts share, once the layout is resolved."""

    @abc.abstractmethod
    async def _context_seeing_latest(self) -> tuple[Context, _catalog.FirstLook | None]:
        """:meth:`_context`, and what choosing the layout read that "latest" starts from."""

    async def read_latest(self) -> CheckpointId | None:
        """The checkpoint ``_latest`` names.

        Returns:
            Its id; None when it is absent (or unreadable, with a warning).
        """
        return await _catalog.read_latest(await self._context())

    async def exists(self, checkpoint_id: CheckpointId | str) -> bool:
        """Whether a checkpoint is committed (one HEAD of its manifest).

        Args:
            checkpoint_id: The checkpoint; a short id costs one listing too.

        Returns:
            True when it is committed; False when not, or when no checkpoint matches a
            short id.
        """
        try:
            cid = await self._id(checkpoint_id)
        except CheckpointNotFoundError:
            return False
        return await _catalog.committed(await self._context(), cid)

    async def _id(self, checkpoint_id: CheckpointId | str) -> CheckpointId:
        """The id ``checkpoint_id`` names: itself, its text parsed, or the one committed
        checkpoint a short id names (:func:`cairn.protocol.discover.resolve_checkpoint_id`)."""
        context = await self._context()
        return await resolve_checkpoint_id(
            checkpoint_id,
            self.list_checkpoint_dirs,
            lambda cid: _catalog.committed(context, cid),
            where=repr(context.paths.base_prefix),
        )

    async def list_checkpoints(self) -> list[CheckpointId]:
        """Committed checkpoints, oldest first.

        One delimiter listing of the base, then one HEAD per listed directory for its
        manifest: the cost grows with the number of checkpoints, not of their artifacts.

        Returns:
            Their ids, oldest first.
        """
        return await _catalog.list_checkpoints(await self._context())

    async def load_manifest(self, checkpoint_id: CheckpointId | str) -> CheckpointManifest:
        """Load and check the manifest of a checkpoint.

        Args:
            checkpoint_id: The checkpoint (a short id too).

        Returns:
            Its manifest.

        Raises:
            CheckpointNotFoundError: It is not committed.
            CorruptManifestError: The bytes there are not its valid manifest.
            NewerFormatError: A newer cairn wrote it (see :meth:`load_latest`).
        """
        return await _catalog.load_manifest(await self._context(), await self._id(checkpoint_id))

    async def latest_id(self, *, skip_newer_format: bool = False) -> CheckpointId | None:
        """What "latest" means: the checkpoint :meth:`load_latest` returns.

        The newest committed checkpoint that loads and verifies, found as
        :meth:`load_latest` finds it, with the same reads: every artifact of the
        checkpoint is read and checked against its SHA-256 (and those of each newer one
        passed over as damaged), each dropped once checked, so memory holds the reads in
        flight, not the checkpoint. :meth:`newest_id` names the newest
        committed checkpoint from the manifests alone; the two differ only when that
        one is damaged.

        Args:
            skip_newer_format: Pass over a checkpoint a newer cairn wrote instead of
                raising.

        Returns:
            Its id; None when no committed checkpoint loads.

        Raises:
            NewerFormatError: A newer cairn wrote a checkpoint reached before one that
                loads, as in :meth:`load_latest`.
        """
        context, seen = await self._context_seeing_latest()
        verified = await _catalog.first_that_loads(
            context,
            lambda cid: _download.verify(context, cid),
            skip_newer_format=skip_newer_format,
            seen=seen,
        )
        return verified.checkpoint_id if verified is not None else None

    async def newest_id(self, *, skip_newer_format: bool = False) -> CheckpointId | None:
        """The newest committed checkpoint, whether its artifacts verify or not.

        The first checkpoint in the order :meth:`load_latest` tries them whose manifest
        reads; no artifact is read. When it is damaged, :meth:`latest_id` and
        :meth:`load_latest` pass over it to an older one; ``cairn verify newest``
        checks it.

        Args:
            skip_newer_format: Pass over a checkpoint a newer cairn wrote instead of
                raising.

        Returns:
            Its id; None when nothing is committed.

        Raises:
            NewerFormatError: A newer cairn wrote it, as in :meth:`load_latest`.
        """
        context, seen = await self._context_seeing_latest()
        return await _catalog.newest_id(context, skip_newer_format=skip_newer_format, seen=seen)

    async def load(
        self,
        checkpoint_id: CheckpointId | str,
        *,
        verify: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> LoadedCheckpoint:
        """Load a committed checkpoint: manifest, every artifact (verified), source offsets.

        Args:
            checkpoint_id: The checkpoint (a short id too).
            verify: Check every artifact against its SHA-256.
            progress: If given, called on the event loop with the size in bytes
                (decoded) of each artifact once it is read and verified: a progress
                bar's ``advance``.

        Returns:
            The checkpoint, with its artifacts.

        Raises:
            IntegrityMismatchError: An artifact's digest differs; the message names it.
            BrokenChainError: An artifact or parent that a partition's chain needs is
                gone; the message names the link.
        """
        with _dispatch.watching(self.observers):
            cid = await self._id(checkpoint_id)
            async with _dispatch.observed(None, "load", checkpoint_id=cid) as op:
                loaded = await _download.load(await self._context(), cid, verify, progress)
                op.manifest = loaded.manifest
                return loaded

    async def load_latest(self, *, skip_newer_format: bool = False) -> LoadedCheckpoint | None:
        """The newest committed checkpoint that loads and verifies, or None if there is none.

        Tries the committed checkpoints in the order "latest" means (docs/format.md,
        "``_writer`` and fences"): what ``_latest`` names, unless a checkpoint committed
        after it outranks it (its writer stopped between its commit and its pointer
        swap); then every committed checkpoint ranked by writer generation, epoch and id.
        A checkpoint committed by a fenced writer after the takeover never counts (the
        same section's admission rule). Each one that does not load (a deleted or damaged manifest
        or artifact) is logged and skipped.

        One that a newer cairn wrote (its manifest requires format features this cairn
        does not know) is not damage: rather than restore older state past it, this
        raises :class:`NewerFormatError`. One older than the checkpoint that loads is
        never reached, so it does not matter.

        Args:
            skip_newer_format: Pass over a checkpoint a newer cairn wrote like damage,
                with a warning naming it, instead of raising.

        Returns:
            The checkpoint, with its artifacts; None if none loads.

        Raises:
            NewerFormatError: A newer cairn wrote a checkpoint reached before one that
                loads.
        """
        async with self.observed("load_latest") as op:
            context, seen = await self._context_seeing_latest()
            loaded = await _catalog.first_that_loads(
                context,
                lambda cid: _download.load(context, cid, True),
                skip_newer_format=skip_newer_format,
                seen=seen,
            )
            op.manifest = loaded.manifest if loaded is not None else None
            return loaded

    async def load_chain(
        self, checkpoint_id: CheckpointId | str, operator: str, partition: int
    ) -> list[ChainLink]:
        """What rebuilds one partition: its base snapshot, then every delta in order.

        Each link is verified.

        Args:
            checkpoint_id: The checkpoint (a short id too).
            operator: The operator.
            partition: The partition.

        Returns:
            The links, base snapshot first.

        Raises:
            BrokenChainError: A link (parent, base or artifact) is missing; the message
                names it.
            IntegrityMismatchError: An artifact's digest differs; the message names it.
            CheckpointNotFoundError: The checkpoint has no state for that partition.
        """
        cid = await self._id(checkpoint_id)
        return await _download.load_chain(await self._context(), cid, operator, partition)

    async def load_key_groups(
        self,
        checkpoint_id: CheckpointId | str,
        operator: str,
        groups: Iterable[int],
        *,
        key_groups: KeyGroups | None = None,
        verify: bool = True,
    ) -> dict[int, Buffer]:
        """The state of some key groups of a keyed operator, whichever partitions hold
        them: each group read with ranged reads (adjacent groups of one partition
        together) after that partition's range index, and verified on its own.

        Args:
            checkpoint_id: The checkpoint (a short id too).
            operator: An operator saved as :class:`~cairn.KeyedSnapshot` partitions.
            groups: The key groups to read.
            key_groups: The key space the caller expects; a checkpoint with another
                count is refused. None accepts the checkpoint's.
            verify: Check every group against its SHA-256.

        Returns:
            Each group that a partition holds, ascending, to its bytes (a group no
            partition holds has no state and is absent).

        Raises:
            KeyGroupError: A group is outside the operator's key space.
            KeySpaceMismatchError: The operator has no keyed state in the checkpoint, or
                another key-group count than ``key_groups``.
            IntegrityError: A group's bytes (or a partition's index) are damaged; the
                error names the operator, partition and group, the other damaged
                groups in its ``others``.
        """
        cid = await self._id(checkpoint_id)
        context = await self._context()
        return await _keyed.load_key_groups(context, cid, operator, groups, key_groups, verify)

    async def restore_plan(
        self,
        checkpoint_id: CheckpointId | str,
        *,
        workers: int,
        non_keyed: NonKeyedMode | Mapping[str, NonKeyedMode] = "split",
    ) -> RestorePlan:
        """How to restore a checkpoint onto ``workers`` workers, whatever number saved it:
        per worker, the key groups of each keyed operator it gets and the byte range of
        each (object, offset, length, digest), and the old partitions of each other
        operator it gets. Reads the manifest and each keyed partition's range index;
        the plan itself is plain data, to ship to the workers (each reads its part with
        :meth:`load_assignment`).

        Args:
            checkpoint_id: The checkpoint (a short id too).
            workers: How many workers restore it, 1 or more.
            non_keyed: How other operators' partitions are redistributed: ``"split"``
                (dealt round-robin, in ascending order) or ``"union"`` (every worker
                gets all); one mode, or a mode per non-keyed operator.

        Returns:
            The plan (:class:`cairn.format.rescale.RestorePlan`).

        Raises:
            KeyGroupError: ``workers`` is below 1.
            InvalidInputError: ``non_keyed`` is not a mode, or leaves an operator out.
            IntegrityError: A keyed partition's range index is damaged (naming it).
        """
        cid = await self._id(checkpoint_id)
        return await _keyed.restore_plan(await self._context(), cid, workers, non_keyed)

    async def load_assignment(
        self, assignment: KeyedAssignment, *, verify: bool = True
    ) -> dict[int, Buffer]:
        """The state of one worker's groups of one keyed operator, read as a
        :meth:`restore_plan` says: its ranges only, no manifest or index, each verified.

        Args:
            assignment: One worker's part of a plan for one operator
                (``plan.worker(i).keyed[operator]``).
            verify: Check every group against its SHA-256.

        Returns:
            Each group of the assignment that holds state, ascending, to its bytes.

        Raises:
            IntegrityError: A group's bytes are damaged; the error names the operator,
                partition and group.
        """
        return await _keyed.load_assignment(await self._context(), assignment, verify)

    async def load_artifact(self, path: str, *, expected_sha256: str | None = None) -> Buffer:
        """The bytes of an artifact, verified when a digest is given.

        Args:
            path: The artifact's store path.
            expected_sha256: The SHA-256 (hex) its bytes must have; None checks nothing.

        Returns:
            Its bytes.

        Raises:
            IntegrityMismatchError: Its digest differs from ``expected_sha256``.
        """
        return await _read.load_artifact((await self._context()).store, path, expected_sha256)

    async def load_artifact_to(
        self,
        path: str,
        dest: os.PathLike[str] | BinaryIO,
        *,
        expected_sha256: str | None = None,
        chunk_size: int = RESTORE_CHUNK,
        codec: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> str:
        """Stream an object into a file in bounded memory.

        The next ranges are fetched while the current one is hashed and written, on two
        threads. For a path ``dest``, the bytes go to a temporary file beside it that is
        fsynced and renamed into place only once the digest matches ``expected_sha256``:
        on a mismatch nothing appears under the final name. A file object receives the
        bytes as they arrive; then a mismatch is raised after the last write, and the
        caller must discard what it received.

        Args:
            path: The object's store path.
            dest: A file path, or a binary file object open for writing.
            expected_sha256: The SHA-256 (hex) the bytes must have; None checks nothing.
            chunk_size: The size of each ranged read, in bytes.
            codec: An entry's ``codec``, which decodes the stored bytes on the way (the
                digest is that of the decoded bytes); None: stored raw.
            progress: If given, called on the event loop with the stored bytes of each
                range as it is read.

        Returns:
            The SHA-256 (hex) of the bytes written.

        Raises:
            IntegrityMismatchError: The digest differs from ``expected_sha256``.
        """
        return await _download.load_artifact_to(
            await self._context(), path, dest, expected_sha256, chunk_size, codec, progress
        )

    def observed(self, name: str, **attributes: Any) -> AbstractAsyncContextManager[Operation]:
        """Run a block as an operation ``name`` for this checkpointer's observers.

        For tools that compose the public API into an operation of their own (``cairn
        copy`` is ``"copy"``): its store calls and nested operations are reported under
        it.

        Args:
            name: The operation's name.
            **attributes: ``checkpoint_id``, ``epoch``, ``bytes``: what describes it.

        Returns:
            An async context manager; its value is the :class:`~cairn.observe.Operation`.
        """
        return _observed_with(self.observers, name, attributes)

    async def list_checkpoint_dirs(self) -> list[CheckpointId]:
        """Every checkpoint directory under the base, committed or not (a save in
        progress or one that stopped before its commit has one too); see
        :func:`cairn.protocol.discover.checkpoint_dirs`. :meth:`list_checkpoints` lists the
        committed ones.

        Returns:
            Their ids, oldest first.
        """
        return await checkpoint_dirs(self.store, await self.resolve_paths())

    async def load_manifests(self, ids: Sequence[CheckpointId | str]) -> list[ManifestOrDamage]:
        """:meth:`load_manifest` of many checkpoints, read concurrently (see
        :func:`cairn.protocol.discover.load_manifests`). A store failure raises.

        Args:
            ids: The checkpoints (short ids too).

        Returns:
            For each, in the order given, its manifest, or its error in its place where
            it is damaged, gone or written by a newer cairn.
        """
        return await load_manifests(self.load_manifest, [await self._id(cid) for cid in ids])

    async def restore_directory(
        self,
        checkpoint_id: CheckpointId,
        operator: str,
        partition: int,
        dest: os.PathLike[str] | str,
    ) -> list[FileEntry]:
        """Write a directory partition into a local directory.

        Every file (uploaded or carried) is verified against its size and SHA-256 while
        it is written into a staging directory beside ``dest``; each is fsynced, and the
        staging directory is renamed onto ``dest`` only once all of them verified. On any
        failure ``dest`` is left as it was.

        Args:
            checkpoint_id: The checkpoint.
            operator: The partition's operator.
            partition: The partition.
            dest: The directory to write: it must not exist, or be empty.

        Returns:
            The partition's files.

        Raises:
            InvalidInputError: ``dest`` exists and is not an empty directory.
            IntegrityMismatchError: A file's bytes differ; the message names it.
            BrokenChainError: A file is gone; the message names it.
            CheckpointNotFoundError: The checkpoint has no such directory partition.
        """
        check_id(checkpoint_id)
        async with self.observed("restore_directory", checkpoint_id=checkpoint_id):
            return await _directories.restore_directory(
                await self._context(), checkpoint_id, operator, partition, dest
            )
