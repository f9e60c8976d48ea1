"""Copying checkpoints to another store or prefix, chains preserved (``cairn copy``).

A checkpoint is copied from what its manifest says, never by walking parent manifests:
every cairn manifest lists each partition's whole restore chain, and each entry names
its ``owner``, the checkpoint whose upload holds the bytes. Copying checkpoint ``C``:

1. load ``C`` from the source with every digest verified (its manifest, and every link
   of every chain, wherever the link lives);
2. put each link's stored bytes (compressed ones as stored) in the target at the same
   place relative to the base prefix, ``{owner}/operators/...`` (a directory
   partition's files too, each verified as it is read), and ``C``'s source
   offset files. A pack (``{owner}/packs/...``, whose entries are byte ranges of it) is
   copied once, whole, as stored, every range ``C``'s chains name in it verified as it
   is read; the ranges no entry of ``C`` names travel with it unverified. Another
   owner's object that the target already holds at its size is kept, not rewritten (it
   may belong to a checkpoint committed there, and step 4 reads it back anyway);
   whatever ``C``'s own, still uncommitted, directory holds is replaced;
3. commit ``C``'s manifest in the target with :meth:`ObjectStoreCheckpointer.commit`,
   which checks that every object an entry names is there, writes the manifest only if
   absent, and moves the target's ``_latest`` forwards;
4. load ``C`` back from the target, verified, and compare its restore chains with the
   source's (owner, kind and SHA-256 of every link and file; every file is read back
   and verified); a copy that differs is deleted
   again and reported.

So a copy needs only the bytes its chains use. That is what makes backups work after
any GC: ``gc`` keeps every artifact a retained checkpoint's chain references, but it
deletes the manifest of a checkpoint it does not retain, even when a retained delta
still uses that checkpoint's snapshots. The copy brings those snapshots along under
their owner's directory, as in the source, without the owner's manifest; the target
then holds exactly what the source does. (The other possible fix, GC keeping the
base's manifest, would keep a checkpoint the policy said to delete listed, restorable
and counted as retained.)

Chains are copied, not flattened: a delta is opaque bytes that only the engine that
wrote it can apply. The copy's manifest is the source's, with one difference: its
writer generation is the target's (a generation orders writers of one store; the
source's means nothing in the target). Its parent id is kept even when the parent is
not copied. A manifest written the reference's way (a delta whose base is found only
through ``parent_id``) needs its parent's manifest to load: its parent is copied first,
reported with ``requested: false``. A checkpoint already in the target is not written
again; it must load and match the source, or the copy fails.

Objects are written before the manifest, as a save writes them; unlike a save, no lease
protects them meanwhile, so a GC of the target run with ``--min-age`` shorter than the
copy may sweep them, and the commit then fails cleanly (nothing committed).

A GC of the source may run beside the copy too, and delete a checkpoint after the copy
listed it (``--all``) or named it: reading it then fails. When its manifest is gone from
the source (GC deletes the manifest first), the checkpoint is ``skipped``, with a note,
not failed: it no longer exists, and nothing of it was written to the target (the
source is read whole before the first write). A failure to read a checkpoint whose
manifest is still there is damage, and fails it as ever.

A checkpoint a newer cairn wrote (a manifest, or a part, requiring format features this
cairn does not know: :class:`~cairn.errors.NewerFormatError`) is not copied: what it
names cannot be known. Its result says so (status ``newer``), worded by
``describe_error``; the others are copied, and a child whose chains start in it fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from cairn.data import ChainLink, LoadedCheckpoint
from cairn.errors import (
    CheckpointAbortedError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CodecError,
    FencedError,
    IntegrityError,
    NewerFormatError,
)
from cairn.format.ids import CheckpointId
from cairn.format.manifest import CheckpointManifest
from cairn.protocol import _read

if TYPE_CHECKING:
    from cairn.checkpointer import ObjectStoreCheckpointer

__all__ = [
    "DELETED_NOTE",
    "Copied",
    "CopyProgress",
    "copy_checkpoints",
    "directory_bytes",
    "stored_bytes",
]

Signature = dict[tuple[str, int], list[tuple[str, bool, str]]]

MAX_CONCURRENT_PUTS = 8
"""The most objects a copy writes to the target at once."""

_FAILURES = (
    IntegrityError,
    CodecError,
    CheckpointNotFoundError,
    CheckpointExistsError,
    CheckpointAbortedError,
    FencedError,
)


@dataclass(frozen=True)
class Copied:
    """The outcome for one checkpoint.

    Attributes:
        checkpoint_id: The checkpoint.
        epoch: Its epoch, or None where its manifest did not read.
        status: ``"copied"``, ``"present"`` (already there), ``"skipped"`` (deleted
            from the source while the copy ran, see the module docstring), ``"newer"``
            (not copied: a newer cairn wrote it) or ``"failed"``.
        size_bytes: The bytes written to the target for it.
        requested: False for a parent brought along because its child's manifest
            needs it.
        error: Why it failed or was not copied, worded by ``describe_error``; None if
            it did not fail.
        note: What else there is to say (why it was skipped), or None.
    """

    checkpoint_id: CheckpointId
    epoch: int | None
    status: str
    size_bytes: int = 0
    requested: bool = True
    error: str | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        """True unless the checkpoint failed to copy or needs a newer cairn (one skipped
        did not fail)."""
        return self.status not in ("failed", "newer")


_NOT_THERE = ("failed", "skipped", "newer")
"""The outcomes after which a checkpoint is not in the target."""


DELETED_NOTE = "deleted from the source while copying (its manifest is gone): not copied"
"""The note of a checkpoint ``skipped`` because it left the source while the copy ran."""


class CopyProgress(Protocol):
    """What a copy reports its progress to (a progress bar)."""

    def set_total(self, total: float) -> None:
        """Told the bytes the copy will read and verify, once they are known.

        Args:
            total: The bytes.
        """

    def describe(self, description: str) -> None:
        """Told what the copy is doing now.

        Args:
            description: What it does, such as ``copying {id}``.
        """

    def advance(self, amount: float = 1) -> None:
        """Told that more bytes were read from the source and verified.

        Args:
            amount: How many more bytes.
        """


def _skipped(cid: CheckpointId, epoch: int | None) -> Copied:
    return Copied(cid, epoch, "skipped", note=DELETED_NOTE)


async def _deleted(source: ObjectStoreCheckpointer, cid: CheckpointId) -> bool:
    """True when ``cid``'s manifest is no longer in the source (one HEAD): the checkpoint
    was deleted, by a GC say, since the copy listed it. False while it is there, however
    damaged; a store failure of the HEAD itself is raised."""
    return not await source.exists(cid)


def signature(loaded: LoadedCheckpoint) -> Signature:
    """Each partition's restore chain as ``(owner, is_delta, sha256)`` links; a directory
    partition's files as ``(owner/relative path, False, sha256)``."""
    found: Signature = {
        key: [(str(link.owner), link.entry.is_delta, link.entry.sha256) for link in chain]
        for key, chain in loaded.chains.items()
    }
    for key, files in loaded.directories.items():
        owned = [
            (f"{f.owner or loaded.checkpoint_id}/{f.relative_path}", False, f.sha256) for f in files
        ]
        found[key] = owned
    return found


