"""``cairn restore``: write one checkpoint's verified artifacts and manifest as local files.

Two layouts. ``partitions`` writes the state itself, as a job reads it back: each
partition's restore chain, decoded, one file per link, and its source offsets::

    DIR/{operator}/partition-{p}.snapshot               the partition's base snapshot
    DIR/{operator}/partition-{p}.delta-{k}              then its deltas, k = 1, 2, ...
    DIR/{operator}/partition-{p}/{relative path}        a directory partition's files
    DIR/offsets/{source}.json                           source offsets (from the manifest)

``store`` (the default) mirrors the store's layout with an empty base prefix, so the
directory is itself a checkpoint store holding that one checkpoint::

    DIR/{id}/manifest.json                              the manifest, byte for byte
    DIR/{id}/offsets/{source}.json                      source offsets (from the manifest)
    DIR/{owner}/operators/{operator}/partition-{p}.snap|.delta
                                                        every link of every restore chain
    DIR/{owner}/operators/{operator}/partition-{p}.{attempt}.file-{n}
                                                        every file of a directory partition
    DIR/{owner}/packs/pack-{n}.{attempt}.pack           a pack: many small artifacts

``{owner}`` is the checkpoint whose upload holds the bytes: ``{id}`` itself, or an
earlier checkpoint of its chain. Artifacts are written as stored (an artifact stored
compressed stays compressed, as its manifest entry says), so cairn loads the directory
as it loads the store. A pack, whose entries are byte ranges of it, is written once, whole,
as one file (every range the checkpoint's chains name in it verified), not split into a
file per partition: the manifest is restored byte for byte, and it names the ranges.

Nothing under a restored name is touched until the whole checkpoint is on disk and
verified: every artifact is verified when it is read from the store; every file is
written into a fresh staging directory inside ``DIR`` (``.cairn-restore-*``, each file
fsynced); the staging directory is checked again (``store``: loaded with cairn,
``file://``, prefix ``""``, and every digest checked; ``partitions``: every file read
back and its SHA-256 compared with the verified bytes it was written from); only then
is each file renamed to its final name (one atomic rename each, the manifest last) and
the staging directory removed. A failure
before the renames (a damaged artifact, a full disk, a refused link) leaves ``DIR`` as
it was; only a machine stopping during the renames themselves could leave some names
renamed and others not.

A name that already holds exactly the bytes to restore is left as it is (restoring the
same checkpoint twice, or two checkpoints that share links, changes nothing). A name
that holds other bytes is refused (exit 2), naming it, unless ``--overwrite``: a restore
never silently replaces a file. A directory or special file where a file is to go is
refused in any case.

``DIR`` itself may be a symbolic link (the user named it), but nothing below it is
followed or replaced: if a file to be restored, or a directory on the way to one, is
already a symbolic link in ``DIR``, the restore is refused (exit 2) naming the link,
before any file is written; and each file is written and renamed relative to directory
descriptors opened without following links (:mod:`cairn.cli.files`), so a link that
appears meanwhile is refused too. Remove the link, or restore into another directory.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from cairn import CheckpointId, IntegrityError, ObjectStoreCheckpointer
from cairn.cli.copy import directory_bytes, stored_bytes
from cairn.cli.errors import CliError, ExitCode, describe
from cairn.cli.files import (
    check_target_dir,
    existing_kind,
    find_link,
    move_into,
    refuse_link,
    write_atomic,
)
from cairn.cli.progress import Transfer, chain_bytes
from cairn.cli.session import open_checkpointer
from cairn.format.integrity import sha256_hex

__all__ = ["STAGING_PREFIX", "Layout", "Restored", "plan_files", "plan_partition_files", "restore"]

STAGING_PREFIX = ".cairn-restore-"


class Layout(enum.StrEnum):
    """The layouts ``cairn restore --layout`` writes (see the module docstring)."""

    STORE = "store"
    PARTITIONS = "partitions"


@dataclass(frozen=True)
class Restored:
    """What was restored: the checkpoint, the directory, and each file with its size.

    ``actions`` says, per file, ``created``, ``replaced`` (``--overwrite``) or
    ``unchanged`` (it already held these bytes).
    """

    checkpoint_id: CheckpointId
    epoch: int
    target: Path
    files: list[tuple[str, int]]
    actions: dict[str, str] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        """The bytes of all the files restored."""
        return sum(size for _, size in self.files)


async def plan_files(
    ckpt: ObjectStoreCheckpointer,
    cid: CheckpointId,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, list[tuple[str, bytes | memoryview]]]:
    """The epoch of ``cid`` and the files to write, relative paths with their bytes.

    Every artifact is loaded and verified (``progress``: called with the bytes of each as
    it is); the manifest comes last in the list, after its parts if it has any.
    """
    loaded = await ckpt.load(cid, verify=True, progress=progress)
    files: dict[str, bytes | memoryview] = dict(sorted((await stored_bytes(ckpt, loaded)).items()))
    for source, entry in sorted(loaded.source_offsets.items()):
        body = msgspec.json.format(msgspec.json.encode(entry), indent=2)
        files[f"{cid}/offsets/{source}.json"] = body
    for part in loaded.manifest.parts:  # a large manifest's parts, each checked by digest
        path = ckpt.paths.resolve(cid, part.path)
        files[f"{cid}/{part.path}"] = memoryview(
            await ckpt.load_artifact(path, expected_sha256=part.sha256)
        )
    manifest = await ckpt.load_artifact(ckpt.paths.manifest(cid))
    files[f"{cid}/manifest.json"] = memoryview(manifest)
    return loaded.epoch, list(files.items())


async def plan_partition_files(
    ckpt: ObjectStoreCheckpointer,
    cid: CheckpointId,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, list[tuple[str, bytes | memoryview]]]:
    """The epoch of ``cid`` and the files of its ``partitions`` layout (see the module
    docstring), relative paths with their bytes: every link decoded and verified."""
    loaded = await ckpt.load(cid, verify=True, progress=progress)
    files: dict[str, bytes | memoryview] = {}
    for (operator, partition), links in sorted(loaded.chains.items()):
        deltas = 0
        for link in links:
            if link.entry.is_delta:
                deltas += 1
                name = f"{operator}/partition-{partition}.delta-{deltas}"
            else:
                name = f"{operator}/partition-{partition}.snapshot"
            files[name] = memoryview(link.data)
    for (operator, partition), entries in sorted(loaded.directories.items()):
        for file in entries:
            path = ckpt.paths.resolve(file.owner or cid, file.path)
            data = await ckpt.load_artifact(path, expected_sha256=file.sha256)
            files[f"{operator}/partition-{partition}/{file.relative_path}"] = memoryview(data)
    for source, entry in sorted(loaded.source_offsets.items()):
        files[f"offsets/{source}.json"] = msgspec.json.format(msgspec.json.encode(entry), indent=2)
    return loaded.epoch, list(files.items())


def _same_on_disk(staging: Path, files: list[tuple[str, bytes | memoryview]]) -> str | None:
    """The first file of ``files`` whose staged copy does not hash as its bytes do."""
    for relative, data in files:
        if sha256_hex((staging / relative).read_bytes()) != sha256_hex(data):
            return relative
    return None


def _classify(target: Path, files: list[tuple[str, bytes | memoryview]]) -> dict[str, str]:
    return {relative: existing_kind(target / relative, data) for relative, data in files}


def _refuse_existing(target: Path, kinds: dict[str, str], overwrite: bool) -> None:
    blocked = [relative for relative, kind in kinds.items() if kind == "other"]
    if blocked:
        raise CliError(
            f"cannot restore into {target}: {target / blocked[0]} is a directory or a "
            "special file, where a restored file goes",
            ExitCode.USAGE,
        )
    different = [relative for relative, kind in kinds.items() if kind == "different"]
    if different and not overwrite:
        more = f" and {len(different) - 1} more" if len(different) > 1 else ""
        raise CliError(
            f"cannot restore into {target}: {target / different[0]}{more} already "
            "exist(s) with other content; pass --overwrite to replace them, or restore "
            "into an empty directory",
            ExitCode.USAGE,
        )


def _stage(staging: Path, files: list[tuple[str, bytes | memoryview]], bar: Transfer) -> None:
    for relative, data in files:
        write_atomic(staging / relative, data, root=staging)
        bar.advance(memoryview(data).nbytes)


def _move_all(staging: Path, target: Path, relatives: list[str]) -> None:
    for relative in relatives:
        move_into(staging, target, relative)


async def restore(
    ckpt: ObjectStoreCheckpointer,
    cid: CheckpointId,
    target: Path,
    progress: Transfer,
    *,
    overwrite: bool = False,
    layout: Layout = Layout.STORE,
) -> Restored:
    """Restore ``cid`` into directory ``target`` (absolute; created if missing), verified,
    in ``layout``.

    Raises :class:`CliError` with exit 2 when ``target`` is a file, a symbolic link
    stands where a file is to be written, or a file there holds other bytes and not
    ``overwrite`` (see the module docstring); with exit 1 when the files written do not
    verify.
    """
    await asyncio.to_thread(check_target_dir, target)
    progress.restart(f"reading {cid}", chain_bytes([await ckpt.load_manifest(cid)]))
    plan = plan_partition_files if layout is Layout.PARTITIONS else plan_files
    epoch, files = await plan(ckpt, cid, progress.advance)
    link = await asyncio.to_thread(find_link, target, [relative for relative, _ in files])
    if link is not None:
        raise refuse_link(link)
    kinds = await asyncio.to_thread(_classify, target, files)
    _refuse_existing(target, kinds, overwrite)
    progress.restart(f"writing {cid}", sum(memoryview(data).nbytes for _, data in files))
    staging = target / f"{STAGING_PREFIX}{secrets.token_hex(6)}"
    try:
        await asyncio.to_thread(_stage, staging, files, progress)
        progress.describe(f"re-verifying {cid} on disk")
        if layout is Layout.PARTITIONS:
            differs = await asyncio.to_thread(_same_on_disk, staging, files)
            if differs is not None:
                raise CliError(
                    f"the files restored into {target} do not verify: {differs} differs "
                    "from the verified bytes written to it",
                    ExitCode.INTEGRITY,
                )
        else:
            staged = open_checkpointer(staging.as_uri(), "", create=False)
            try:
                await directory_bytes(staged, await staged.load(cid, verify=True))
            except IntegrityError as exc:
                raise CliError(
                    f"the files restored into {target} do not verify: {describe(exc)}",
                    ExitCode.INTEGRITY,
                ) from None
        to_move = [relative for relative, _ in files if kinds[relative] != "same"]
        await asyncio.to_thread(_move_all, staging, target, to_move)
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, ignore_errors=True)
    actions = {
        relative: {"absent": "created", "different": "replaced"}.get(kinds[relative], "unchanged")
        for relative, _ in files
    }
    sizes = [(relative, memoryview(data).nbytes) for relative, data in files]
    return Restored(cid, epoch, target, sizes, actions)
