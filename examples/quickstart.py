"""cairn in one page: save, list, load and verify checkpoints on a local directory store.

Run it with ``python examples/quickstart.py [DIR]`` once cairn is installed (``bash
scripts/demo.sh`` installs it into ``.venv``). It saves three checkpoints of a small
keyed-count job, lists them, restores the newest with every digest verified, then
damages one byte of a stored artifact and shows that the damage is caught and that
``load_latest`` falls back to the newest intact checkpoint.

The checkpoints go in DIR itself, its root (``--prefix`` to put them under a prefix),
where ``cairn`` looks by default: after ``python examples/quickstart.py
./checkpoints``, ``cairn list`` in the same directory lists them. Without DIR they go
to a temporary directory, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shlex
import sys
import tempfile
from pathlib import Path

from cairn import (
    CheckpointData,
    CheckpointPaths,
    IntegrityMismatchError,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
    open_store,
)

PARTITIONS = 4
DEFAULT_PREFIX = ""
"""The base prefix ``cairn`` reads when given no ``--prefix``."""


def count_words(lines: list[str]) -> list[collections.Counter[str]]:
    """Keyed counts, partitioned by the hash of the word."""
    counts = [collections.Counter[str]() for _ in range(PARTITIONS)]
    for line in lines:
        for word in line.split():
            counts[sum(word.encode()) % PARTITIONS][word] += 1
    return counts


def encode(counter: collections.Counter[str]) -> bytes:
    return "\n".join(f"{w} {n}" for w, n in sorted(counter.items())).encode()


async def run(store_url: str, prefix: str) -> int:
    """Save, list, load, damage and recover; 0 if every step did what it should."""
    store = open_store(store_url)
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(prefix))
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

    # The manifest names each artifact's object (its name carries the save attempt).
    entry = restored.manifest.operators["word-count"].partitions[0]
    victim = ckpt.paths.resolve(restored.checkpoint_id, entry.path)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--help`` and bad options exit here, before any store is made."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs cairn alone, no extra. The last damaged checkpoint stays damaged: "
        "`cairn verify --all` reports it.",
    )
    parser.add_argument(
        "dir",
        nargs="?",
        metavar="DIR",
        help="local directory for the checkpoints (made if missing); default: a "
        "temporary directory, deleted at the end",
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help="base prefix of the checkpoints in DIR (default: the store's root, the one "
        "`cairn` reads by default)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, then run the story in DIR or a temporary directory."""
    args = parse_args(argv)
    prefix = CheckpointPaths(args.prefix).base_prefix
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix="cairn-demo-") as tmp:
            print(f"store   {tmp} (temporary), prefix {prefix!r}")
            return asyncio.run(run(Path(tmp).as_uri(), prefix))
    print(f"store   {args.dir}, prefix {prefix!r}")
    target = Path(args.dir)
    target.mkdir(parents=True, exist_ok=True)
    code = asyncio.run(run(target.resolve().as_uri(), prefix))
    print(f"inspect cairn list --store {shlex.quote(args.dir)} --prefix {shlex.quote(prefix)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