async def directory_bytes(
    ckpt: ObjectStoreCheckpointer, loaded: LoadedCheckpoint
) -> dict[str, bytes | memoryview]:
    """Every file of a checkpoint's directory partitions as stored, verified.

    ``load`` lists the files without reading them: this reads them.

    Args:
        ckpt: The checkpointer of the checkpoint's store.
        loaded: The checkpoint, as loaded.

    Returns:
        Each file's bytes, by its path relative to the base prefix.

    Raises:
        IntegrityError: A file does not match its digest.
    """
    found: dict[str, bytes | memoryview] = {}
    for files in loaded.directories.values():
        for file in files:
            owner = file.owner or loaded.checkpoint_id
            path = ckpt.paths.resolve(owner, file.path)
            data = await ckpt.load_artifact(path, expected_sha256=file.sha256)
            found[f"{owner}/{file.path}"] = memoryview(data)
    return found


def needs_parent_manifest(manifest: CheckpointManifest) -> bool:
    """True when a partition's chain starts with a delta: its base is in the parent."""
    first: dict[tuple[str, int], bool] = {}
    for operator, entry in manifest.partition_entries():
        first.setdefault((operator, entry.partition_id), entry.is_delta)
    return any(first.values())


async def stored_bytes(
    ckpt: ObjectStoreCheckpointer, loaded: LoadedCheckpoint
) -> dict[str, bytes | memoryview]:
    """Every link's bytes as stored.

    ``loaded`` holds each link's data verified and decoded; an entry stored compressed is
    read again as stored (its digest covers the decoded bytes, which ``loaded`` checked),
    no more than the size its entry records. A pack (entries with offsets) is read once,
    whole, as stored, each range its entries name in it verified again: it is copied
    as one object. So is every
    file of a directory partition (:func:`directory_bytes`).

    Args:
        ckpt: The checkpointer of the checkpoint's store.
        loaded: The checkpoint, as loaded (its links verified).

    Returns:
        Each object's bytes, by its path relative to the base prefix.

    Raises:
        IntegrityError: A range of a pack, or a file, does not match its digest.
    """
    found: dict[str, bytes | memoryview] = {}
    packs: dict[str, list[ChainLink]] = {}
    for chain in loaded.chains.values():
        for link in chain:
            relative = f"{link.owner}/{link.entry.path}"
            if link.entry.offset is not None:
                packs.setdefault(relative, []).append(link)
                continue
            if relative in found:
                continue
            if link.entry.codec is None:
                found[relative] = memoryview(link.data)
            else:
                path = ckpt.paths.resolve(link.owner, link.entry.path)
                stored = await _read.read_stored(ckpt.store, path, link.entry)
                found[relative] = memoryview(stored)
    for relative, links in packs.items():
        path = ckpt.paths.resolve(links[0].owner, links[0].entry.path)
        pack = await _read.read_pack(ckpt.store, path, [link.entry for link in links])
        found[relative] = memoryview(pack)
    found.update(await directory_bytes(ckpt, loaded))
    return found


