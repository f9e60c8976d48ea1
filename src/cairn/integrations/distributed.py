"""Many workers, one checkpoint: a two-phase save across processes and hosts.

Phase one, on each worker: :func:`upload_partitions` uploads that worker's partitions
of checkpoint ``id`` and returns a :class:`WorkerReport`, a plain value that goes to the
coordinator over whatever channel the engine has (:meth:`WorkerReport.to_json` and
:meth:`WorkerReport.from_json` round-trip it losslessly).

Phase two, on the coordinator: :func:`commit_distributed` takes every report and commits
once, as :meth:`ObjectStoreCheckpointer.save` does. Invariants:

* it commits only if every expected ``(operator, partition)`` was reported exactly once
  and nothing else was (:class:`IncompleteCheckpointError` otherwise);
* it commits only entries that match the store: a HEAD per artifact checks the size and
  the SHA-256 the worker stored as object metadata, so no artifact is downloaded
  (:class:`IntegrityMismatchError` naming the artifact otherwise). Stores without user
  metadata (local directories) are hashed from the file instead. An object of ranges (a
  :class:`~cairn.KeyedSnapshot`) has no digest of its whole bytes: its entry's digest is
  its range index's, which lists every range's, so its index (the object's last
  ``index_size_bytes``) is read, with one ranged GET, and hashed;
* a failed commit writes nothing: no manifest, no pointer. A worker that dies mid-upload
  leaves objects in an uncommitted directory, which GC's orphan sweep removes;
* the manifest records the save's statistics: its duration runs from the time its id
  carries (:meth:`CheckpointId.now` where the save began, by that process's clock) to
  the commit point, the uploads up to the start of :func:`commit_distributed`; the
  workers' store requests are not reported to the coordinator, so ``requests`` is left
  unknown;
* the save's lease and preconditions are the commit protocol's (:mod:`cairn.protocol._commit`):
  each worker holds the lease while it uploads (and it lapses a lease after), and the
  coordinator, from the start of :func:`commit_distributed`, checks that it is not
  fenced and that the id is not committed, then holds the lease through its checks to
  the commit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import msgspec

from cairn.checkpointer import ObjectStoreCheckpointer, PartitionUpload
from cairn.data import ArtifactKey
from cairn.errors import (
    CheckpointNotFoundError,
    IncompleteCheckpointError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidInputError,
    MissingArtifactError,
)
from cairn.format.ids import CheckpointId
from cairn.format.integrity import sha256_hex
from cairn.format.layout import validate_name, validate_partition
from cairn.format.manifest import (
    CheckpointManifest,
    PartitionSnapshotEntry,
    SourceOffsetEntry,
    check_entry,
    dec_hook,
    enc_hook,
)
from cairn.integrations._interface import (
    Buffer,
    SaveMeter,
    assemble_manifest,
    begin,
    bounded_gather,
    is_int,
)

__all__ = ["DIGEST_METADATA_KEY", "WorkerReport", "commit_distributed", "upload_partitions"]

DIGEST_METADATA_KEY = "cairn-sha256"
"""The user-metadata key under which a worker stores each artifact's SHA-256."""


