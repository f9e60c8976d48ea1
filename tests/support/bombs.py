"""Decompression bombs planted in a store, and a child process that measures a read of one.

A bomb is a real zstd frame of BOMB_BYTES zero bytes (a few KB stored), which declares
its content size in its header. :func:`plant_bomb` writes it over an artifact saved with
``compression="zstd"`` and rewrites the manifest so that every check made before decoding
passes: the entry's ``stored_size_bytes`` is the bomb's length, while its ``size_bytes``
(the decoded size) and SHA-256 stay those of the bytes saved.

Usage as a child (one read path, on a memory store, its peak RSS measured; Linux)::

    python tests/support/bombs.py PATH BOMB_FILE

``PATH`` is one of :data:`PATHS`. The child saves a small checkpoint, then a second one
whose artifact it replaces with the bomb read from ``BOMB_FILE``; reads the first one the
same way (so that imports, thread pools and buffers exist before it measures), notes its
peak RSS, reads the bomb, and prints one JSON object: ``grew`` (bytes the peak RSS grew
by), ``error`` (the type of what the read raised), ``path`` (the path that error names)
and ``loaded`` (for ``load_latest``: the epoch it fell back to).

A DCP save compressed keeps each item as a zstd frame inside its rank's object:
:func:`plant_bomb_in_dcp_item` replaces one item's frame with a bomb padded (by a
skippable frame) to the frame's stored length, so that the object's index, its digest
and the manifest all still hold, and only decoding can tell.

Importable without side effects: the tests use :func:`make_bomb`, :func:`plant_bomb` and
:func:`plant_bomb_in_dcp_item`.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from cairn import CheckpointData, CheckpointId, ObjectStoreCheckpointer
from cairn.format._buffer import Buffer
from cairn.format.manifest import encode_manifest

BOMB_BYTES = 512 * 1024 * 1024
"""What a bomb decodes to: 512 MiB."""

RECORDED = 1200
"""The decoded size the bombed artifact's entry records."""

STATE = bytes(range(256)) * 4 + b"x" * (RECORDED - 1024)
"""The bytes the bombed artifact was saved with (RECORDED of them)."""

PATHS = ("load", "load_chain", "load_latest", "load_artifact_to", "dcp")
"""The read paths the child can measure."""


@functools.cache
def make_bomb(size: int = BOMB_BYTES, window_log: int = 21) -> bytes:
    """A zstd frame of ``size`` zero bytes that declares that content size, compressed
    with a window of ``2**window_log`` bytes (21 is what cairn's level 3 uses)."""
    import zstandard

    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=window_log)
    out = io.BytesIO()
    zeros = bytes(1024 * 1024)
    compressor = zstandard.ZstdCompressor(compression_params=params)
    with compressor.stream_writer(out, size=size, closefd=False) as writer:
        for _ in range(size // len(zeros)):
            writer.write(zeros)
    return out.getvalue()


async def plant_bomb(
    ckpt: ObjectStoreCheckpointer,
    checkpoint_id: CheckpointId,
    operator: str,
    bomb: Buffer,
    partition: int = 0,
) -> str:
    """Write ``bomb`` over the artifact of ``operator``/``partition`` in ``checkpoint_id``
    and record its stored size in the manifest; the artifact's store path."""
    manifest = await ckpt.load_manifest(checkpoint_id)
    group = manifest.operators[operator]
    [entry] = [p for p in group.partitions if p.partition_id == partition]
    path = ckpt.paths.resolve(entry.owner or checkpoint_id, entry.path)
    await ckpt.store.put(path, bomb)
    bombed = msgspec.structs.replace(entry, stored_size_bytes=memoryview(bomb).nbytes)
    partitions = tuple(bombed if p is entry else p for p in group.partitions)
    operators = dict(manifest.operators)
    operators[operator] = msgspec.structs.replace(group, partitions=partitions)
    forged = msgspec.structs.replace(manifest, operators=operators)
    await ckpt.store.put(ckpt.paths.manifest(checkpoint_id), encode_manifest(forged))
    return path


SKIPPABLE_FRAME_MAGIC = 0x184D2A50
"""The first of zstd's skippable-frame magic numbers: a decoder passes over its payload."""


def padded_to(frame: Buffer, size: int) -> bytes:
    """``frame`` followed by a skippable frame, ``size`` bytes in all."""
    stored = bytes(frame)
    pad = size - len(stored) - 8
    assert pad >= 0, f"a bomb of {len(stored)} bytes does not fit into {size}"
    header = SKIPPABLE_FRAME_MAGIC.to_bytes(4, "little") + pad.to_bytes(4, "little")
    return stored + header + bytes(pad)


def plant_bomb_in_dcp_item(
    store: Any, prefix: str, checkpoint_id: CheckpointId, bomb: Buffer
) -> tuple[str, int]:
    """Write ``bomb`` over the frame of the one item of the compressed DCP checkpoint
    ``checkpoint_id`` in ``store`` under ``prefix`` (padded to the frame's length); the
    object's store path and the item's recorded length. Call it outside an event loop."""
    from cairn import CheckpointPaths
    from cairn.torch import CairnReader
    from support.dcp import item_records

    [record] = item_records(CairnReader(store, checkpoint_id=checkpoint_id, prefix=prefix)).values()
    assert record.stored_length is not None, "the item is a frame of a compressed save"
    start, end = record.offset, record.offset + record.stored_length
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(prefix))
    path = ckpt.paths.resolve(checkpoint_id, record.artifact)

    async def rewrite() -> None:
        data = bytearray(memoryview((await ckpt.store.get(path)).data))
        data[start:end] = padded_to(bomb, end - start)
        await ckpt.store.put(path, bytes(data))

    asyncio.run(rewrite())
    return path, record.length


