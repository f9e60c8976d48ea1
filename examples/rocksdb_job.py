"""A streaming job whose keyed state is a RocksDB database, checkpointed with cairn.

    pip install rocksdict
    python examples/rocksdb_job.py [--events N] [--every E] [--kill-at I]

The job consumes a deterministic stream: event ``i`` (for ``i`` in 0..N-1) has the key
``i % KEYS`` and the value ``i``. For each key the RocksDB database counts the events
and sums their values. Every E events it flushes the database, makes a RocksDB
checkpoint (hard links to the immutable SST files, plus fresh copies of the small
metadata files) in a fresh directory, and saves that directory as a cairn directory
partition, with the previous checkpoint as parent (so the SST files the parent
already holds are carried, not uploaded) and with the source offset, in ONE cairn
checkpoint; then it deletes the RocksDB checkpoint directory.

On start it restores: the newest valid checkpoint's directory is written back as the
database (``restore_directory``), which is opened and fed from the restored offset.
The live database of a run that was killed is discarded, never reused: it may hold
events after the offset its checkpoint names, which a replay would count twice. The
state is its own exactly-once check: once all N events are in, every key's count and
sum must equal what the stream holds (``exactly-once: YES``); ``--verify`` checks the
newest checkpoint the same way, restored into a scratch directory.

The checkpoints go to ``--store`` (default ``./checkpoints``) under ``--prefix``
(default: its root): where ``cairn`` looks by default, so ``cairn list`` in the
same directory lists them. The database lives in ``--workdir``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    SourceOffsetEntry,
    SyncCheckpointer,
)

DEFAULT_STORE = "./checkpoints"
"""The store ``cairn`` reads when given no ``--store``."""
DEFAULT_PREFIX = ""
"""The base prefix ``cairn`` reads when given no ``--prefix``."""
OPERATOR = "per-key-counts"
"""The directory partition's operator name (partition 0)."""
SOURCE = "events"
SOURCE_TYPE = "rocksdb-example-generator"
SPLIT = "events-0"


def positive(text: str) -> int:
    """A positive int (argparse type)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--help`` and bad options exit here, before anything is made."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs rocksdict: pip install rocksdict.",
    )
    parser.add_argument(
        "--store",
        default=DEFAULT_STORE,
        help="where the checkpoints go: a directory (made if missing) or a URL "
        "(default: %(default)s, the store `cairn` reads by default)",
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help="base prefix of the checkpoints in the store (default: the store's root, the one "
        "`cairn` reads by default)",
    )
    parser.add_argument(
        "--workdir",
        default="./rocksdb-job",
        help="where the live database and the RocksDB checkpoint directories are "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--events",
        type=positive,
        default=200_000,
        help="events in the stream (default: %(default)s)",
    )
    parser.add_argument(
        "--keys", type=positive, default=50_000, help="distinct keys (default: %(default)s)"
    )
    parser.add_argument(
        "--every",
        type=positive,
        default=5_000,
        metavar="E",
        help="checkpoint every E events, and after the last (default: %(default)s)",
    )
    parser.add_argument(
        "--kill-at",
        type=int,
        metavar="I",
        help="SIGKILL the job itself right after it applied event I (a crash, for tests)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="process nothing: restore the newest checkpoint into a scratch directory and "
        "check its counts against the whole stream",
    )
    return parser.parse_args(argv)


def db_key(key: int) -> str:
    """The database key of ``key``, zero-padded so that keys sort in number order (the
    events between two checkpoints then touch one narrow key range)."""
    return f"key/{key:08d}"


def value(db: Any, key: int) -> tuple[int, int]:
    """``key``'s (count, sum) in ``db``: (0, 0) while it has seen no event."""
    stored = db.get(db_key(key))
    return (0, 0) if stored is None else (stored[0], stored[1])


