"""Diagnostic: the same streamed restore, repeated in one process, to tell cairn's cost from
the machine's (a VM whose page allocation for a new file's pages swings run to run).

    python bench/restore_repeats.py [--dir /dev/shm] [--size-mib 2048] [--chunk-mib 1]
                                    [--times 4]

Saves one file of ``--size-mib`` random MiB as an artifact in a LocalStore under
``--dir``, then restores it ``--times`` times with ``load_artifact_to`` (verified,
fsynced, renamed) into a new file each time, deleted right after, and prints the wall
and CPU seconds of each restore and of one SHA-256 pass over the stored object.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/restore_repeats.py``
    sys.path.insert(0, str(REPO))

from bench.harness import MiB  # noqa: E402
from cairn import CheckpointId, ObjectStoreCheckpointer  # noqa: E402


def sha256_of(path: Path) -> float:
    """Seconds of one SHA-256 pass over ``path`` in 8 MiB reads."""
    start, digest = time.perf_counter(), hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * MiB):
            digest.update(block)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="where to work (default: the temp dir)")
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--chunk-mib", type=int, default=1, help="restore ranges, in MiB")
    parser.add_argument("--times", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cairn-restore-", dir=args.dir))
    try:
        source = work / "source.bin"
        with open(source, "wb") as f:
            for _ in range(args.size_mib // 64):
                f.write(os.urandom(64 * MiB))
        ckpt = ObjectStoreCheckpointer(str(work / "store"))
        cid = CheckpointId.now()
        upload = ckpt.save_partitions_concurrent(cid, [("op", 0, False, source)])
        [(_, entry)] = asyncio.run(upload)
        path = ckpt.paths.resolve(cid, entry.path)
        print(f"SHA-256 pass: {sha256_of(work / 'store' / path):.2f} s")
        for i in range(args.times):
            out = work / f"restored-{i}"
            wall, cpu = time.perf_counter(), time.process_time()
            restore = ckpt.load_artifact_to(
                path, out, expected_sha256=entry.sha256, chunk_size=args.chunk_mib * MiB
            )
            asyncio.run(restore)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"restore {i}: {wall:.2f} s wall, {cpu:.2f} s CPU")
            out.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
