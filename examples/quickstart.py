"""cairn in one page: save, list, load and verify checkpoints on a local directory store.

Run it with ``python examples/quickstart.py [DIR]`` once cairn is installed (``bash
scripts/demo.sh`` installs it into ``.venv``). It saves three checkpoints of a small
keyed-count job, lists them, restores the newest with every digest verified, then
damages one byte of a stored artifact and shows that the damage is caught and that
``load_latest`` falls back to the newest intact checkpoint.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import tempfile
from pathlib import Path

from cairn import (
    CheckpointData,
    IntegrityMismatchError,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
    open_store,
)

PARTITIONS = 4


def count_words(lines: list[str]) -> list[collections.Counter[str]]:
    """Keyed counts, partitioned by the hash of the word."""
    counts = [collections.Counter[str]() for _ in range(PARTITIONS)]
    for line in lines:
        for word in line.split():
            counts[sum(word.encode()) % PARTITIONS][word] += 1
    return counts


def encode(counter: collections.Counter[str]) -> bytes:
    return "\n".join(f"{w} {n}" for w, n in sorted(counter.items())).encode()


async def main(store_url: str) -> int:
    store = open_store(store_url)
    ckpt = ObjectStoreCheckpointer(store)
    text = ["the quick brown fox", "jumps over the lazy dog", "the dog sleeps"] * 50

    for epoch, upto in enumerate((50, 100, 150), start=1):
        counts = count_words(text[:upto])
        manifest = await ckpt.save(
            CheckpointData(
                epoch=epoch,
                snapshots={("word-count", p): encode(c) for p, c in enumerate(counts)},
                source_offsets={"lines": SourceOffsetEntry("file", {"line": str(upto)}, epoch)},
            )
        )
        print(f"saved   epoch {epoch}  {manifest.checkpoint_id}  {manifest.total_size_bytes} B")

    ids = await ckpt.list_checkpoints()
    print(f"listed  {len(ids)} committed checkpoints, latest = {await ckpt.read_latest()}")

    restored = await ckpt.load_latest()
    assert restored is not None
    expected = {("word-count", p): encode(c) for p, c in enumerate(count_words(text))}
    same = {k: bytes(v) for k, v in restored.artifacts.items()} == expected
    resume = restored.source_offsets["lines"].offsets["line"]
    print(f"loaded  epoch {restored.epoch}, every SHA-256 verified, resume at line {resume}")
    print(f"state   equals a fresh recount: {same}")

    victim = ckpt.paths.snapshot(restored.checkpoint_id, "word-count", 0)
    damaged = bytearray((await ckpt.store.get(victim)).data)
    damaged[0] ^= 0xFF
    await ckpt.store.put(victim, bytes(damaged))
    try:
        await ckpt.load(restored.checkpoint_id)
        caught = False
    except IntegrityMismatchError as exc:
        caught = True
        print(f"damage  caught: {exc}")
    fallback = await ckpt.load_latest()
    assert fallback is not None
    print(f"recover load_latest falls back to epoch {fallback.epoch} (intact)")
    ok = same and caught and fallback.epoch == 2
    print("verdict", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        target = Path(sys.argv[1])
        target.mkdir(parents=True, exist_ok=True)
        sys.exit(asyncio.run(main(target.resolve().as_uri())))
    with tempfile.TemporaryDirectory(prefix="cairn-demo-") as tmp:
        sys.exit(asyncio.run(main(Path(tmp).as_uri())))