class WorkerReport(msgspec.Struct, frozen=True):
    """What one worker uploaded for a checkpoint: ``(operator, entry)`` pairs.

    Made by :func:`upload_partitions`; sent to the coordinator as :meth:`to_json` bytes
    and read there with :meth:`from_json`.

    Attributes:
        checkpoint_id: The checkpoint the worker uploaded to.
        worker: The worker's name, for errors.
        entries: ``(operator, entry)`` of every artifact it stored.
    """

    checkpoint_id: CheckpointId
    worker: str
    entries: tuple[tuple[str, PartitionSnapshotEntry], ...]

    def to_json(self) -> bytes:
        """The report as JSON, for the engine's channel to the coordinator.

        Returns:
            The JSON bytes (:meth:`from_json` reads them back).
        """
        return _encoder.encode(self)

    @classmethod
    def from_json(cls, data: Buffer) -> WorkerReport:
        """Parse a report; raises :class:`InvalidInputError` for anything malformed.

        Malformed includes JSON nested too deeply, a value of the wrong type (a number
        where an id belongs), and an entry that :func:`cairn.format.manifest.check_entry`
        refuses (a path that is not the layout's, a bad digest, an unknown codec).

        Args:
            data: The JSON bytes a worker sent.

        Returns:
            The report.

        Raises:
            InvalidInputError: ``data`` is not a well-formed report.
        """
        try:
            report = _decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise InvalidInputError(f"not a worker report: {exc}") from None
        except RecursionError:
            raise InvalidInputError("not a worker report: its JSON is nested too deeply") from None
        for operator, entry in report.entries:
            try:
                validate_name("operator", operator)
                check_entry(operator, entry, report.checkpoint_id)
            except InvalidInputError as exc:
                raise InvalidInputError(
                    f"not a worker report: worker {report.worker!r}: {exc}"
                ) from None
        return report


_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
_decoder = msgspec.json.Decoder(WorkerReport, dec_hook=dec_hook)


async def upload_partitions(
    ckpt: ObjectStoreCheckpointer,
    checkpoint_id: CheckpointId,
    uploads: Sequence[PartitionUpload],
    *,
    worker: str = "",
) -> WorkerReport:
    """Worker side: upload these partitions of ``checkpoint_id``; report what was stored.

    Each artifact is hashed before it is sent, so its SHA-256 travels with it as object
    metadata and the coordinator can check it with a HEAD. Commits nothing.

    Args:
        ckpt: The worker's checkpointer.
        checkpoint_id: The checkpoint being saved (the coordinator's choice).
        uploads: ``(operator, partition, is_delta, data)`` of each partition to upload.
        worker: The worker's name, carried in the report for errors.

    Returns:
        What was stored, to send to the coordinator.

    Raises:
        CheckpointExistsError: The checkpoint is already committed.
    """
    entries = await ckpt.save_partitions_concurrent(
        checkpoint_id, uploads, metadata_key=DIGEST_METADATA_KEY
    )
    return WorkerReport(checkpoint_id=checkpoint_id, worker=worker, entries=tuple(entries))


def _collect(
    checkpoint_id: CheckpointId,
    expected: Iterable[ArtifactKey],
    reports: Iterable[WorkerReport],
) -> list[tuple[str, PartitionSnapshotEntry]]:
    wanted = {(validate_name("operator", op), validate_partition(p)) for op, p in expected}
    entries: list[tuple[str, PartitionSnapshotEntry]] = []
    for report in reports:
        if report.checkpoint_id != checkpoint_id:
            raise IncompleteCheckpointError(
                f"worker {report.worker!r} reported checkpoint {report.checkpoint_id}, "
                f"not {checkpoint_id}"
            )
        entries.extend(report.entries)
    seen = Counter((op, entry.partition_id) for op, entry in entries)
    duplicated = sorted(key for key, count in seen.items() if count > 1)
    if duplicated:
        raise IncompleteCheckpointError(f"partition {duplicated[0]!r} was reported twice")
    unexpected = sorted(set(seen) - wanted)
    if unexpected:
        raise IncompleteCheckpointError(f"partition {unexpected[0]!r} was not expected")
    missing = sorted(wanted - set(seen))
    if missing:
        raise IncompleteCheckpointError(
            f"{len(missing)} expected partition(s) were not reported, e.g. {missing[0]!r}"
        )
    return entries


