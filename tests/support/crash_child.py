"""A checkpointing process for the tests that kill it or race it: run as a child process.

Usage::

    python tests/support/crash_child.py crash --store STORE [--max-saves N] [--max-seconds S]
    python tests/support/crash_child.py race --store STORE --writer W [--writers 8] [--rounds 5]

``STORE`` is ``file:///abs/dir``, ``s3://bucket`` with the keyword arguments for
``obstore.store.S3Store(bucket, **options)`` as a JSON object in the environment variable
``CAIRN_TEST_S3_OPTIONS`` (endpoint, credentials, ``allow_http``...), or ``gs://bucket``
opened by :func:`cairn.open_store` from the ``GOOGLE_*`` environment, as a user's job
would be.

``crash`` mode: ``load_latest()``, check the restored bytes, then save checkpoints with
increasing epochs, starting after the restored one, until killed (or ``--max-saves`` /
``--max-seconds``, so an orphaned child ends by itself). Each checkpoint is
:func:`checkpoint_data` of its epoch. ``race`` mode: print ``ready``, wait for ``go`` on
stdin, then save ``--rounds`` checkpoints with epochs ``r * writers + writer``.

Stdout is a line protocol, flushed line by line, so a parent can tell how far it got:

* ``restored EPOCH ID`` (``-1 -`` when the store was empty): ``load_latest()`` returned;
* ``saving EPOCH ID``: ``save`` of that checkpoint starts;
* ``committed EPOCH ID``: ``save`` returned (crash mode);
* ``ready``, then ``committed EPOCH ID MANIFEST_HEX`` per save (race mode), where the hex
  is ``encode_manifest`` of the manifest ``save`` returned.

Importable without side effects: the parent side uses :func:`checkpoint_data`,
:func:`expected_artifacts`, :func:`child_command` and :func:`parse_lines` from here.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obstore.store import ObjectStore, S3Store

from cairn import CheckpointData, ObjectStoreCheckpointer, SourceOffsetEntry, open_store
from cairn.format.manifest import encode_manifest

S3_OPTIONS_ENV = "CAIRN_TEST_S3_OPTIONS"
CHILD_SCRIPT = Path(__file__).resolve()

OPERATORS = 3
PARTITIONS = 2
MIN_ARTIFACT = 8 * 1024
MAX_ARTIFACT = 320 * 1024
SOURCE = "events"
SOURCE_TYPE = "crash-test"
OBJECTS_PER_CHECKPOINT = OPERATORS * PARTITIONS + 1  # the snapshots and one source offset


# -- the deterministic checkpoint of an epoch ----------------------------------------------


def artifact(epoch: int, operator: int, partition: int) -> bytes:
    """The snapshot bytes of one partition at ``epoch``: a readable header, then noise
    that differs per epoch, operator and partition.

    Sizes vary from 8 KiB to 320 KiB with the epoch, so saves take a while and differ.
    """
    span = MAX_ARTIFACT - MIN_ARTIFACT
    size = MIN_ARTIFACT + (epoch * 7919 + operator * 104_729 + partition * 1_299_709) % span
    header = f"epoch={epoch} operator={operator} partition={partition}\n".encode()
    block = hashlib.shake_256(header).digest(4096)  # cheap: the child's time goes to saving
    return (header + block * (size // len(block) + 1))[:size]


def expected_artifacts(epoch: int) -> dict[tuple[str, int], bytes]:
    """``(operator, partition) -> bytes`` of the checkpoint of ``epoch``."""
    return {
        (f"op{o}", p): artifact(epoch, o, p) for o in range(OPERATORS) for p in range(PARTITIONS)
    }


def expected_offsets(epoch: int) -> dict[str, SourceOffsetEntry]:
    """The source offsets recorded by the checkpoint of ``epoch``."""
    return {SOURCE: SourceOffsetEntry(SOURCE_TYPE, {"0": str(epoch * 1000)}, epoch)}


def checkpoint_data(epoch: int) -> CheckpointData:
    """The checkpoint the crash child saves at ``epoch`` (with a fresh id)."""
    return CheckpointData(
        epoch=epoch, snapshots=expected_artifacts(epoch), source_offsets=expected_offsets(epoch)
    )


def race_data(writer: int, round_: int, writers: int) -> CheckpointData:
    """The checkpoint writer ``writer`` saves in round ``round_`` of the race."""
    epoch = round_ * writers + writer
    return CheckpointData(
        epoch=epoch,
        snapshots={("op", writer): f"writer {writer} round {round_}\n".encode() * 200},
        source_offsets={SOURCE: SourceOffsetEntry(SOURCE_TYPE, {str(writer): str(round_)}, epoch)},
    )


# -- the parent's side of the protocol -------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One complete line the child printed: its kind and its words."""

    kind: str
    words: tuple[str, ...]