class _Plan:
    """The requested checkpoints, and the parents a reference-style manifest needs; the
    failure to read a manifest, worded by ``describe_error``."""

    def __init__(
        self, source: ObjectStoreCheckpointer, describe_error: Callable[[BaseException], str]
    ) -> None:
        self.source = source
        self.describe_error = describe_error
        self.manifests: dict[CheckpointId, CheckpointManifest] = {}
        self.errors: dict[CheckpointId, str] = {}
        self.newer: set[CheckpointId] = set()
        self.deleted: set[CheckpointId] = set()
        self.needs: dict[CheckpointId, CheckpointId] = {}

    async def add(self, cid: CheckpointId) -> None:
        """Read ``cid``'s manifest, and its parent's while its chains need that."""
        current: CheckpointId | None = cid
        while current is not None and current not in self.manifests and current not in self.errors:
            if current in self.deleted:
                return
            try:
                manifest = await self.source.load_manifest(current)
            except NewerFormatError as exc:
                self.newer.add(current)
                self.errors[current] = self.describe_error(exc)
                return
            except (IntegrityError, CheckpointNotFoundError) as exc:
                if await _deleted(self.source, current):
                    self.deleted.add(current)
                else:
                    self.errors[current] = self.describe_error(exc)
                return
            self.manifests[current] = manifest
            current = None
            if needs_parent_manifest(manifest) and manifest.parent_id is not None:
                self.needs[manifest.checkpoint_id] = manifest.parent_id
                current = manifest.parent_id

    def order(self) -> list[CheckpointId]:
        """Every planned id, oldest first: a parent's id is older than its child's."""
        return sorted(set(self.manifests) | set(self.errors) | self.deleted)


async def _present(target: ObjectStoreCheckpointer, cid: CheckpointId) -> LoadedCheckpoint | None:
    if not await target.exists(cid):
        return None
    return await target.load(cid, verify=True)


async def _put_missing(
    source: ObjectStoreCheckpointer,
    target: ObjectStoreCheckpointer,
    cid: CheckpointId,
    manifest: CheckpointManifest,
    objects: dict[str, bytes | memoryview],
) -> int:
    """Put what the target lacks of ``objects`` and ``cid``'s offset files; bytes written."""
    for name in sorted(manifest.source_offsets):
        path = source.paths.source_offset(cid, name)
        try:
            blob = await source.store.get(path)
        except CheckpointNotFoundError:
            continue  # a manifest written the reference's way may have none: it has them all
        objects[path.removeprefix(source.paths.base_prefix)] = memoryview(blob.data)
    limit = asyncio.Semaphore(MAX_CONCURRENT_PUTS)

    async def put(relative: str, data: bytes | memoryview) -> int:
        path = target.paths.base_prefix + relative
        async with limit:
            # Another owner's objects may belong to a checkpoint committed in the target,
            # whose bytes are immutable: kept when there (step 4 reads them back). Our own
            # directory is uncommitted until the manifest: whatever is there is replaced.
            if not relative.startswith(f"{cid}/"):
                try:
                    if (await target.store.head(path)).size == memoryview(data).nbytes:
                        return 0
                except CheckpointNotFoundError:
                    pass
            await target.store.put(path, data)
        return memoryview(data).nbytes

    written = await asyncio.gather(*(put(r, d) for r, d in sorted(objects.items())))
    return sum(written)


