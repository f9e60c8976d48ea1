"""The checkpointer: the reference's interface, and its implementation over an object store.

The commit protocol of :meth:`ObjectStoreCheckpointer.save`:

1. check that no newer writer generation has taken over (fencing, see :mod:`cairn._pointer`);
2. upload every snapshot, delta and source offset under ``{base}{id}/``, concurrently
   (at most ``max_concurrent_uploads`` in flight), hashing each while it uploads;
3. write ``{base}{id}/manifest.json`` only if absent: **this single write is the commit**;
4. advance ``_latest`` by compare-and-swap, only forwards, only if not fenced.

Invariants:

* before step 3 the checkpoint does not exist for any reader (listing and loading go
  through the manifest); after it, it is immutable: the manifest is never overwritten
  and artifacts are not rewritten once a manifest exists;
* a create that meets "already exists" (as when a timed-out write did land and is
  retried) is resolved by reading the manifest back: byte-identical means our commit
  happened, anything else raises :class:`CheckpointExistsError`;
* every read verifies SHA-256 against the manifest unless told not to;
* deletion removes the manifest first, so a half-deleted checkpoint is never listed;
* every store call goes through :class:`~cairn.retry.RetryingStore`, which retries only
  transient failures, with the checkpointer's :class:`~cairn.retry.RetryPolicy`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar

import msgspec
from obstore.store import ObjectStore

from cairn import _lease, _pointer
from cairn._buffer import Buffer
from cairn._concurrency import bounded_gather
from cairn.codecs import StreamDecoder, get_codec
from cairn.data import ArtifactKey, ChainLink, CheckpointData, LoadedCheckpoint
from cairn.errors import (
    BrokenChainError,
    CheckpointAbortedError,
    CheckpointerError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptManifestError,
    FencedError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidCheckpointDataError,
    InvalidInputError,
    ObjectExistsError,
    StoreError,
)
from cairn.ids import CheckpointId
from cairn.integrity import INLINE_HASH_LIMIT, sha256_hex, sha256_hex_async, verify_integrity
from cairn.layout import CheckpointPaths, validate_name, validate_partition
from cairn.manifest import (
    CheckpointManifest,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SourceOffsetEntry,
    check_manifest,
    dec_hook,
    decode_manifest,
    encode_manifest,
)
from cairn.retention import GcResult, RetentionPolicy, run_gc
from cairn.retry import RetryingStore, RetryPolicy
from cairn.sources import READ_CHUNK, ArtifactData, StreamSource, as_buffer, check_artifact_data
from cairn.stores import Store, as_store

__all__ = ["Checkpointer", "ObjectStoreCheckpointer", "PartitionUpload"]

log = logging.getLogger("cairn")
T = TypeVar("T")

PartitionUpload = tuple[str, int, bool, ArtifactData]
"""``(operator, partition, is_delta, data)`` for :meth:`save_partitions_concurrent`."""


class Checkpointer(abc.ABC):
    """The checkpointer interface (the reference's trait), for engines and test doubles."""

    @abc.abstractmethod
    async def save_manifest(self, manifest: CheckpointManifest) -> None:
        """Write a manifest to the checkpoint store: commits that checkpoint."""

    @abc.abstractmethod
    async def load_manifest(self, checkpoint_id: CheckpointId) -> CheckpointManifest:
        """Load a manifest by checkpoint id."""

    @abc.abstractmethod
    async def save_snapshot(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Write a state snapshot for one operator partition; returns its SHA-256 hex."""

    @abc.abstractmethod
    async def save_delta(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Write an incremental delta for one operator partition; returns its SHA-256 hex."""

    @abc.abstractmethod
    async def load_artifact(self, path: str, *, expected_sha256: str | None = None) -> Buffer:
        """Load a snapshot or delta by store path, verifying it when a digest is given."""

    @abc.abstractmethod
    async def update_latest(self, checkpoint_id: CheckpointId, *, force: bool = False) -> bool:
        """Point ``_latest`` at a committed checkpoint; returns whether it moved."""

    @abc.abstractmethod
    async def read_latest(self) -> CheckpointId | None:
        """The checkpoint ``_latest`` names, or None when there is none."""

    @abc.abstractmethod
    async def list_checkpoints(self) -> list[CheckpointId]:
        """Every committed checkpoint id, oldest first."""

    @abc.abstractmethod
    async def delete_checkpoint(self, checkpoint_id: CheckpointId) -> None:
        """Delete a checkpoint and all its artifacts; a missing one is not an error."""

    @abc.abstractmethod
    async def save(self, data: CheckpointData) -> CheckpointManifest:
        """Upload, commit and publish one checkpoint atomically."""

    @abc.abstractmethod
    async def load(self, checkpoint_id: CheckpointId, *, verify: bool = True) -> LoadedCheckpoint:
        """Load a committed checkpoint with every artifact, verified."""

    @abc.abstractmethod
    async def load_latest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that loads and verifies, or None when there is none."""


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be an int >= 1, got {value!r}")
    return value


class ObjectStoreCheckpointer(Checkpointer):
    """Production checkpointer over any object store.

    ``store`` is an obstore store, a :class:`~cairn.stores.Store`, or a URL opened with
    :func:`~cairn.open_store`. Uploads run at most ``max_concurrent_uploads`` at a time
    and downloads at most ``max_concurrent_downloads``; transient store failures are
    retried per ``retry``. With ``compression="zstd"`` artifacts are stored compressed
    (see :mod:`cairn.codecs`); readers decompress whatever each entry records. A save in
    progress holds a ``lease`` on its directory, renewed every third of it, that keeps
    GC away however long the save runs (see :mod:`cairn._lease`).
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
        lease: dt.timedelta = _lease.DEFAULT_LEASE,
    ) -> None:
        self.paths = paths if paths is not None else CheckpointPaths()
        self.codec = get_codec(compression) if compression is not None else None
        if not isinstance(self.paths, CheckpointPaths):
            raise InvalidInputError(f"paths must be a CheckpointPaths, got {paths!r}")
        self.max_concurrent_uploads = _positive_int(
            "max_concurrent_uploads", max_concurrent_uploads
        )
        self.max_concurrent_downloads = _positive_int(
            "max_concurrent_downloads", max_concurrent_downloads
        )
        if not isinstance(lease, dt.timedelta) or lease <= dt.timedelta(0):
            raise InvalidInputError(f"lease must be a positive timedelta, got {lease!r}")
        self.lease = lease
        self.retry = retry if retry is not None else RetryPolicy()
        self.store: Store = RetryingStore(as_store(store), self.retry)
        self.writer_generation = 0

    def __repr__(self) -> str:
        return f"ObjectStoreCheckpointer({self.store!r}, {self.paths!r})"

    # -- the reference's methods ---------------------------------------------------------

    async def save_manifest(self, manifest: CheckpointManifest) -> None:
        """Commit ``manifest``: write it only if no manifest exists for its id.

        Raises :class:`CheckpointExistsError` if a different manifest is committed there
        (an identical one means this commit already happened), and :class:`FencedError`
        if a newer writer has taken over.
        """
        if not isinstance(manifest, CheckpointManifest):
            raise InvalidInputError(f"expected a CheckpointManifest, got {manifest!r}")
        try:
            check_manifest(manifest)
        except InvalidInputError as exc:
            raise InvalidInputError(f"manifest {manifest.checkpoint_id}: {exc}") from None
        await _pointer.check_not_fenced(
            self.store, self.paths.writer_record(), self.writer_generation
        )
        path = self.paths.manifest(manifest.checkpoint_id)
        body = encode_manifest(manifest)
        try:
            await self.store.put(path, body, mode="create")
        except ObjectExistsError:
            existing = await self.store.get(path)
            if bytes(existing.data) == _lease.TOMBSTONE:
                raise CheckpointAbortedError(str(manifest.checkpoint_id), path) from None
            if bytes(existing.data) != body:
                raise CheckpointExistsError(str(manifest.checkpoint_id), path) from None
            log.info("manifest %s was already written by this commit (retried write)", path)

    async def exists(self, checkpoint_id: CheckpointId) -> bool:
        """True when ``checkpoint_id`` is committed (one HEAD of its manifest)."""
        _check_id(checkpoint_id)
        return await self._manifest_exists(checkpoint_id)

    async def load_manifest(self, checkpoint_id: CheckpointId) -> CheckpointManifest:
        """Load and check the manifest of ``checkpoint_id``.

        Raises :class:`CheckpointNotFoundError` if it is not committed and
        :class:`CorruptManifestError` if the bytes there are not its valid manifest.
        """
        _check_id(checkpoint_id)
        path = self.paths.manifest(checkpoint_id)
        try:
            blob = await self.store.get(path)
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

    async def save_snapshot(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Upload the full state of one partition of an uncommitted checkpoint."""
        [(_, entry)] = await self.save_partitions_concurrent(
            checkpoint_id, [(operator, partition, False, data)]
        )
        return entry.sha256

    async def save_delta(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Upload an incremental delta of one partition of an uncommitted checkpoint."""
        [(_, entry)] = await self.save_partitions_concurrent(
            checkpoint_id, [(operator, partition, True, data)]
        )
        return entry.sha256

    async def load_artifact(self, path: str, *, expected_sha256: str | None = None) -> Buffer:
        """The bytes at store ``path``, verified against ``expected_sha256`` when given."""
        if not isinstance(path, str) or not path:
            raise InvalidInputError(f"artifact path must be a non-empty string, got {path!r}")
        blob = await self.store.get(path)
        if expected_sha256 is not None:
            await asyncio.to_thread(verify_integrity, path, blob.data, expected_sha256)
        return blob.data

    async def load_artifact_to(
        self,
        path: str,
        dest: os.PathLike[str] | BinaryIO,
        *,
        expected_sha256: str | None = None,
        chunk_size: int = READ_CHUNK,
        codec: str | None = None,
    ) -> str:
        """Stream the object at ``path`` into ``dest`` in bounded memory; returns its SHA-256.

        Reads in ranges of ``chunk_size`` (the next range is fetched while the current
        one is written), hashing as it goes. For a path ``dest``, the bytes go to a
        temporary file beside it that is fsynced and renamed into place only once the
        digest matches ``expected_sha256``: on a mismatch nothing appears under the final
        name and :class:`IntegrityMismatchError` is raised. A file object receives the
        bytes as they arrive; then a mismatch is raised after the last write, and the
        caller must discard what it received. ``codec`` (an entry's ``codec``) decodes
        the stored bytes on the way; the digest is that of the decoded bytes.
        """
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise InvalidInputError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        decoder = get_codec(codec, path=path).decoder() if codec is not None else None
        size = (await self.store.head(path)).size
        if isinstance(dest, os.PathLike):
            return await _write_atomically(
                Path(dest),
                lambda file: self._stream_into(path, size, file, chunk_size, decoder),
                path,
                expected_sha256,
            )
        digest = await self._stream_into(path, size, dest, chunk_size, decoder)
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise IntegrityMismatchError(path, expected_sha256, digest)
        return digest

    async def _stream_into(
        self,
        path: str,
        size: int,
        file: BinaryIO,
        chunk_size: int,
        decoder: StreamDecoder | None = None,
    ) -> str:
        """Copy ``path`` into ``file`` by ranged reads, one range fetched ahead; its digest."""
        hasher = hashlib.sha256()

        def fetch(start: int) -> asyncio.Future[Buffer] | None:
            if start >= size:
                return None
            end = min(start + chunk_size, size)
            return asyncio.ensure_future(self.store.get_range(path, start, end))

        upcoming = fetch(0)
        try:
            for start in range(0, size, chunk_size):
                current, upcoming = upcoming, fetch(start + chunk_size)
                assert current is not None
                chunk = await current
                await asyncio.to_thread(_hash_and_write, hasher, file, chunk, decoder)
        finally:
            if upcoming is not None:
                upcoming.cancel()
        return hasher.hexdigest()

    async def update_latest(self, checkpoint_id: CheckpointId, *, force: bool = False) -> bool:
        """Point ``_latest`` at committed ``checkpoint_id``, by compare-and-swap.

        Only moves forwards (to a greater epoch, then id) unless ``force``; returns
        whether it moved. Raises :class:`CheckpointNotFoundError` for an uncommitted id
        and :class:`FencedError` when a newer writer owns the store.
        """
        manifest = await self.load_manifest(checkpoint_id)
        return await _pointer.advance_latest(
            self.store,
            self.paths.latest_pointer(),
            checkpoint_id,
            manifest.epoch,
            self.writer_generation,
            force=force,
        )

    async def read_latest(self) -> CheckpointId | None:
        """The id ``_latest`` names; None when it is absent (or unreadable, with a warning)."""
        pointer, _, _ = await _pointer.read_pointer(self.store, self.paths.latest_pointer())
        return pointer.checkpoint_id if pointer is not None else None

    async def list_checkpoints(self) -> list[CheckpointId]:
        """Committed checkpoints, oldest first.

        One delimiter listing of the base, then one HEAD per listed directory for its
        manifest: the cost grows with the number of checkpoints, not of their artifacts.
        """
        listing = await self.store.list_dir(self.paths.base_prefix)
        candidates = sorted(
            cid
            for prefix in listing.prefixes
            if (cid := self.paths.parse_checkpoint_dir(prefix)) is not None
        )

        def probe(cid: CheckpointId) -> Callable[[], Awaitable[bool]]:
            return lambda: self._manifest_exists(cid)

        found = await bounded_gather(self.max_concurrent_downloads, map(probe, candidates))
        return [cid for cid, ok in zip(candidates, found, strict=True) if ok]

    async def delete_checkpoint(self, checkpoint_id: CheckpointId) -> None:
        """Delete every object of ``checkpoint_id``, the manifest first."""
        _check_id(checkpoint_id)
        await self.store.delete([self.paths.manifest(checkpoint_id)])
        await self.store.delete_prefix(self.paths.checkpoint_dir(checkpoint_id))

    async def save_partitions_concurrent(
        self,
        checkpoint_id: CheckpointId,
        uploads: Sequence[PartitionUpload],
        *,
        metadata_key: str | None = None,
    ) -> list[tuple[str, PartitionSnapshotEntry]]:
        """Upload partitions of an uncommitted checkpoint concurrently, with their digests.

        At most ``max_concurrent_uploads`` uploads are in flight; digests are computed
        off the event loop. On the first failure no further upload starts, and the error
        is raised once those in flight have ended. Writes no manifest. Raises
        :class:`CheckpointExistsError` if the checkpoint is already committed (committed
        checkpoints are immutable). With ``metadata_key``, each artifact is hashed before
        it is sent and its digest stored as that user-metadata key (see
        :mod:`cairn.distributed`). The uploads hold the checkpoint's lease while they run;
        it lapses ``lease`` after they end unless the checkpoint is committed first.
        """
        _check_id(checkpoint_id)
        checked = _check_uploads(uploads)
        await self._refuse_if_committed(checkpoint_id)
        jobs = [
            self._upload_job(checkpoint_id, op, part, is_delta, data, metadata_key)
            for op, part, is_delta, data in checked
        ]
        async with self._lease(checkpoint_id, None):
            return await bounded_gather(self.max_concurrent_uploads, jobs)

    # -- the commit protocol -------------------------------------------------------------

    async def take_over(self) -> int:
        """Become the writer of this store, fencing every earlier writer.

        Raises the writer generation recorded in the store by one and claims ``_latest``
        for it. From then on a checkpointer of an older generation cannot commit:
        its ``save`` raises :class:`FencedError`. Returns the new generation.
        """
        self.writer_generation = await _pointer.take_over(
            self.store, self.paths.writer_record(), self.paths.latest_pointer()
        )
        return self.writer_generation

    async def save(self, data: CheckpointData) -> CheckpointManifest:
        """Upload every artifact, commit the manifest, and advance ``_latest``.

        With a ``parent_id``, every partition of the parent that ``data`` does not mention
        is carried over by reference (not uploaded again), and each delta is appended to
        the parent's chain for its partition. Returns the committed manifest. Nothing of
        the checkpoint is visible unless this returns (or fails after the commit point,
        as with :class:`FencedError` from the pointer update, in which case the manifest
        is rolled back). The save holds a lease on its directory from its first write to
        its commit; if GC claimed the id anyway (the lease lapsed, for instance because
        the process stalled), it raises :class:`CheckpointAbortedError` and commits
        nothing. A write whose reply was lost is resolved by reading back: a manifest
        that landed counts as committed (the save returns), and a pointer swap that runs
        out of retries after the commit leaves ``_latest`` behind (a hint: readers fall
        back to listing) but does not fail the save. One case stays open: if the store
        keeps failing so that the outcome cannot be learnt (the manifest cannot be read
        back, or the fence checked after a failed swap), that :class:`StoreError`
        propagates and the checkpoint may be committed (:meth:`exists` tells).
        """
        if not isinstance(data, CheckpointData):
            raise InvalidInputError(f"save takes a CheckpointData, got {data!r}")
        cid = data.id
        record = await _pointer.check_not_fenced(
            self.store, self.paths.writer_record(), self.writer_generation
        )
        await self._refuse_if_committed(cid)
        # The lease's intent names the parent before anything else is read or written, so
        # a concurrent GC keeps the parent's chain and this directory while the save runs.
        async with self._lease(cid, data.parent_id):
            try:
                entries = await self._upload_all(data, record)
            except BaseException:
                await self._discard_uncommitted(cid)
                raise
            manifest = self._build_manifest(data, entries)
            await self._write_manifest(manifest)
        return await self._publish(manifest)

    async def _upload_all(
        self, data: CheckpointData, record: _pointer.WriterRecord
    ) -> list[tuple[str, PartitionSnapshotEntry]]:
        """Upload what ``data`` holds; its entries, with those carried from the parent."""
        cid = data.id
        inherited: dict[ArtifactKey, list[tuple[str, PartitionSnapshotEntry]]] = {}
        if data.parent_id is not None:
            inherited = await self._carried_chains(data, record)
        uploads: list[PartitionUpload] = [
            *((op, p, False, buf) for (op, p), buf in data.snapshots.items()),
            *((op, p, True, buf) for (op, p), buf in data.deltas.items()),
        ]
        jobs: list[Callable[[], Awaitable[tuple[str, PartitionSnapshotEntry] | None]]] = [
            self._upload_job(cid, op, p, is_delta, buf) for op, p, is_delta, buf in uploads
        ]
        jobs += [self._offset_job(cid, src, entry) for src, entry in data.source_offsets.items()]
        results = await bounded_gather(self.max_concurrent_uploads, jobs)
        entries = [link for links in inherited.values() for link in links]
        entries += [r for r in results if r is not None]
        return entries

    async def commit(self, manifest: CheckpointManifest) -> CheckpointManifest:
        """Commit an uploaded checkpoint: write its manifest, then advance ``_latest``.

        The second half of :meth:`save`, for callers that upload the artifacts
        themselves. Every artifact the manifest names must be in the store (else
        :class:`BrokenChainError`, and nothing is committed). If the manifest write fails
        before the commit point, what was uploaded for the checkpoint is removed; if GC
        claimed the id first, :class:`CheckpointAbortedError`; if a newer writer
        generation has taken over by the time ``_latest`` is swapped, the manifest is
        rolled back and :class:`FencedError` raised.
        """
        await self._write_manifest(manifest)
        return await self._publish(manifest)

    async def _write_manifest(self, manifest: CheckpointManifest) -> None:
        """The commit point: check every artifact is there, then create the manifest."""
        cid = manifest.checkpoint_id
        try:
            try:
                await self._check_artifacts_present(manifest)
            except BrokenChainError:
                await self._raise_if_claimed(cid)
                raise
            await self.save_manifest(manifest)
        except (CheckpointExistsError, CheckpointAbortedError):
            raise
        except StoreError as exc:
            # The retries ran out, but an attempt may have landed with its reply lost: our
            # own bytes at the manifest path mean the commit happened, so go on as
            # committed. (If this read fails too, its error propagates: the outcome is
            # unknown, and nothing is discarded.)
            if await self._manifest_is(cid, encode_manifest(manifest)):
                log.warning("manifest of %s landed although its write failed (%s)", cid, exc)
                return
            await self._discard_uncommitted(cid)
            raise
        except BaseException:
            # Only discard when the manifest surely did not land.
            if not await self._manifest_exists(cid):
                await self._discard_uncommitted(cid)
            raise

    async def _publish(self, manifest: CheckpointManifest) -> CheckpointManifest:
        """After the commit: end the lease, then advance ``_latest`` (or roll back if fenced)."""
        cid = manifest.checkpoint_id
        try:
            await self.store.delete([self.paths.intent(cid)])
        except CheckpointerError as exc:  # GC removes a committed checkpoint's intent too
            log.info("could not remove the intent of committed %s: %s", cid, exc)
        try:
            try:
                await _pointer.advance_latest(
                    self.store,
                    self.paths.latest_pointer(),
                    cid,
                    manifest.epoch,
                    self.writer_generation,
                )
            except StoreError as exc:
                # The checkpoint is committed; _latest is only a hint (readers fall back to
                # listing), so a swap that ran out of retries does not fail the save. But
                # the swap is where a takeover is noticed: check the fence instead.
                await _pointer.check_not_fenced(
                    self.store, self.paths.writer_record(), self.writer_generation
                )
                log.warning("checkpoint %s is committed, _latest not advanced: %s", cid, exc)
        except FencedError:
            log.warning("checkpoint %s was fenced after its commit: rolling it back", cid)
            await self.delete_checkpoint(cid)
            raise
        return manifest

    async def _manifest_is(self, cid: CheckpointId, body: bytes) -> bool:
        """True when the manifest stored for ``cid`` is exactly ``body``."""
        try:
            blob = await self.store.get(self.paths.manifest(cid))
        except CheckpointNotFoundError:
            return False
        return bytes(blob.data) == body

    async def _raise_if_claimed(self, cid: CheckpointId) -> None:
        """Raise :class:`CheckpointAbortedError` if GC has claimed ``cid``."""
        path = self.paths.manifest(cid)
        try:
            info = await self.store.head(path)
        except CheckpointNotFoundError:
            return
        if _lease.is_tombstone(info):
            raise CheckpointAbortedError(str(cid), path)

    async def _check_artifacts_present(self, manifest: CheckpointManifest) -> None:
        """Raise :class:`BrokenChainError` unless every entry's object is in the store.

        One listing per directory that holds entries (this checkpoint's, and those of the
        checkpoints it carries entries from), sizes checked, so that a manifest is never
        written over artifacts that are gone.
        """
        cid = manifest.checkpoint_id
        wanted: dict[str, dict[str, int]] = {}
        for _, entry in manifest.partition_entries():
            owner = entry.owner or cid
            stored = entry.stored_size_bytes if entry.codec is not None else None
            wanted.setdefault(self.paths.checkpoint_dir(owner), {})[
                self.paths.resolve(owner, entry.path)
            ] = stored if stored is not None else entry.size_bytes

        def check(directory: str) -> Callable[[], Awaitable[None]]:
            async def job() -> None:
                present = {info.path: info.size for info in await self.store.list(directory)}
                for path, size in wanted[directory].items():
                    if present.get(path) != size:
                        found = "missing" if path not in present else f"{present[path]} bytes"
                        raise BrokenChainError(
                            path,
                            f"{found} at commit time (expected {size} bytes): "
                            f"checkpoint {cid} is not committed",
                        )

            return job

        await bounded_gather(self.max_concurrent_downloads, map(check, wanted))

    async def load(self, checkpoint_id: CheckpointId, *, verify: bool = True) -> LoadedCheckpoint:
        """Load a committed checkpoint: manifest, every artifact (verified), source offsets.

        Raises :class:`IntegrityMismatchError` naming the artifact whose digest differs,
        and :class:`BrokenChainError` naming the link when an artifact or parent that a
        partition's chain needs is gone.
        """
        manifest = await self.load_manifest(checkpoint_id)
        resolved = await self._resolve_chains(manifest, set())
        flat = [(key, owner, entry) for key, links in resolved.items() for owner, entry in links]
        blobs = await bounded_gather(
            self.max_concurrent_downloads,
            [self._fetch_link(owner, entry, verify) for _, owner, entry in flat],
        )
        chains: dict[ArtifactKey, list[ChainLink]] = {}
        for (key, owner, entry), blob in zip(flat, blobs, strict=True):
            chains.setdefault(key, []).append(ChainLink(entry=entry, owner=owner, data=blob))
        return LoadedCheckpoint(
            manifest=manifest,
            artifacts={key: links[-1].data for key, links in chains.items()},
            source_offsets=dict(manifest.source_offsets),
            chains=chains,
        )

    async def load_chain(
        self, checkpoint_id: CheckpointId, operator: str, partition: int
    ) -> list[ChainLink]:
        """What rebuilds one partition: its base snapshot, then every delta in order.

        Each link is verified. Raises :class:`BrokenChainError` naming the missing link
        (parent, base or artifact), :class:`IntegrityMismatchError` naming the artifact
        whose digest differs, and :class:`CheckpointNotFoundError` if the checkpoint has
        no state for that partition.
        """
        key = (validate_name("operator", operator), validate_partition(partition))
        manifest = await self.load_manifest(checkpoint_id)
        resolved = await self._resolve_chains(manifest, set())
        if key not in resolved:
            raise CheckpointNotFoundError(
                self.paths.checkpoint_dir(checkpoint_id), f"partition {key!r} in checkpoint"
            )
        links = resolved[key]
        blobs = await bounded_gather(
            self.max_concurrent_downloads,
            [self._fetch_link(owner, entry, True) for owner, entry in links],
        )
        return [
            ChainLink(entry=entry, owner=owner, data=blob)
            for (owner, entry), blob in zip(links, blobs, strict=True)
        ]

    async def load_latest(self) -> LoadedCheckpoint | None:
        """The newest committed checkpoint that loads and verifies, or None if there is none.

        Tries the committed checkpoints in the order of :meth:`_latest_candidates`: what
        ``_latest`` names, unless a checkpoint committed after it outranks it (its writer
        stopped between its commit and its pointer swap); then every committed checkpoint
        ranked by writer generation, epoch and id. A checkpoint committed by a fenced
        writer after the takeover never counts (see :mod:`cairn._pointer`). Each one that
        does not load (a deleted or damaged manifest or artifact) is logged and skipped.
        """
        async for cid in self._latest_candidates():
            try:
                return await self.load(cid)
            except _DAMAGE as exc:
                log.warning("checkpoint %s does not load (%s): trying the next one", cid, exc)
        return None

    async def latest_id(self) -> CheckpointId | None:
        """What "latest" means: the checkpoint :meth:`load_latest` tries first, by manifest.

        The same order as :meth:`load_latest`, skipping checkpoints whose manifest does
        not read, without reading artifacts: a checkpoint whose artifacts are damaged is
        still the latest here (so ``cairn verify latest`` reports it), while
        :meth:`load_latest` moves on to an older one. None when nothing is committed.
        """
        async for cid in self._latest_candidates():
            try:
                await self.load_manifest(cid)
            except _DAMAGE as exc:
                log.warning("checkpoint %s has no readable manifest (%s)", cid, exc)
                continue
            return cid
        return None

    async def gc(
        self,
        policy: RetentionPolicy,
        *,
        dry_run: bool = False,
        min_age: dt.timedelta = dt.timedelta(hours=1),
    ) -> GcResult:
        """Delete the checkpoints ``policy`` does not keep, and sweep orphans.

        Never deletes the checkpoint ``_latest`` names, a retained or pinned one, or any
        artifact reachable from one; uncommitted objects younger than ``min_age`` may be
        a save in progress and are left alone. With ``dry_run`` nothing is deleted and
        the result says what would be. See :mod:`cairn.retention`. A pinned id that does
        not exist and a negative ``min_age`` raise :class:`InvalidInputError`.
        """
        return await run_gc(self.store, self.paths, policy, dry_run=dry_run, min_age=min_age)

    # -- internals -----------------------------------------------------------------------

    def _lease(
        self, cid: CheckpointId, parent_id: CheckpointId | None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return _lease.hold_lease(self.store, self.paths.intent(cid), parent_id, self.lease)

    def _fetch_link(
        self, owner: CheckpointId, entry: PartitionSnapshotEntry, verify: bool
    ) -> Callable[[], Awaitable[Buffer]]:
        path = self.paths.resolve(owner, entry.path)

        async def job() -> Buffer:
            try:
                if entry.codec is None:
                    return await self.load_artifact(
                        path, expected_sha256=entry.sha256 if verify else None
                    )
                codec = get_codec(entry.codec, path=path)
                stored = await self.load_artifact(path)
            except CheckpointNotFoundError:
                raise BrokenChainError(path, f"artifact of checkpoint {owner} is gone") from None
            try:
                data = await asyncio.to_thread(codec.decompress, stored)
            except Exception as exc:  # the codec's own error type: the bytes are damaged
                raise IntegrityMismatchError(
                    path, entry.sha256, f"undecodable {entry.codec} data ({exc})"
                ) from None
            if verify:
                await asyncio.to_thread(verify_integrity, path, data, entry.sha256)
            return data

        return job

    async def _resolve_chains(
        self, manifest: CheckpointManifest, visiting: set[CheckpointId]
    ) -> dict[ArtifactKey, list[tuple[CheckpointId, PartitionSnapshotEntry]]]:
        """Each partition's restore chain, as ``(owner, entry)`` links, base first.

        cairn writes whole chains into every manifest. A manifest written the reference's
        way lists only its own deltas; their base is found by walking ``parent_id``.
        """
        cid = manifest.checkpoint_id
        chains: dict[ArtifactKey, list[tuple[CheckpointId, PartitionSnapshotEntry]]] = {}
        for operator, entry in manifest.partition_entries():
            link = (entry.owner or cid, entry)
            chains.setdefault((operator, entry.partition_id), []).append(link)
        headless = [key for key, links in chains.items() if links[0][1].is_delta]
        if not headless:
            return chains
        parent_chains = await self._parent_chains(manifest, visiting)
        for key in headless:
            if key not in parent_chains:
                raise BrokenChainError(
                    f"{cid} {key!r}", f"no base: parent {manifest.parent_id} has no state for it"
                )
            chains[key] = parent_chains[key] + chains[key]
        return chains

    async def _parent_chains(
        self, manifest: CheckpointManifest, visiting: set[CheckpointId]
    ) -> dict[ArtifactKey, list[tuple[CheckpointId, PartitionSnapshotEntry]]]:
        cid, parent = manifest.checkpoint_id, manifest.parent_id
        if parent is None:
            raise BrokenChainError(str(cid), "it holds deltas but has no parent")
        if parent in visiting:
            raise BrokenChainError(str(parent), "the parent chain loops")
        try:
            parent_manifest = await self.load_manifest(parent)
        except CheckpointNotFoundError:
            raise BrokenChainError(
                f"parent {parent} of {cid}", "the parent checkpoint is missing"
            ) from None
        return await self._resolve_chains(parent_manifest, visiting | {cid})

    async def _carried_chains(
        self, data: CheckpointData, record: _pointer.WriterRecord
    ) -> dict[ArtifactKey, list[tuple[str, PartitionSnapshotEntry]]]:
        """The parent's links that the new checkpoint keeps, as entries owned elsewhere.

        Partitions the new checkpoint does not mention keep the parent's whole chain;
        a delta extends it; a new snapshot replaces it. A parent committed by a fenced
        writer after the takeover is refused (see :mod:`cairn._pointer`).
        """
        assert data.parent_id is not None
        parent = await self.load_manifest(data.parent_id)
        generation = parent.writer_generation or 0
        if not record.admits(generation, (parent.epoch, parent.checkpoint_id.uuid.int)):
            raise InvalidCheckpointDataError(
                f"parent {data.parent_id} was committed by writer generation {generation} "
                f"after generation {record.generation} took over (a fenced writer's "
                "checkpoint): it is not one to build upon"
            )
        parent_chains = await self._resolve_chains(parent, set())
        missing_base = sorted(set(data.deltas) - set(parent_chains))
        if missing_base:
            raise InvalidCheckpointDataError(
                f"delta {missing_base[0]!r} has no base: parent {data.parent_id} "
                "holds no state for that partition"
            )
        return {
            key: [(key[0], msgspec.structs.replace(entry, owner=owner)) for owner, entry in links]
            for key, links in parent_chains.items()
            if key not in data.snapshots
        }

    def _upload_job(
        self,
        cid: CheckpointId,
        operator: str,
        partition: int,
        is_delta: bool,
        data: ArtifactData,
        metadata_key: str | None = None,
    ) -> Callable[[], Awaitable[tuple[str, PartitionSnapshotEntry]]]:
        relative = self.paths.relative_artifact(operator, partition, is_delta)
        path = self.paths.resolve(cid, relative)
        buffer = as_buffer(data, f"artifact {path!r}")

        async def job() -> tuple[str, PartitionSnapshotEntry]:
            if buffer is None:
                encoder = self.codec.encoder if self.codec is not None else None
                source = StreamSource(data, encoder=encoder, what=f"artifact {path!r}")
                digest = await self._upload_stream(path, source, metadata_key)
                size, stored_size = source.size, source.stored_size
            elif self.codec is not None:
                digest, stored_size = await self._upload_compressed(path, buffer, metadata_key)
                size = buffer.nbytes
            else:
                digest, size = await self._upload_buffer(path, buffer, metadata_key), buffer.nbytes
            entry = PartitionSnapshotEntry(
                partition_id=partition,
                is_delta=is_delta,
                path=relative,
                size_bytes=size,
                sha256=digest,
                codec=self.codec.name if self.codec is not None else None,
                stored_size_bytes=stored_size if self.codec is not None else None,
            )
            return operator, entry

        return job

    async def _upload_compressed(
        self, path: str, data: memoryview, metadata_key: str | None
    ) -> tuple[str, int]:
        """Compress and hash one buffer in threads, then upload it; (digest, stored size)."""
        assert self.codec is not None
        digest, stored = await asyncio.gather(
            sha256_hex_async(data), asyncio.to_thread(self.codec.compress, data)
        )
        metadata = {metadata_key: digest} if metadata_key is not None else None
        await self.store.put(path, stored, metadata=metadata)
        return digest, len(stored)

    async def _upload_buffer(self, path: str, data: memoryview, metadata_key: str | None) -> str:
        """Upload one buffer; returns its digest."""
        if metadata_key is None and data.nbytes > INLINE_HASH_LIMIT:
            # Hash in a thread while the bytes travel.
            digest, _ = await asyncio.gather(sha256_hex_async(data), self.store.put(path, data))
        elif metadata_key is None:
            # Small: hashing inline is cheaper than the two tasks gather would create.
            digest = sha256_hex(data)
            await self.store.put(path, data)
        else:  # the digest must be known before the request: it goes in its headers
            digest = await sha256_hex_async(data)
            await self.store.put(path, data, metadata={metadata_key: digest})
        return digest

    async def _upload_stream(
        self, path: str, source: StreamSource, metadata_key: str | None
    ) -> str:
        """Upload a file or stream in parts, hashing each chunk; returns its digest."""
        metadata = None
        if metadata_key is not None:
            if not source.reopenable:
                raise InvalidInputError(
                    f"{path!r}: a one-shot stream cannot carry its digest as metadata "
                    "(it is needed before the upload starts): pass bytes or a file"
                )
            async for _ in source.open():  # a first pass, only to learn the digest
                pass
            metadata = {metadata_key: source.sha256}
        await self.store.put_stream(path, source.open, metadata=metadata)
        return source.sha256

    def _offset_job(
        self, cid: CheckpointId, source: str, entry: SourceOffsetEntry
    ) -> Callable[[], Awaitable[None]]:
        path = self.paths.source_offset(cid, source)
        body = msgspec.json.format(msgspec.json.encode(entry), indent=2)

        async def job() -> None:
            await self.store.put(path, body)

        return job

    def _build_manifest(
        self, data: CheckpointData, entries: list[tuple[str, PartitionSnapshotEntry]]
    ) -> CheckpointManifest:
        per_operator: dict[str, list[PartitionSnapshotEntry]] = {}
        for operator, entry in entries:
            per_operator.setdefault(operator, []).append(entry)
        operators = {
            op: OperatorSnapshotEntry.from_partitions(parts) for op, parts in per_operator.items()
        }
        base = CheckpointManifest.new(data.id, data.epoch)
        if data.timestamp_ms is not None:  # a copy keeps its original's time
            base = msgspec.structs.replace(base, timestamp_ms=data.timestamp_ms)
        return msgspec.structs.replace(
            base,
            operators=operators,
            source_offsets=dict(data.source_offsets),
            parent_id=data.parent_id,
            watermark=data.watermark,
            total_size_bytes=sum(op.total_bytes for op in operators.values()),
            writer_generation=self.writer_generation or None,
        )

    async def _manifest_exists(self, cid: CheckpointId) -> bool:
        """True when ``cid`` is committed: its manifest exists and is not a tombstone."""
        try:
            info = await self.store.head(self.paths.manifest(cid))
        except CheckpointNotFoundError:
            return False
        return not _lease.is_tombstone(info)

    async def _refuse_if_committed(self, cid: CheckpointId) -> None:
        if await self._manifest_exists(cid):
            raise CheckpointExistsError(str(cid), self.paths.manifest(cid))

    async def _discard_uncommitted(self, cid: CheckpointId) -> None:
        """Best effort: remove what a failed save uploaded. Orphans left here are GC's job."""
        try:
            await self.store.delete_prefix(self.paths.checkpoint_dir(cid))
        except (CheckpointerError, asyncio.CancelledError) as exc:
            log.info("could not clean up after failed save of %s: %s", cid, exc)

    async def _latest_candidates(self) -> AsyncIterator[CheckpointId]:
        """Committed checkpoints, in the order :meth:`load_latest` tries them.

        First what ``_latest`` names, if no admitted checkpoint committed after it
        outranks it. Then the ranking: every committed checkpoint the writer record
        admits, by (writer generation, epoch, id), highest first. Ranking reads every
        manifest but decodes only its three ranking fields; a manifest whose header
        decodes but whose whole does not fails when loaded, so the order is exactly that
        of decoding every manifest in full (a valid manifest's header is its content).
        """
        record, _, _ = await _pointer.read_writer(self.store, self.paths.writer_record())
        pointer, _, _ = await _pointer.read_pointer(self.store, self.paths.latest_pointer())
        named = pointer.checkpoint_id if pointer is not None else None
        tried = None
        if named is not None and await self._pointer_is_current(named, record):
            tried = named
            yield named
        elif named is None:
            log.info("no usable _latest pointer: ranking the committed checkpoints")
        listing = await self.store.list_dir(self.paths.base_prefix)
        ids = [
            cid
            for prefix in listing.prefixes
            if (cid := self.paths.parse_checkpoint_dir(prefix)) is not None and cid != tried
        ]
        headers = await self._read_headers(sorted(ids, reverse=True))
        ranked = sorted(
            (h for h in headers if h is not None and _admitted(record, h)),
            key=_rank,
            reverse=True,
        )
        for header in ranked:
            yield header.checkpoint_id

    async def _pointer_is_current(
        self, named: CheckpointId, record: _pointer.WriterRecord | None
    ) -> bool:
        """False when a checkpoint committed after the one ``_latest`` names outranks it."""
        listing = await self.store.list_dir(self.paths.base_prefix)
        newer = sorted(
            cid
            for prefix in listing.prefixes
            if (cid := self.paths.parse_checkpoint_dir(prefix)) is not None and cid > named
        )
        if not newer:
            return True
        own, *later = await self._read_headers([named, *newer])
        if own is None:
            log.warning("_latest names %s, whose manifest does not read: ranking", named)
            return False
        above = [
            h for h in later if h is not None and _admitted(record, h) and _rank(h) > _rank(own)
        ]
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

    async def _read_headers(self, ids: list[CheckpointId]) -> list[_ManifestHeader | None]:
        """The ranking fields of each manifest of ``ids``; None where there is none."""

        def read(cid: CheckpointId) -> Callable[[], Awaitable[_ManifestHeader | None]]:
            async def job() -> _ManifestHeader | None:
                path = self.paths.manifest(cid)
                try:
                    blob = await self.store.get(path)
                except CheckpointNotFoundError:
                    return None  # not committed (or deleted since the listing)
                return _decode_header(path, cid, blob.data)

            return job

        return await bounded_gather(self.max_concurrent_downloads, map(read, ids))


class _ManifestHeader(msgspec.Struct, frozen=True):
    """The fields of a manifest that rank it; decoding skips the rest (no checks)."""

    checkpoint_id: CheckpointId
    epoch: int
    writer_generation: int | None = None


_header_decoder = msgspec.json.Decoder(_ManifestHeader, dec_hook=dec_hook)


def _rank(header: _ManifestHeader) -> tuple[int, int, CheckpointId]:
    """The order in which :meth:`ObjectStoreCheckpointer.load_latest` tries checkpoints."""
    return (header.writer_generation or 0, header.epoch, header.checkpoint_id)


def _admitted(record: _pointer.WriterRecord | None, header: _ManifestHeader) -> bool:
    """Whether the writer record lets this checkpoint count (a damaged record: all do)."""
    order = (header.epoch, header.checkpoint_id.uuid.int)
    return record is None or record.admits(header.writer_generation or 0, order)


_DAMAGE = (CheckpointNotFoundError, IntegrityError)
"""What makes one checkpoint unloadable without saying anything of the others.

A manifest naming a codec nobody knows is a :class:`CorruptManifestError` (damage). Not
damage, so raised: a :class:`StoreError` (a store that refuses or fails a read would
refuse the older checkpoints too, and answering None, "no checkpoint", would be a lie)
and a :class:`CodecError` (a known codec this environment lacks: restoring older state
silently would hide a missing install).
"""


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


def _hash_and_write(
    hasher: hashlib._Hash, file: BinaryIO, chunk: Buffer, decoder: StreamDecoder | None
) -> None:
    if decoder is not None:
        chunk = decoder.decompress(chunk)
    hasher.update(chunk)
    file.write(chunk)


async def _write_atomically(
    target: Path,
    fill: Callable[[BinaryIO], Awaitable[str]],
    source: str,
    expected_sha256: str | None,
) -> str:
    """Fill a temporary file beside ``target``; rename it into place only if it verifies."""
    if await asyncio.to_thread(target.is_dir):
        raise InvalidInputError(f"cannot restore {source!r} into {str(target)!r}: a directory")
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
    file = await asyncio.to_thread(open, partial, "xb")
    try:
        try:
            digest = await fill(file)
            await asyncio.to_thread(file.flush)
            await asyncio.to_thread(os.fsync, file.fileno())
        finally:
            file.close()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise IntegrityMismatchError(source, expected_sha256, digest)
        await asyncio.to_thread(os.replace, partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return digest


def _check_id(checkpoint_id: object) -> None:
    if not isinstance(checkpoint_id, CheckpointId):
        raise InvalidInputError(f"expected a CheckpointId, got {checkpoint_id!r}")


def _check_uploads(uploads: Sequence[PartitionUpload]) -> list[PartitionUpload]:
    checked: list[PartitionUpload] = []
    seen: set[tuple[str, int, bool]] = set()
    for item in uploads:
        if not isinstance(item, tuple) or len(item) != 4:
            raise InvalidInputError(
                f"each upload is (operator, partition, is_delta, data), got {item!r}"
            )
        operator, partition, is_delta, data = item
        validate_name("operator", operator)
        validate_partition(partition)
        if not isinstance(is_delta, bool):
            raise InvalidInputError(f"is_delta must be a bool, got {is_delta!r}")
        check_artifact_data(f"data for ({operator!r}, {partition})", data)
        if (operator, partition, is_delta) in seen:
            raise InvalidInputError(f"({operator!r}, {partition}) is uploaded twice")
        seen.add((operator, partition, is_delta))
        checked.append(item)
    return checked
