"""Reading the writer record the way tests look at it: its generation and e-tag."""

from __future__ import annotations

from cairn.errors import CheckpointNotFoundError
from cairn.protocol._pointer import decode_writer
from cairn.stores import Store


async def read_generation(store: Store, path: str) -> tuple[int, str | None]:
    """The writer generation ``_writer`` at ``path`` holds (0 when there is none) and its
    e-tag; raises :class:`CorruptManifestError` if the record is damaged."""
    try:
        blob = await store.get(path)
    except CheckpointNotFoundError:
        return 0, None
    return decode_writer(path, bytes(blob.data)).generation, blob.info.e_tag