async def _copy_one(
    source: ObjectStoreCheckpointer,
    target: ObjectStoreCheckpointer,
    cid: CheckpointId,
    epoch: int | None,
    progress: Callable[[int], None] | None = None,
) -> Copied:
    try:
        loaded = await source.load(cid, verify=True, progress=progress)
    except _FAILURES:
        if await _deleted(source, cid):
            return _skipped(cid, epoch)
        raise
    manifest = loaded.manifest
    wanted = signature(loaded)
    existing = await _present(target, cid)
    if existing is not None:
        if signature(existing) != wanted:
            return Copied(
                cid,
                manifest.epoch,
                "failed",
                error=f"the target already holds a different checkpoint {cid}",
            )
        return Copied(cid, manifest.epoch, "present")
    try:
        objects = await stored_bytes(source, loaded)
    except _FAILURES:
        if await _deleted(source, cid):
            return _skipped(cid, epoch)
        raise
    size = await _put_missing(source, target, cid, manifest, objects)
    del loaded, objects  # one checkpoint's bytes in memory at a time
    await target.commit(
        msgspec.structs.replace(manifest, writer_generation=target.writer_generation or None)
    )
    copied = await target.load(cid, verify=True)
    await directory_bytes(target, copied)  # every file read back and verified
    if signature(copied) != wanted:
        await target.delete_checkpoint(cid)
        return Copied(
            cid,
            manifest.epoch,
            "failed",
            error=f"the copy of {cid} does not match its source (chains differ); it was removed",
        )
    carried = {link.owner for chain in copied.chains.values() for link in chain} - {cid}
    note = None
    if carried:
        held = ", ".join(str(owner) for owner in sorted(carried))
        note = f"carries artifacts of {held}"
    return Copied(cid, manifest.epoch, "copied", size_bytes=size, note=note)


async def copy_checkpoints(
    source: ObjectStoreCheckpointer,
    target: ObjectStoreCheckpointer,
    ids: list[CheckpointId],
    *,
    progress: CopyProgress | None = None,
    describe_error: Callable[[BaseException], str] = str,
) -> list[Copied]:
    """Copy checkpoints from one store to another (and any parent a reference-style
    manifest needs), oldest first, as the module docstring says.

    Integrity failures of one checkpoint are reported in its result (and fail a
    checkpoint whose manifest needs it); one deleted from the source meanwhile is
    ``skipped``; store failures are raised.

    Args:
        source: The checkpointer to copy from.
        target: The checkpointer to copy to.
        ids: The checkpoints to copy.
        progress: Told the bytes to read, the checkpoint being copied, and each
            artifact's bytes once read and verified from the source; None tells nothing.
        describe_error: Words the error of a checkpoint that failed or needs a newer
            cairn, for its result.

    Returns:
        One result per checkpoint handled, in copy order.
    """
    plan = _Plan(source, describe_error)
    for cid in ids:
        await plan.add(cid)
    order = plan.order()
    if progress is not None:
        progress.set_total(_bytes_to_verify(plan.manifests.get(cid) for cid in order))
    requested = set(ids)
    results: dict[CheckpointId, Copied] = {}
    for cid in order:
        if progress is not None:
            progress.describe(f"copying {cid}")
        manifest = plan.manifests.get(cid)
        epoch = manifest.epoch if manifest is not None else None
        parent = plan.needs.get(cid)
        if cid in plan.deleted:
            result = _skipped(cid, None)
        elif cid in plan.errors:
            status = "newer" if cid in plan.newer else "failed"
            result = Copied(cid, None, status, error=plan.errors[cid])
        elif parent is not None and parent in results and results[parent].status in _NOT_THERE:
            error = f"its chains start in {parent}, which could not be copied"
            result = Copied(cid, epoch, "failed", error=error)
        else:
            try:
                advance = progress.advance if progress is not None else None
                result = await _copy_one(source, target, cid, epoch, advance)
            except NewerFormatError as exc:
                result = Copied(cid, epoch, "newer", error=describe_error(exc))
            except _FAILURES as exc:
                result = Copied(cid, epoch, "failed", error=describe_error(exc))
        if cid not in requested:
            result = dataclasses.replace(result, requested=False)
        results[cid] = result
    return [results[cid] for cid in order]


def _bytes_to_verify(manifests: Iterable[CheckpointManifest | None]) -> int:
    """The bytes (decoded) the artifacts and directory files of ``manifests`` list, their
    chains included (None, a manifest that did not read, counts 0)."""
    listed = [manifest for manifest in manifests if manifest is not None]
    artifacts = sum(entry.size_bytes for m in listed for _, entry in m.partition_entries())
    return artifacts + sum(file.size_bytes for m in listed for _, file in m.file_entries())
