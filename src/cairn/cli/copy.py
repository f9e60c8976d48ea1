"""``cairn copy``: copy checkpoints to another store or prefix, chains preserved.

Chains are copied, not flattened: a delta is opaque bytes that only the engine that
wrote it can apply, so cairn cannot fold it into a snapshot. Each checkpoint is copied
with the public API only: it is loaded from the source with every digest verified, and
its own artifacts (the snapshots and deltas its upload holds) are saved in the target
under the same checkpoint id, epoch, source offsets, watermark and parent id, with
``CheckpointData(checkpoint_id=..., parent_id=...)``. The target's ``save`` then
carries the parent's partitions over by reference exactly as the source did, which is
why parents are copied first: a requested checkpoint brings the ancestors its chains
need (its parent chain and every checkpoint whose artifacts it references), and all are
copied oldest first (parents before children). A checkpoint already in the target is
not written again; it must load and match the source, or the copy fails.

After each save the copy is loaded back from the target, verified, and its restore
chains compared with the source's (owner, kind and SHA-256 of every link); a copy that
differs is deleted again and reported. Differences from the source: the copy's manifest
has the time of the copy as its timestamp and no writer generation (the save takes the
target's ``_latest`` forwards as usual). A parent that no longer exists in the source
(collected after its children stopped needing it) is dropped from a checkpoint that
holds only its own snapshots, and noted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointManifest,
    CheckpointNotFoundError,
    CodecError,
    IntegrityError,
    LoadedCheckpoint,
    ObjectStoreCheckpointer,
)
from cairn.cli.errors import describe
from cairn.cli.progress import Transfer

__all__ = ["Copied", "copy_checkpoints"]

Signature = dict[tuple[str, int], list[tuple[str, bool, str]]]


@dataclass(frozen=True)
class Copied:
    """The outcome for one checkpoint: ``copied``, ``present`` (already there) or ``failed``."""

    checkpoint_id: CheckpointId
    epoch: int | None
    status: str
    size_bytes: int = 0
    requested: bool = True
    error: str | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        """True unless the checkpoint failed to copy."""
        return self.status != "failed"


def signature(loaded: LoadedCheckpoint) -> Signature:
    """Each partition's restore chain as ``(owner, is_delta, sha256)`` links."""
    return {
        key: [(str(link.owner), link.entry.is_delta, link.entry.sha256) for link in chain]
        for key, chain in loaded.chains.items()
    }


class _Plan:
    """The source manifests of the requested checkpoints and their ancestors."""

    def __init__(self, source: ObjectStoreCheckpointer) -> None:
        self.source = source
        self.manifests: dict[CheckpointId, CheckpointManifest] = {}
        self.errors: dict[CheckpointId, str] = {}
        self.deps: dict[CheckpointId, list[CheckpointId]] = {}
        self.dropped_parent: set[CheckpointId] = set()

    async def add(self, cid: CheckpointId) -> None:
        """Read ``cid``'s manifest and, recursively, those of the checkpoints it needs."""
        pending = [cid]
        while pending:
            current = pending.pop()
            if current in self.manifests or current in self.errors:
                continue
            try:
                manifest = await self.source.load_manifest(current)
            except (IntegrityError, CheckpointNotFoundError) as exc:
                self.errors[current] = describe(exc)
                self.deps[current] = []
                continue
            self.manifests[current] = manifest
            deps = {e.owner for _, e in manifest.partition_entries() if e.owner is not None}
            if manifest.parent_id is not None:
                if await self._exists(manifest.parent_id) or not self._self_contained(manifest):
                    deps.add(manifest.parent_id)
                else:
                    self.dropped_parent.add(current)
            self.deps[current] = sorted(deps)
            pending.extend(deps)

    async def _exists(self, cid: CheckpointId) -> bool:
        return await self.source.exists(cid)

    @staticmethod
    def _self_contained(manifest: CheckpointManifest) -> bool:
        return all(e.owner is None and not e.is_delta for _, e in manifest.partition_entries())

    def order(self) -> list[CheckpointId]:
        """Every planned id, each after the checkpoints it needs."""
        done: list[CheckpointId] = []
        seen: set[CheckpointId] = set()

        def visit(cid: CheckpointId, path: frozenset[CheckpointId]) -> None:
            if cid in seen or cid in path:
                return
            for dep in self.deps.get(cid, []):
                visit(dep, path | {cid})
            seen.add(cid)
            done.append(cid)

        for cid in sorted(self.deps):
            visit(cid, frozenset())
        return done


