"""Exporting a DCP checkpoint as DCP's own directory, every byte verified on the way out.

:func:`export_dcp_async` writes a cairn DCP checkpoint as the directory
``FileSystemWriter`` writes (:mod:`cairn.torch._dcpfiles`): one ``__{r}_{n}.distcp`` per
artifact ``operators/rank-{r}/partition-{n}``, then ``.metadata``, which
``FileSystemReader`` and ``dcp_to_torch_save`` read bit-exactly.

Invariants:

* every item is verified against its SHA-256 as it is read from the store (as
  :class:`~cairn.torch.CairnReader` does), and again once written: the staged directory
  is read back as an import reads it (its structure and sizes, each tensor's CRC-32s)
  and each item's bytes checked against cairn's record;
* the latest (or the newest of a name) is the newest DCP checkpoint that exports
  whole: one whose items do not read back verified from the store (damage, an artifact
  gone) is passed over for the next older one, as
  :func:`~cairn.torch.load_latest` passes over it, and the result names it
  (:attr:`ExportedDcp.passed_over`). A checkpoint asked for by id is exported or fails;
* the directory appears whole and verified, or not at all: it is written into a
  :class:`~cairn.stores.localfiles.StagedTree` beside the destination (every file made
  relative to its descriptor, fsynced) and renamed onto the destination, which must be
  missing or an empty directory (never a link), only then; any failure leaves the
  destination as it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import CorruptManifestError, IntegrityMismatchError
from cairn.format.ids import CheckpointId
from cairn.format.integrity import sha256_hex
from cairn.integrations._interface import DAMAGE, bounded_gather
from cairn.stores.localfiles import StagedTree
from cairn.torch._dcpfiles import (
    METADATA_FILE,
    DcpDir,
    Progress,
    absolute,
    load_item,
    no_progress,
    read_dcp_dir,
)
from cairn.torch._format import ItemRecord, tensor_bytes, tensor_from_bytes
from cairn.torch._itemtable import with_plain_chunks
from cairn.torch._opendcp import ExportChoice, Opened, load_records
from cairn.torch._reader import verified_pieces
from cairn.torch._target import Target

__all__ = ["ExportedDcp", "export_dcp_async"]

_RANK_OPERATOR = re.compile(r"rank-(0|[1-9][0-9]*)")


@dataclasses.dataclass(frozen=True)
class ExportedDcp:
    """What :func:`export_dcp` wrote: the checkpoint, the directory, and its files.

    Attributes:
        checkpoint_id: The checkpoint exported.
        name: Its name, or None.
        epoch: Its epoch.
        target: The directory written.
        items: The number of DCP items written.
        files: Each file written with its size in bytes (``.metadata`` last).
        passed_over: The newer checkpoints chosen first and passed over because their
            items did not read back verified from the store, newest first, each with
            why. Only an export of the latest or of a name passes over one.
    """

    checkpoint_id: CheckpointId
    name: str | None
    epoch: int
    target: Path
    items: int
    files: tuple[tuple[str, int], ...]
    passed_over: tuple[tuple[CheckpointId, str], ...] = ()

    @property
    def size_bytes(self) -> int:
        """The bytes of all the files written."""
        return sum(size for _, size in self.files)


def _file_of(opened: Opened, artifact: str, operators: dict[str, str]) -> str:
    operator = operators.get(artifact, "")
    match = _RANK_OPERATOR.fullmatch(operator)
    entry = opened.entries[artifact]
    if match is None:
        raise CorruptManifestError(
            str(opened.checkpoint_id),
            f"DCP items are stored in {artifact!r} of operator {operator!r}, not a rank's",
        )
    return f"__{match.group(1)}_{entry.partition_id}.distcp"


def _write_file(
    tree: StagedTree,
    items: Sequence[tuple[MetadataIndex, ItemRecord]],
    pieces: Sequence[memoryview],
    file: str,
) -> dict[MetadataIndex, _StorageInfo]:
    """Write verified items into ``file`` of ``tree`` as FileSystemWriter does; their
    storage info."""
    infos: dict[MetadataIndex, _StorageInfo] = {}
    with tree.create(file) as stream:
        for (index, record), piece in zip(items, pieces, strict=True):
            offset = stream.tell()
            if record.dtype:
                torch.save(tensor_from_bytes(piece, record.dtype, record.shape), stream)
            else:
                stream.write(piece)
            infos[index] = _StorageInfo(file, offset, stream.tell() - offset)
        stream.flush()
        os.fsync(stream.fileno())
    return infos


def _write_metadata(tree: StagedTree, metadata: Metadata) -> int:
    """Write ``.metadata`` into ``tree``; its size."""
    with tree.create(METADATA_FILE) as stream:
        pickle.dump(metadata, stream)
        stream.flush()
        os.fsync(stream.fileno())
        return stream.tell()


def _reverify(tree: StagedTree, records: dict[MetadataIndex, ItemRecord]) -> DcpDir:
    """Read the staged directory back as an import would, and check each item's bytes
    against cairn's record; what was read."""
    scanned = read_dcp_dir(tree)
    count = 0
    for items in scanned.files.values():
        for item in items:
            value, _ = load_item(scanned, item)
            if isinstance(value, torch.Tensor):
                data: Any = tensor_bytes(value, item.index.fqn)[0]
            else:
                data = value.getbuffer()
            record = records[item.index]
            actual = sha256_hex(data)
            if actual != record.sha256:
                raise IntegrityMismatchError(
                    str(tree.path / item.file),
                    record.sha256,
                    actual,
                    what=f"sha256 of item {item.index.fqn!r} as written",
                )
            count += 1
    if count != len(records):
        raise CorruptManifestError(str(tree.path), f"{count} items written of {len(records)}")
    return scanned


