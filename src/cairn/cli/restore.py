"""``cairn restore``: write one checkpoint's verified artifacts and manifest as local files.

The directory written mirrors the store's layout with an empty base prefix, so it is
itself a checkpoint store holding that one checkpoint::

    DIR/{id}/manifest.json                              the manifest, byte for byte
    DIR/{id}/offsets/{source}.json                      source offsets (from the manifest)
    DIR/{owner}/operators/{operator}/partition-{p}.snap|.delta
                                                        every link of every restore chain

``{owner}`` is the checkpoint whose upload holds the bytes: ``{id}`` itself, or an
earlier checkpoint of its chain. Every artifact is verified when it is read from the
store, written atomically (:func:`cairn.cli.files.write_atomic`), the manifest last;
then the directory is loaded back with cairn (``file://DIR``, prefix ``""``) and every
digest checked again, so what is on disk is proven to be the checkpoint.

``DIR`` itself may be a symbolic link (the user named it), but nothing below it is
followed or replaced: if a file to be restored, or a directory on the way to one, is
already a symbolic link in ``DIR``, the restore is refused (exit 2) naming the link,
before any file is written; and each file is written relative to directory descriptors
opened without following links (:func:`cairn.cli.files.write_atomic`), so a link
that appears meanwhile is refused too. Remove the link, or restore into another
directory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import msgspec

from cairn import CheckpointId, IntegrityError, ObjectStoreCheckpointer
from cairn.cli.errors import CliError, ExitCode, describe
from cairn.cli.files import check_target_dir, find_link, refuse_link, write_atomic
from cairn.cli.progress import Transfer
from cairn.cli.session import open_checkpointer

__all__ = ["Restored", "plan_files", "restore"]


@dataclass(frozen=True)
class Restored:
    """What was written: the checkpoint, the directory, and each file with its size."""

    checkpoint_id: CheckpointId
    epoch: int
    target: Path
    files: list[tuple[str, int]]

    @property
    def size_bytes(self) -> int:
        """The bytes written in all."""
        return sum(size for _, size in self.files)


async def plan_files(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId
) -> tuple[int, list[tuple[str, bytes | memoryview]]]:
    """The epoch of ``cid`` and the files to write, relative paths with their bytes.

    Every artifact is loaded and verified; the manifest comes last in the list.
    """
    loaded = await ckpt.load(cid, verify=True)
    files: dict[str, bytes | memoryview] = {}
    for _key, chain in sorted(loaded.chains.items()):
        for link in chain:
            files[f"{link.owner}/{link.entry.path}"] = memoryview(link.data)
    for source, entry in sorted(loaded.source_offsets.items()):
        body = msgspec.json.format(msgspec.json.encode(entry), indent=2)
        files[f"{cid}/offsets/{source}.json"] = body
    manifest = await ckpt.load_artifact(ckpt.paths.manifest(cid))
    files[f"{cid}/manifest.json"] = memoryview(manifest)
    return loaded.epoch, list(files.items())


async def restore(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId, target: Path, progress: Transfer
) -> Restored:
    """Restore ``cid`` into directory ``target`` (absolute; created if missing), then
    re-verify it.

    Raises :class:`CliError` with exit 2 when ``target`` is a file or a symbolic link
    stands where a file is to be written (see the module docstring), and with exit 1
    when the written files do not verify.
    """
    await asyncio.to_thread(check_target_dir, target)
    epoch, files = await plan_files(ckpt, cid)
    link = await asyncio.to_thread(find_link, target, [relative for relative, _ in files])
    if link is not None:
        raise refuse_link(link)
    progress.describe(f"restoring {cid}")
    progress.set_total(sum(memoryview(data).nbytes for _, data in files))
    written: list[tuple[str, int]] = []
    for relative, data in files:
        await asyncio.to_thread(write_atomic, target / relative, data, root=target)
        size = memoryview(data).nbytes
        written.append((relative, size))
        progress.advance(size)
    progress.describe(f"re-verifying {target}")
    local = open_checkpointer(target.as_uri(), "", create=False)
    try:
        await local.load(cid, verify=True)
    except IntegrityError as exc:
        raise CliError(
            f"the files restored into {target} do not verify: {describe(exc)}",
            ExitCode.INTEGRITY,
        ) from None
    return Restored(cid, epoch, target, written)
