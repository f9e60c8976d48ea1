"""``cairn copy``: the command's side of the library's copy (:mod:`cairn.protocol.copy`).

What a copy does and guarantees is the library's, written down in
:mod:`cairn.protocol.copy`; here its failures are worded as every ``cairn`` error is
(:func:`cairn.cli.errors.describe`), and its progress is drawn on a bar.
"""

from __future__ import annotations

from cairn import CheckpointId, ObjectStoreCheckpointer
from cairn.cli.errors import describe
from cairn.cli.progress import Transfer
from cairn.protocol import copy
from cairn.protocol.copy import Copied, directory_bytes, stored_bytes

__all__ = ["Copied", "copy_checkpoints", "directory_bytes", "stored_bytes"]


async def copy_checkpoints(
    source: ObjectStoreCheckpointer,
    target: ObjectStoreCheckpointer,
    ids: list[CheckpointId],
    progress: Transfer,
) -> list[Copied]:
    """Copy ``ids`` (and any parent a reference-style manifest needs), oldest first, with
    :func:`cairn.protocol.copy.copy_checkpoints`; ``progress`` advances by the bytes of
    each artifact read and verified from the source. One :class:`Copied` per checkpoint
    handled, in copy order; store failures are raised."""
    return await copy.copy_checkpoints(
        source, target, ids, progress=progress, describe_error=describe
    )