def truth(events: int, keys: int) -> dict[int, tuple[int, int]]:
    """Per key, the (count, sum) the whole stream of ``events`` events holds."""
    result: dict[int, tuple[int, int]] = {}
    for key in range(min(keys, events)):
        # events key, key + keys, key + 2 * keys, ... below ``events``
        n = (events - 1 - key) // keys + 1
        result[key] = (n, n * key + keys * n * (n - 1) // 2)
    return result


def check(db: Any, events: int, keys: int) -> list[str]:
    """What in ``db`` differs from the true state after ``events`` events (empty: none)."""
    wrong: list[str] = []
    for key, (count, total) in truth(events, keys).items():
        got = value(db, key)
        if got != (count, total):
            wrong.append(f"key {key}: (count, sum) {got}, expected {(count, total)}")
    return wrong


def options(rocksdict: Any) -> Any:
    """Database options: small SST files, so that a compaction rewrites only the files
    whose key range changed, and most of the database stays carried."""
    opts = rocksdict.Options()
    opts.create_if_missing(True)
    opts.set_target_file_size_base(32 * 1024)
    opts.set_max_bytes_for_level_base(512 * 1024)
    return opts


def report(exactly_once: bool, wrong: list[str]) -> int:
    """Print the verdict (and the first differences); 0 when exactly-once holds."""
    for line in wrong[:5]:
        print(f"  {line}")
    print(f"exactly-once: {'YES' if exactly_once else 'NO'}", flush=True)
    return 0 if exactly_once else 1


def verify(ckpt: SyncCheckpointer, rocksdict: Any, args: argparse.Namespace) -> int:
    """Restore the newest checkpoint into a scratch directory and check it is complete."""
    loaded = ckpt.load_latest()
    if loaded is None:
        print("no checkpoint to verify")
        return 1
    offset = int(loaded.source_offsets[SOURCE].offsets[SPLIT])
    with tempfile.TemporaryDirectory() as scratch:
        dest = Path(scratch) / "db"
        ckpt.restore_directory(loaded.checkpoint_id, OPERATOR, 0, dest)
        db = rocksdict.Rdict(str(dest), options(rocksdict))
        try:
            wrong = check(db, offset, args.keys)
        finally:
            db.close()
    print(f"checkpoint {loaded.checkpoint_id} (epoch {loaded.epoch}) is at offset {offset}")
    if offset != args.events:
        print(f"  the stream has {args.events} events: the job has not finished")
    return report(offset == args.events and not wrong, wrong)


def main(argv: list[str] | None = None) -> int:
    """Restore, process to the end of the stream checkpointing every E events, check."""
    args = parse_args(argv)
    try:
        import rocksdict
    except ImportError as exc:
        sys.exit(f"rocksdb_job.py: {exc}; install it: pip install rocksdict")
    paths = CheckpointPaths(args.prefix)
    print(f"store {args.store}, prefix {paths.base_prefix!r}", flush=True)
    print(
        f"inspect cairn list --store {shlex.quote(args.store)} "
        f"--prefix {shlex.quote(paths.base_prefix)}",
        flush=True,
    )
    ckpt = SyncCheckpointer(args.store, paths)
    try:
        if args.verify:
            return verify(ckpt, rocksdict, args)
        return run(ckpt, rocksdict, args)
    finally:
        ckpt.close()


def run(ckpt: SyncCheckpointer, rocksdict: Any, args: argparse.Namespace) -> int:
    """The job itself: restore, replay from the restored offset, checkpoint, check."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    db_path = workdir / "db"
    # Whatever a killed run left behind is newer than its checkpoint: never reuse it.
    shutil.rmtree(db_path, ignore_errors=True)
    for stale in workdir.glob("checkpoint-*"):
        shutil.rmtree(stale, ignore_errors=True)
    loaded = ckpt.load_latest()
    parent: CheckpointId | None = None
    if loaded is None:
        offset, epoch = 0, 0
        print("no checkpoint: starting at offset 0", flush=True)
    else:
        ckpt.restore_directory(loaded.checkpoint_id, OPERATOR, 0, db_path)
        offset = int(loaded.source_offsets[SOURCE].offsets[SPLIT])
        epoch, parent = loaded.epoch, loaded.checkpoint_id
        print(f"restored {parent} (epoch {epoch}): resuming at offset {offset}", flush=True)
    db = rocksdict.Rdict(str(db_path), options(rocksdict))
    try:
        for position in range(offset, args.events):
            key = position % args.keys
            count, total = value(db, key)
            db[db_key(key)] = [count + 1, total + position]
            if position == args.kill_at:
                print(f"killing myself after event {position} (--kill-at)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            done = position + 1
            if done % args.every == 0 or done == args.events:
                epoch += 1
                parent = checkpoint(ckpt, rocksdict, db, workdir, epoch, done, parent)
        wrong = check(db, args.events, args.keys)
    finally:
        db.close()
    return report(not wrong, wrong)


def checkpoint(
    ckpt: SyncCheckpointer,
    rocksdict: Any,
    db: Any,
    workdir: Path,
    epoch: int,
    offset: int,
    parent: CheckpointId | None,
) -> CheckpointId:
    """Save the database and the offset after it in one cairn checkpoint; its id."""
    db.flush()
    scratch = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=workdir))
    try:
        # Same file system as the database, so the SST files are hard links, not copies.
        snapshot = scratch / "db"
        rocksdict.Checkpoint(db).create_checkpoint(str(snapshot))
        manifest = ckpt.save(
            CheckpointData(
                epoch=epoch,
                directories={(OPERATOR, 0): snapshot},
                parent_id=parent,
                source_offsets={
                    SOURCE: SourceOffsetEntry(SOURCE_TYPE, {SPLIT: str(offset)}, epoch)
                },
            )
        )
    finally:
        shutil.rmtree(scratch)
    stats = manifest.stats
    sent = (
        ""
        if stats is None
        else (
            f": uploaded {stats.uploaded_bytes} bytes ({stats.uploaded_artifacts} files), "
            f"carried {stats.carried_bytes} bytes ({stats.carried_artifacts} files)"
        )
    )
    print(f"checkpoint {manifest.checkpoint_id} epoch {epoch} offset {offset}{sent}", flush=True)
    return manifest.checkpoint_id


if __name__ == "__main__":
    sys.exit(main())
