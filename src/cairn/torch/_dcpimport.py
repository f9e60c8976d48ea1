"""Importing a DCP directory: one ``FileSystemWriter`` save committed as one checkpoint.

:func:`import_dcp_async` commits a directory ``FileSystemWriter`` wrote (its format:
:mod:`cairn.torch._dcpfiles`) as one cairn checkpoint that
:class:`~cairn.torch.CairnReader` loads bit-exactly: each ``__{r}_{n}.distcp`` file
becomes one object of ranges of operator ``rank-{r}``, as a rank's save stores its
items, and DCP's metadata is stored pickled whole with a record per item (see
docs/format.md, section "DCP checkpoints").

Invariants:

* nothing is committed unless the directory is whole: its metadata and files are
  checked before anything is uploaded, and each item again (its CRC-32s, its dtype and
  shape) as the upload reads it (see :mod:`cairn.torch._dcpfiles` for what can and
  cannot be checked); a failure ends the save with nothing committed;
* from the import on, cairn's SHA-256 digests, computed as the bytes are uploaded,
  protect every item.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re
import time
import uuid
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.planner import WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.layout import validate_checkpoint_name
from cairn.integrations._interface import SaveMeter, TwoPhaseSave, begin
from cairn.stores.localfiles import LocalDirectory
from cairn.torch._dcpfiles import (
    ZIP_MAGIC,
    DcpDir,
    DcpItem,
    Progress,
    absolute,
    load_item,
    no_progress,
    read_dcp_dir,
)
from cairn.torch._finish import commit_dcp
from cairn.torch._format import rank_operator
from cairn.torch._rankobject import ItemRanges

__all__ = ["ImportedDcp", "import_dcp_async"]

_RANK_FILE = re.compile(r"__(0|[1-9][0-9]*)_(0|[1-9][0-9]*)\.distcp")


@dataclasses.dataclass(frozen=True)
class ImportedDcp:
    """What :func:`import_dcp` committed: the checkpoint, and what it read.

    Every item was checked for structure and size, and all but the unchecked ones
    against the CRC-32s ``torch.save`` recorded.

    Attributes:
        checkpoint_id: The checkpoint committed.
        name: Its name.
        epoch: Its epoch.
        source: The directory read.
        files: The number of ``.distcp`` files read.
        tensor_items: The number of tensor items.
        byte_items: The number of byte items.
        unchecked_items: Byte items stored raw, which carry no checksum to check.
        size_bytes: The bytes read from the directory.
        uploaded_bytes: The bytes the checkpoint holds (tensors as raw bytes).
    """

    checkpoint_id: CheckpointId
    name: str | None
    epoch: int
    source: Path
    files: int
    tensor_items: int
    byte_items: int
    unchecked_items: int
    size_bytes: int
    uploaded_bytes: int


def _default_name(source: Path) -> str:
    try:
        return validate_checkpoint_name(source.name)
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"the directory's name is not a usable checkpoint name ({exc}): give one"
        ) from None


async def import_dcp_async(
    ckpt: ObjectStoreCheckpointer,
    source: Path,
    *,
    epoch: int = 0,
    name: str | None = None,
    progress: Progress = no_progress,
) -> ImportedDcp:
    """:func:`import_dcp` on ``ckpt`` (async).

    Args:
        ckpt: The checkpointer to commit through.
        source: The DCP directory to import, absolute.
        epoch: The epoch the checkpoint records, >= 0.
        name: The checkpoint's name; None (the default) is the directory's name.
        progress: Told the bytes of each item once it is read.

    Returns:
        The checkpoint committed, and what was read.

    Raises:
        IntegrityError: A file is missing, short or damaged; nothing is committed.
        InvalidInputError: What import does not read, a relative ``source``, or an
            unusable ``epoch`` or ``name``.
    """
    if type(epoch) is not int or epoch < 0:
        raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
    root = absolute(source)
    chosen = _default_name(root) if name is None else validate_checkpoint_name(name)
    scanned = await asyncio.to_thread(read_dcp_dir, LocalDirectory(root))
    meter = SaveMeter()
    with meter.counting():
        async with await begin(ckpt, CheckpointId.now()) as save:
            return await _import_into(save, ckpt, root, scanned, epoch, chosen, progress, meter)


async def _import_into(
    save: TwoPhaseSave,
    ckpt: ObjectStoreCheckpointer,
    root: Path,
    scanned: DcpDir,
    epoch: int,
    chosen: str,
    progress: Progress,
    meter: SaveMeter,
) -> ImportedDcp:
    """Upload every item of ``scanned`` into ``save`` and commit it, its statistics
    measured by ``meter``."""
    cid = save.checkpoint_id
    results: list[WriteResult] = []
    next_partition: dict[str, int] = {}
    counts = {"tensor": 0, "bytes": 0, "raw": 0, "read": 0}
    counted: set[Any] = set()

    def load(item: DcpItem) -> Any:
        value, size = load_item(scanned, item)
        if item.index not in counted:  # a retried upload reads it again
            counted.add(item.index)
            counts["tensor" if item.dtype else "bytes"] += 1
            if not item.dtype and not value.getvalue().startswith(ZIP_MAGIC):
                counts["raw"] += 1
            counts["read"] += size
            progress(size)
        return value

    by_index = {item.index: item for items in scanned.files.values() for item in items}

    def resolve(write: WriteItem) -> Any:
        return load(by_index[write.index])

    codec = ckpt.codec
    meter.uploading = time.perf_counter()
    for file, items in scanned.files.items():
        match = _RANK_FILE.fullmatch(file)
        operator = rank_operator(int(match.group(1)) if match else 0)
        partition = next_partition.get(operator, 0)
        writes = [
            WriteItem(
                index=item.index,
                type=WriteItemType.TENSOR if item.dtype else WriteItemType.BYTE_IO,
            )
            for item in items
        ]
        # The file becomes one object of ranges, as a rank's save does.
        source = ItemRanges(
            writes, resolve, off_loop=True, size_of=lambda w: by_index[w.index].length, codec=codec
        )
        [entry] = await save.upload([(operator, partition, False, source)])
        results += source.results(operator, entry)
        next_partition[operator] = partition + 1
    metadata = copy.copy(scanned.metadata)
    save_id = str(uuid.uuid4())
    committed = await commit_dcp(
        ckpt, save, epoch, metadata, [results], save_id, chosen, None, meter
    )
    uploaded = sum(e.size_bytes for _, e in committed.partition_entries())
    return ImportedDcp(
        cid,
        chosen,
        epoch,
        root,
        len(scanned.files),
        counts["tensor"],
        counts["bytes"],
        counts["raw"],
        counts["read"],
        uploaded,
    )