async def commit_distributed(
    ckpt: ObjectStoreCheckpointer,
    checkpoint_id: CheckpointId,
    epoch: int,
    expected: Iterable[ArtifactKey],
    reports: Iterable[WorkerReport],
    *,
    source_offsets: Mapping[str, SourceOffsetEntry] | None = None,
    watermark: int | None = None,
) -> CheckpointManifest:
    """Coordinator side: check every report against the store, then commit once.

    Raises :class:`IncompleteCheckpointError` for a missing, duplicated or unexpected
    partition and :class:`IntegrityMismatchError` for an entry whose size or digest is
    not what the store holds; either way nothing is committed. Returns the manifest.
    A fenced coordinator (:class:`FencedError`) and an id already committed
    (:class:`CheckpointExistsError`) are refused before the store is read.

    Args:
        ckpt: The coordinator's checkpointer.
        checkpoint_id: The checkpoint to commit.
        epoch: Its epoch, an int >= 0.
        expected: Every ``(operator, partition)`` the checkpoint must hold.
        reports: The workers' reports.
        source_offsets: A source name to its offsets, or None.
        watermark: The watermark to record, or None.

    Returns:
        The committed manifest.

    Raises:
        IncompleteCheckpointError: A partition is missing, duplicated or unexpected, or
            a report names another checkpoint.
        IntegrityMismatchError: An entry's size or digest is not what the store holds.
        InvalidInputError: ``epoch`` is out of range, or a report holds a delta.
        FencedError: A newer writer has taken over.
        CheckpointExistsError: The id is already committed.
    """
    if not is_int(epoch) or epoch < 0:
        raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
    entries = _collect(checkpoint_id, expected, reports)
    if any(entry.is_delta for _, entry in entries):
        raise InvalidInputError("a distributed checkpoint holds full snapshots only")
    for source in source_offsets or {}:
        validate_name("source", source)
    meter = _meter_since(checkpoint_id)
    async with await begin(ckpt, checkpoint_id) as save:
        with meter.counting():
            await bounded_gather(
                ckpt.max_concurrent_downloads,
                [_check_against_store(ckpt, checkpoint_id, op, entry) for op, entry in entries],
            )
        manifest = assemble_manifest(
            checkpoint_id,
            epoch,
            entries,
            source_offsets=source_offsets,
            watermark=watermark,
            writer_generation=ckpt.writer_generation,
        )
        return await save.commit(manifest, meter)


def _meter_since(checkpoint_id: CheckpointId) -> SaveMeter:
    """The meter of a distributed save of ``checkpoint_id``, begun when its id was made
    (by the local clock: a time in the future counts as now) and uploaded by now."""
    now = time.perf_counter()
    age = max(0.0, time.time() - checkpoint_id.timestamp_ms / 1000)
    return SaveMeter(began=now - age, uploading=now - age, uploaded=now, counts_every_request=False)


def _check_against_store(
    ckpt: ObjectStoreCheckpointer,
    checkpoint_id: CheckpointId,
    operator: str,
    entry: PartitionSnapshotEntry,
) -> Callable[[], Awaitable[None]]:
    path = ckpt.paths.resolve(entry.owner or checkpoint_id, entry.path)

    async def check() -> None:
        try:
            await compare()
        except IntegrityError as exc:
            exc.located(operator, entry.partition_id)
            raise

    async def compare() -> None:
        try:
            info, metadata = await ckpt.store.stat(path)
        except CheckpointNotFoundError:
            raise MissingArtifactError(path, f"checkpoint {checkpoint_id}") from None
        if info.size != entry.size_bytes:
            raise IntegrityMismatchError(path, str(entry.size_bytes), str(info.size), what="size")
        stored_digest = metadata.get(DIGEST_METADATA_KEY)
        if entry.index_size_bytes is not None:  # an object of ranges: its index's digest
            index = await ckpt.store.get_range(path, info.size - entry.index_size_bytes, info.size)
            stored_digest = sha256_hex(index)
        elif stored_digest is None:  # a store without user metadata: hash the object itself
            stored_digest = sha256_hex((await ckpt.store.get(path)).data)
        if stored_digest != entry.sha256:
            raise IntegrityMismatchError(path, entry.sha256, stored_digest)

    return check
