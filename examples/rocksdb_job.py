"""A streaming job whose keyed state is a RocksDB database, checkpointed with cairn.

    pip install rocksdict
    python examples/rocksdb_job.py [--events N] [--every E] [--kill-at I]
                                   [--workers W] [--rescale-to M]

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

Rescaling: the state is cut into key groups (``cairn.KeyGroups``), and every database
key starts with its key group (``g007/key/00000042``; a key's group is its range of the
key space, see :func:`group_of`), so the keys of a range of groups are one range of the
database. ``--workers W`` runs W workers, worker ``w`` holding the
groups of ``KEY_GROUPS.groups_of(w, W)`` in its own database, saved as partition ``w``.
``--rescale-to M`` restores the newest checkpoint onto M workers, whatever number saved
it: each new worker restores every old directory whose groups overlap its range, copies
the keys of its own groups (an iterator from the prefix of its first group to the
prefix after its last), and the first checkpoint after the rescale is a full one (its
files share nothing with the old directories); then it runs on with M workers.

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
    KeyGroups,
    LoadedCheckpoint,
    SourceOffsetEntry,
    SyncCheckpointer,
)

DEFAULT_STORE = "./checkpoints"
"""The store ``cairn`` reads when given no ``--store``."""
DEFAULT_PREFIX = ""
"""The base prefix ``cairn`` reads when given no ``--prefix``."""
OPERATOR = "per-key-counts"
"""The directory partitions' operator name (partition ``w``: worker ``w``'s database)."""
KEY_GROUPS = KeyGroups(128)
"""The key space of the state: fixed for its life, whatever the number of workers."""
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
        epilog="Needs rocksdict (no extra of cairn): pip install rocksdict.",
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
        "--workers",
        type=positive,
        default=1,
        metavar="W",
        help="workers, each with its own database of a range of key groups (default: 1)",
    )
    parser.add_argument(
        "--rescale-to",
        type=positive,
        metavar="M",
        help="restore the newest checkpoint onto M workers, whatever number saved it, and "
        "run on with M (the same as --workers M)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="process nothing: restore the newest checkpoint into a scratch directory and "
        "check its counts against the whole stream",
    )
    args = parser.parse_args(argv)
    if args.rescale_to is not None:
        args.workers = args.rescale_to
    return args


def group_of(key: int, keys: int) -> int:
    """The key group of ``key`` of ``keys``: its range (``key * 128 // keys``).

    Keys that change together (the stream's consecutive keys) then stay in one range of
    the database, which keeps RocksDB's compactions, and so the incremental checkpoints,
    small. ``KEY_GROUPS.group_of`` (a hash of the key's bytes) serves as well for keys
    without such an order; what matters is that the mapping never changes.
    """
    return key * KEY_GROUPS.count // keys


def group_prefix(group: int) -> str:
    """The prefix of every database key of ``group`` (``g007/``): groups sort in order."""
    return f"g{group:03d}/"


def db_key(key: int, keys: int) -> str:
    """The database key of ``key``: its group's prefix, then the key zero-padded."""
    return f"{group_prefix(group_of(key, keys))}key/{key:08d}"


def owner(key: int, keys: int, workers: int) -> int:
    """The worker of ``workers`` whose database holds ``key``."""
    return KEY_GROUPS.owner_of(group_of(key, keys), workers)


def value(db: Any, key: int, keys: int) -> tuple[int, int]:
    """``key``'s (count, sum) in ``db``: (0, 0) while it has seen no event."""
    stored = db.get(db_key(key, keys))
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
    """What in ``db`` (the one worker's) differs from the true state after ``events``
    events (empty: none)."""
    return check_all([db], events, keys)


def check_all(dbs: list[Any], events: int, keys: int) -> list[str]:
    """What in the workers' databases differs from the true state after ``events``
    events (empty: none): each key in its owner's database, and only there."""
    wrong: list[str] = []
    for key, (count, total) in truth(events, keys).items():
        holder = owner(key, keys, len(dbs))
        got = value(dbs[holder], key, keys)
        if got != (count, total):
            wrong.append(f"key {key}: (count, sum) {got}, expected {(count, total)}")
        for other, db in enumerate(dbs):
            if other != holder and db.get(db_key(key, keys)) is not None:
                wrong.append(f"key {key} is in worker {other}'s database, not only {holder}'s")
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
        dbs = []
        try:
            for partition in partitions_of(loaded):
                dest = Path(scratch) / f"db-{partition}"
                ckpt.restore_directory(loaded.checkpoint_id, OPERATOR, partition, dest)
                dbs.append(rocksdict.Rdict(str(dest), options(rocksdict)))
            wrong = check_all(dbs, offset, args.keys)
        finally:
            for db in dbs:
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
    # Whatever a killed run left behind is newer than its checkpoint: never reuse it.
    for stale in [*workdir.glob("db"), *workdir.glob("db-*"), *workdir.glob("checkpoint-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    workers = args.workers
    loaded = ckpt.load_latest()
    parent: CheckpointId | None = None
    if loaded is None:
        offset, epoch = 0, 0
        print(f"no checkpoint: starting at offset 0 on {workers} workers", flush=True)
    else:
        offset = int(loaded.source_offsets[SOURCE].offsets[SPLIT])
        epoch = loaded.epoch
        saved_by = len(partitions_of(loaded))
        if saved_by == workers:
            for w in range(workers):
                ckpt.restore_directory(loaded.checkpoint_id, OPERATOR, w, db_path(workdir, w))
            parent = loaded.checkpoint_id  # unchanged files are carried from it
        else:
            rescale(ckpt, rocksdict, loaded, saved_by, workers, workdir)
        print(
            f"restored {loaded.checkpoint_id} (epoch {epoch}, {saved_by} workers) onto "
            f"{workers} workers: resuming at offset {offset}",
            flush=True,
        )
    dbs = [rocksdict.Rdict(str(db_path(workdir, w)), options(rocksdict)) for w in range(workers)]
    try:
        for position in range(offset, args.events):
            key = position % args.keys
            db = dbs[owner(key, args.keys, workers)]
            count, total = value(db, key, args.keys)
            db[db_key(key, args.keys)] = [count + 1, total + position]
            if position == args.kill_at:
                print(f"killing myself after event {position} (--kill-at)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            done = position + 1
            if done % args.every == 0 or done == args.events:
                epoch += 1
                parent = checkpoint(ckpt, rocksdict, dbs, workdir, epoch, done, parent)
        wrong = check_all(dbs, args.events, args.keys)
    finally:
        for db in dbs:
            db.close()
    return report(not wrong, wrong)


def db_path(workdir: Path, worker: int) -> Path:
    """Where worker ``worker``'s live database is (``db`` for a lone worker)."""
    return workdir / ("db" if worker == 0 else f"db-{worker}")


def partitions_of(loaded: LoadedCheckpoint) -> list[int]:
    """The directory partitions (the workers) a checkpoint holds, ascending."""
    return sorted(key[1] for key in loaded.directories if key[0] == OPERATOR)


def rescale(
    ckpt: SyncCheckpointer,
    rocksdict: Any,
    loaded: LoadedCheckpoint,
    saved_by: int,
    workers: int,
    workdir: Path,
) -> None:
    """Build each new worker's database from the old ones that hold its key groups.

    Each old directory is restored once, into a scratch directory; a new worker copies
    from each old database whose groups overlap its range the keys from its first
    group's prefix up to the prefix after its last (they sort by group).
    """
    with tempfile.TemporaryDirectory(dir=workdir) as scratch:
        old: dict[int, Any] = {}
        try:
            for w in range(workers):
                mine = KEY_GROUPS.groups_of(w, workers)
                db = rocksdict.Rdict(str(db_path(workdir, w)), options(rocksdict))
                copied = 0
                try:
                    for p in range(saved_by):
                        theirs = KEY_GROUPS.groups_of(p, saved_by)
                        if not mine or not theirs or theirs.start >= mine.stop:
                            continue
                        if theirs.stop <= mine.start:
                            continue
                        if p not in old:
                            dest = Path(scratch) / f"old-{p}"
                            ckpt.restore_directory(loaded.checkpoint_id, OPERATOR, p, dest)
                            old[p] = rocksdict.Rdict(str(dest), options(rocksdict))
                        end = group_prefix(mine.stop)
                        for k, v in old[p].items(from_key=group_prefix(mine.start)):
                            if k >= end:
                                break
                            db[k] = v
                            copied += 1
                finally:
                    db.close()
                print(
                    f"worker {w}: key groups {mine.start}..{mine.stop - 1}, {copied} keys "
                    "copied from the old databases that hold them",
                    flush=True,
                )
        finally:
            for db in old.values():
                db.close()


def checkpoint(
    ckpt: SyncCheckpointer,
    rocksdict: Any,
    dbs: list[Any],
    workdir: Path,
    epoch: int,
    offset: int,
    parent: CheckpointId | None,
) -> CheckpointId:
    """Save every worker's database and the offset after them in one cairn checkpoint;
    its id."""
    scratch = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=workdir))
    try:
        snapshots = {}
        for w, db in enumerate(dbs):
            db.flush()
            # Same file system as the database: the SST files are hard links, not copies.
            snapshots[(OPERATOR, w)] = scratch / f"db-{w}"
            rocksdict.Checkpoint(db).create_checkpoint(str(snapshots[(OPERATOR, w)]))
        manifest = ckpt.save(
            CheckpointData(
                epoch=epoch,
                directories=snapshots,
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