async def _present(target: ObjectStoreCheckpointer, cid: CheckpointId) -> LoadedCheckpoint | None:
    try:
        await target.store.head(target.paths.manifest(cid))
    except CheckpointNotFoundError:
        return None
    return await target.load(cid, verify=True)


async def _copy_one(
    source: ObjectStoreCheckpointer,
    target: ObjectStoreCheckpointer,
    cid: CheckpointId,
    drop_parent: bool,
) -> Copied:
    loaded = await source.load(cid, verify=True)
    manifest = loaded.manifest
    wanted = signature(loaded)
    existing = await _present(target, cid)
    if existing is not None:
        if signature(existing) != wanted:
            return Copied(
                cid,
                manifest.epoch,
                "failed",
                error=(f"the target already holds a different checkpoint {cid}"),
            )
        return Copied(cid, manifest.epoch, "present")
    own = [
        (key, link) for key, chain in loaded.chains.items() for link in chain if link.owner == cid
    ]
    data = CheckpointData(
        checkpoint_id=cid,
        epoch=manifest.epoch,
        snapshots={key: link.data for key, link in own if not link.entry.is_delta},
        deltas={key: link.data for key, link in own if link.entry.is_delta},
        source_offsets=loaded.source_offsets,
        watermark=manifest.watermark,
        parent_id=None if drop_parent else manifest.parent_id,
        timestamp_ms=manifest.timestamp_ms,
    )
    await target.save(data)
    copied = await target.load(cid, verify=True)
    if signature(copied) != wanted:
        await target.delete_checkpoint(cid)
        return Copied(
            cid,
            manifest.epoch,
            "failed",
            error=(f"the copy of {cid} does not match its source (chains differ); it was removed"),
        )
    size = sum(memoryview(link.data).nbytes for _, link in own)
    note = (
        f"parent {manifest.parent_id} no longer exists: copied without it" if drop_parent else None
    )
    return Copied(cid, manifest.epoch, "copied", size_bytes=size, note=note)


async def copy_checkpoints(
    source: ObjectStoreCheckpointer,
    target: ObjectStoreCheckpointer,
    ids: list[CheckpointId],
    progress: Transfer,
) -> list[Copied]:
    """Copy ``ids`` and the ancestors they need from ``source`` to ``target``, oldest first.

    Returns one :class:`Copied` per checkpoint handled, in copy order. Integrity
    failures of one checkpoint are reported in its result (and fail the checkpoints
    built on it); store failures are raised.
    """
    plan = _Plan(source)
    for cid in ids:
        await plan.add(cid)
    order = plan.order()
    progress.set_total(len(order))
    requested = set(ids)
    results: dict[CheckpointId, Copied] = {}
    for cid in order:
        progress.describe(f"copying {cid}")
        manifest = plan.manifests.get(cid)
        epoch = manifest.epoch if manifest is not None else None
        failed_dep = next(
            (d for d in plan.deps[cid] if d not in results or not results[d].ok), None
        )
        if cid in plan.errors:
            result = Copied(cid, None, "failed", error=plan.errors[cid])
        elif failed_dep is not None:
            result = Copied(
                cid,
                epoch,
                "failed",
                error=(f"it builds on {failed_dep}, which could not be copied"),
            )
        else:
            try:
                result = await _copy_one(source, target, cid, cid in plan.dropped_parent)
            except (IntegrityError, CodecError) as exc:
                result = Copied(cid, epoch, "failed", error=describe(exc))
        if cid not in requested:
            result = dataclasses.replace(result, requested=False)
        results[cid] = result
        progress.advance(1)
    return [results[cid] for cid in order]