async def export_dcp_async(
    ckpt: ObjectStoreCheckpointer,
    target: Target | None,
    dest: Path,
    *,
    skip: frozenset[CheckpointId] = frozenset(),
    store: object = None,
    progress: Progress = no_progress,
) -> ExportedDcp:
    """:func:`~cairn.torch.export_dcp` on ``ckpt`` (async).

    Args:
        ckpt: The checkpointer to read from.
        target: The checkpoint, as :func:`~cairn.torch._opendcp.open_dcp` takes it
            (None: the latest DCP checkpoint).
        dest: The directory to write, absolute, missing or empty.
        skip: Checkpoints the latest is not chosen among.
        store: What error messages name as the store searched.
        progress: Told the bytes of each file once it is written.

    Returns:
        The checkpoint exported, and the files written.

    Raises:
        CheckpointNotFoundError: No such checkpoint, or no DCP checkpoint at all.
        IntegrityError: An item is damaged: of the checkpoint asked for by id, or of
            every candidate for the latest or a name (the newest's damage); nothing is
            written.
        InvalidInputError: ``dest`` is relative or unusable.
    """
    final = absolute(dest)
    choice = ExportChoice(ckpt, target, skip, store)
    while True:
        tree = await asyncio.to_thread(StagedTree, final, "export a DCP checkpoint")
        try:
            opened = await choice.open()
            try:
                await load_records(ckpt, opened, None)
                storage = await _write_items(ckpt, opened, tree, progress)
            except DAMAGE as exc:  # read from the store: the local writes raise OSError
                if choice.passes_over(opened, exc):
                    continue
                raise
            count, sizes = await _finish_tree(opened, tree, final, storage)
            await asyncio.to_thread(tree.publish)
        finally:
            await asyncio.to_thread(tree.close)
        manifest = opened.manifest
        return ExportedDcp(
            opened.checkpoint_id,
            manifest.name,
            manifest.epoch,
            final,
            count,
            sizes,
            choice.passed_over,
        )


async def _write_items(
    ckpt: ObjectStoreCheckpointer, opened: Opened, tree: StagedTree, progress: Progress
) -> dict[MetadataIndex, _StorageInfo]:
    """Write every item of ``opened`` into its file of ``tree``, each verified as read
    from the store; where each item was written."""
    operators = {entry.path: op for op, entry in opened.manifest.partition_entries()}
    per_artifact: dict[str, list[tuple[MetadataIndex, ItemRecord]]] = {}
    for index, record in opened.records.items():
        per_artifact.setdefault(record.artifact, []).append((index, record))
    files = {artifact: _file_of(opened, artifact, operators) for artifact in per_artifact}
    storage: dict[MetadataIndex, _StorageInfo] = {}

    def job(artifact: str) -> Callable[[], Any]:
        async def write_one() -> None:
            items = sorted(per_artifact[artifact], key=lambda pair: pair[1].offset)
            pieces = await verified_pieces(ckpt, opened, artifact, [i for i, _ in items])
            name = files[artifact]
            storage.update(await asyncio.to_thread(_write_file, tree, items, pieces, name))
            progress(sum(p.nbytes for p in pieces))

        return write_one

    await bounded_gather(ckpt.max_concurrent_downloads, [job(a) for a in per_artifact])
    return storage


async def _finish_tree(
    opened: Opened, tree: StagedTree, final: Path, storage: dict[MetadataIndex, _StorageInfo]
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """Write the metadata into ``tree`` beside the items (where ``storage`` says they
    are), then read it all back and check it; the number of items, and each file with
    its size (``.metadata`` last)."""
    metadata = with_plain_chunks(opened.metadata)
    metadata.storage_data = storage
    metadata.version = CURRENT_DCP_VERSION
    save_id = opened.metadata.storage_meta.save_id if opened.metadata.storage_meta else None
    metadata.storage_meta = StorageMeta(checkpoint_id=str(final), save_id=save_id or "")
    metadata_size = await asyncio.to_thread(_write_metadata, tree, metadata)
    scanned = await asyncio.to_thread(_reverify, tree, dict(opened.records))
    count = sum(len(items) for items in scanned.files.values())
    sizes = (*sorted(scanned.sizes.items()), (METADATA_FILE, metadata_size))
    return count, sizes