def parse_lines(output: bytes) -> list[Line]:
    """The complete (newline-terminated) lines of the child's stdout; a cut tail is dropped."""
    complete, _, _ = output.rpartition(b"\n")
    lines = []
    for raw in complete.decode().splitlines():
        kind, *words = raw.split()
        lines.append(Line(kind, tuple(words)))
    return lines


def child_command(mode: str, store: str, *args: str) -> list[str]:
    """The command line running this script in ``mode`` on ``store`` in a new interpreter."""
    return [sys.executable, str(CHILD_SCRIPT), mode, "--store", store, *args]


def child_env(s3_options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The child's environment: ours, plus the S3 options when the store is on S3."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    if s3_options is not None:
        env[S3_OPTIONS_ENV] = json.dumps(dict(s3_options))
    return env


# -- the child -----------------------------------------------------------------------------


def open_child_store(spec: str) -> ObjectStore:
    """``file:///abs/dir`` or ``gs://bucket`` (from the environment), or ``s3://bucket``
    with options from ``$CAIRN_TEST_S3_OPTIONS``."""
    if spec.startswith(("file://", "gs://")):
        return open_store(spec)
    if spec.startswith("s3://"):
        bucket = spec.removeprefix("s3://").strip("/")
        options: dict[str, Any] = json.loads(os.environ[S3_OPTIONS_ENV])
        return S3Store(bucket, **options)
    raise SystemExit(
        f"crash_child: unsupported store {spec!r} (file:///abs/dir, s3://bucket or gs://bucket)"
    )


def emit(*words: object) -> None:
    """One protocol line, flushed at once so it is on record before the next step starts."""
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


async def run_crash(ckpt: ObjectStoreCheckpointer, max_saves: int, max_seconds: float) -> int:
    deadline = time.monotonic() + max_seconds
    restored = await ckpt.load_latest()
    if restored is None:
        emit("restored", -1, "-")
        epoch = 0
    else:
        got = {key: bytes(data) for key, data in restored.artifacts.items()}
        if got != expected_artifacts(restored.epoch):
            print(f"restored {restored.checkpoint_id} has wrong bytes", file=sys.stderr)
            return 3
        if restored.source_offsets != expected_offsets(restored.epoch):
            print(f"restored {restored.checkpoint_id} has wrong offsets", file=sys.stderr)
            return 3
        emit("restored", restored.epoch, restored.checkpoint_id)
        epoch = restored.epoch + 1
    for _ in range(max_saves):
        if time.monotonic() > deadline:
            break
        data = checkpoint_data(epoch)
        emit("saving", epoch, data.id)
        manifest = await ckpt.save(data)
        emit("committed", manifest.epoch, manifest.checkpoint_id)
        epoch += 1
    return 0


async def run_race(
    ckpt: ObjectStoreCheckpointer, writer: int, writers: int, rounds: int, seed: int
) -> int:
    rng = random.Random(seed)
    for round_ in range(rounds):
        manifest = await ckpt.save(race_data(writer, round_, writers))
        emit("committed", manifest.epoch, manifest.checkpoint_id, encode_manifest(manifest).hex())
        await asyncio.sleep(rng.random() / 100)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cairn crash / race test child")
    parser.add_argument("mode", choices=["crash", "race"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--max-saves", type=int, default=10_000)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--writer", type=int, default=0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    ckpt = ObjectStoreCheckpointer(open_child_store(args.store))
    if args.mode == "crash":
        return asyncio.run(run_crash(ckpt, args.max_saves, args.max_seconds))
    emit("ready")
    if sys.stdin.readline().strip() != "go":  # EOF: the parent is gone
        return 2
    return asyncio.run(run_race(ckpt, args.writer, args.writers, args.rounds, args.seed))


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization: everything is flushed and there is nothing to clean
    # up. Once in ~100 runs a child that had finished its work died of SIGABRT during
    # exit, with nothing on stderr (obstore's Tokio worker threads still run while
    # Py_Finalize tears the interpreter down); exiting here keeps that out of the tests.
    os._exit(exit_code)