class Discard(io.BytesIO):
    """A file that keeps nothing, and remembers the largest write it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.total = 0

    def write(self, data: Buffer, /) -> int:
        size = memoryview(data).nbytes
        self.largest = max(self.largest, size)
        self.total += size
        return size


# -- the child -----------------------------------------------------------------------------


def peak_rss() -> int:
    """The peak resident set size of this process's own memory, in bytes (Linux).

    ``VmHWM``, not ``getrusage``'s ``ru_maxrss``: Linux carries ``ru_maxrss`` over from
    the parent through fork and exec, so a child of a large pytest process would start
    with the parent's peak and hide its own growth; ``VmHWM`` starts afresh at exec.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


async def _measure(what: str, bomb: bytes) -> dict[str, Any]:
    from obstore.store import MemoryStore

    ckpt = ObjectStoreCheckpointer(MemoryStore(), compression="zstd")
    good = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): STATE}))
    bad = await ckpt.save(CheckpointData(epoch=2, snapshots={("op", 0): STATE}))
    path = await plant_bomb(ckpt, bad.checkpoint_id, "op", bomb)
    entries = {m.checkpoint_id: m.operators["op"].partitions[0] for m in (good, bad)}

    async def read(cid: CheckpointId) -> Any:
        if what == "load":
            return await ckpt.load(cid)
        if what == "load_chain":
            return await ckpt.load_chain(cid, "op", 0)
        if what == "load_artifact_to":
            entry = entries[cid]
            artifact = ckpt.paths.resolve(cid, entry.path)
            return await ckpt.load_artifact_to(
                artifact, Discard(), expected_sha256=entry.sha256, codec="zstd"
            )
        raise AssertionError(what)

    if what == "load_latest":
        await ckpt.load(good.checkpoint_id)
        before = peak_rss()
        loaded = await ckpt.load_latest()
        assert loaded is not None
        return {"grew": peak_rss() - before, "loaded": loaded.epoch, "path": path}
    await read(good.checkpoint_id)
    before = peak_rss()
    try:
        await read(bad.checkpoint_id)
    except Exception as exc:
        return {"grew": peak_rss() - before, "error": type(exc).__name__, "path": exc.path}  # type: ignore[attr-defined]
    return {"grew": peak_rss() - before, "error": None, "path": None}


def _measure_dcp(bomb: bytes) -> dict[str, Any]:
    import torch
    from obstore.store import MemoryStore
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from cairn.torch import CairnReader, CairnWriter

    store = MemoryStore()
    ids = []
    weights = torch.randn(100_000)  # barely compresses: a frame a bomb fits into
    for epoch in (1, 2):
        writer = CairnWriter(store, epoch=epoch, prefix="dcp/", compression="zstd")
        dcp_save({"w": weights}, storage_writer=writer, no_dist=True)
        assert writer.checkpoint_id is not None
        ids.append(writer.checkpoint_id)
    path, _ = plant_bomb_in_dcp_item(store, "dcp/", ids[1], bomb)

    def read(cid: CheckpointId) -> None:
        reader = CairnReader(store, checkpoint_id=cid, prefix="dcp/")
        dcp_load({"w": torch.zeros(100_000)}, storage_reader=reader, no_dist=True)

    read(ids[0])
    before = peak_rss()
    try:
        read(ids[1])
    except CheckpointException as exc:
        [(error, _)] = exc.failures.values()
        return {"grew": peak_rss() - before, "error": type(error).__name__, "path": error.path}  # type: ignore[attr-defined]
    return {"grew": peak_rss() - before, "error": None, "path": path}


def main(argv: list[str]) -> None:
    """Measure the read path ``argv[0]`` of the bomb in file ``argv[1]``; print the JSON."""
    what, bomb_file = argv
    bomb = Path(bomb_file).read_bytes()
    result = _measure_dcp(bomb) if what == "dcp" else asyncio.run(_measure(what, bomb))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for support.dcp
    main(sys.argv[1:])
