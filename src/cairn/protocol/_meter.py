"""What a save measures of itself: the statistics its manifest records.

A save (:mod:`cairn.protocol._save`; the protocol is written down in
:mod:`cairn.protocol._commit`) counts with a :class:`SaveMeter` its clock readings and
the store requests and retries it makes, its committer's and its workers' (a worker
hands its counts to the committer), and the meter completes the manifest, just before
the commit point, with the :class:`~cairn.format.manifest.SaveStats` they add up to.

Invariant: the statistics describe the manifest as it is written, requests included:
those up to the create, and the create's own (each part, and the
manifest itself), and the bytes of the manifest as stored (:func:`_save_stats`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator

import msgspec

from cairn.format.manifest import (
    CheckpointManifest,
    PartitionSnapshotEntry,
    SaveStats,
    StoreRequests,
    encode_stored,
)
from cairn.observe import _dispatch
from cairn.protocol._context import Context

__all__ = ["SaveMeter"]


@dataclasses.dataclass
class SaveMeter:
    """What a save measures of itself for its :class:`~cairn.format.manifest.SaveStats`.

    ``began``, ``uploading`` and ``uploaded`` are ``time.perf_counter`` readings: the
    save's start, and its upload phase's start and end (unset: the save's start, and
    the check before its commit). ``requests`` and ``retries`` count the store requests
    and retries made in its :meth:`counting` blocks (and the tasks started there, a
    lease's renewals), and those :meth:`add` counts for another process (a worker of
    the save). One meter may count in many blocks. ``counts_every_request`` is False
    when some of the save's requests were made where nobody counted them (the workers of
    a distributed save, whose reports carry no counts): its statistics then leave
    ``requests`` unset (unknown), never a count that falls short.
    """

    began: float = dataclasses.field(default_factory=time.perf_counter)
    uploading: float | None = None
    uploaded: float | None = None
    requests: _dispatch.RequestCounter = dataclasses.field(default_factory=_dispatch.RequestCounter)
    retries: _dispatch.RetryCounter = dataclasses.field(default_factory=_dispatch.RetryCounter)
    counts_every_request: bool = True

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count the store requests and retries of the block (and its tasks) here."""
        with _dispatch.counting_requests(self.requests), _dispatch.counting_retries(self.retries):
            yield

    def spent(self) -> tuple[StoreRequests, int]:
        """The requests and retries counted so far: what a worker hands its committer."""
        return StoreRequests(**dataclasses.asdict(self.requests)), self.retries.count

    def add(self, requests: StoreRequests, retries: int) -> None:
        """Count a worker's ``requests`` and ``retries`` (its :meth:`spent`) here."""
        self.requests.add(_dispatch.RequestCounter(**msgspec.structs.asdict(requests)))
        self.retries.count += retries

    def finish(self, ctx: Context) -> Callable[[CheckpointManifest], CheckpointManifest]:
        """A ``finish`` for :meth:`cairn.protocol._save.PendingSave.commit`: the checked
        manifest with the statistics of this save (:func:`_save_stats`), measured up to
        that moment."""

        def with_stats(checked: CheckpointManifest) -> CheckpointManifest:
            stats = _save_stats(ctx, checked, self, time.perf_counter())
            return msgspec.structs.replace(checked, stats=stats)

        return with_stats


def _save_stats(
    ctx: Context, manifest: CheckpointManifest, meter: SaveMeter, checked: float
) -> SaveStats:
    """What :class:`SaveStats` says of a save of ``manifest``, about to be written, from
    its entries, its ``meter`` and ``checked``, the clock reading before the write.

    ``requests`` are the meter's plus those the create makes once this record is encoded
    (:func:`cairn.protocol._commit._create_manifest`), up to the commit: the manifest's
    own writes (each part, then the manifest; one PUT each). ``stored_bytes`` are the
    save's own objects, the parts and the manifest as they will be stored. The
    manifest's size depends on the numbers it holds, so it is encoded until they agree
    (twice; three times when a number gains a digit).
    """
    # A directory partition's files count as artifacts, each its own; so does each
    # artifact of a pack (its stored range), and each object a DCP save carries in part
    # (the bytes of the ranges it uses).
    sizes = [(e.owner, _counted_bytes(e)) for _, e in manifest.partition_entries()]
    sizes += [(f.owner, f.size_bytes) for _, f in manifest.file_entries()]
    own = [size for owner, size in sizes if owner is None]
    carried = [size for owner, size in sizes if owner is not None]
    uploading = meter.uploading if meter.uploading is not None else meter.began
    uploaded = meter.uploaded if meter.uploaded is not None else checked

    def ms(seconds: float) -> int:
        return max(0, round(seconds * 1000))

    counted, retries = meter.spent()
    objects = sum(size for owner, _, size in manifest.stored_objects() if owner is None)
    stats = SaveStats(
        duration_ms=ms(checked - meter.began),
        upload_ms=ms(uploaded - uploading),
        commit_ms=ms(checked - uploaded),
        uploaded_bytes=sum(own),
        uploaded_artifacts=len(own),
        carried_bytes=sum(carried),
        carried_artifacts=len(carried),
        retries=retries,
        stored_bytes=objects,
        requests=counted if meter.counts_every_request else msgspec.UNSET,
    )
    for _ in range(5):  # the sizes only grow, by a digit at a time: a few rounds settle
        encoded = encode_stored(msgspec.structs.replace(manifest, stats=stats), ctx.keys)
        parts = [body for _, body in encoded.parts]
        settled = msgspec.structs.replace(
            stats,
            stored_bytes=objects + sum(map(len, parts)) + len(encoded.root),
            requests=msgspec.structs.replace(counted, put=counted.put + len(parts) + 1)
            if meter.counts_every_request
            else msgspec.UNSET,
        )
        if settled == stats:
            break
        stats = settled
    return stats


def _counted_bytes(entry: PartitionSnapshotEntry) -> int:
    """The bytes :class:`SaveStats` counts for ``entry``: those it takes in the store, or
    for a carried object of which this checkpoint uses ranges, those ranges'."""
    if entry.owner is not None and entry.used_bytes is not None:
        return entry.used_bytes
    return entry.stored_length
