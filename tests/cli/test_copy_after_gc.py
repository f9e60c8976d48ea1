"""Backups work after any GC: ``gc``, then ``copy`` to a directory and to S3, then
``verify --all`` and ``restore latest`` on each copy, all exit 0 and restore the bytes
the source restores.

The store holds two chains, full(1) <- delta(2) <- delta(3) and full(4) <- delta(5) <-
delta(6), each delta carrying the partitions it does not change. GC deletes the manifest
of every checkpoint it does not keep, while the artifacts a kept delta still uses stay:
a copy must take them from the kept checkpoint's chain entries (each names its owner),
not from manifests that are gone. Each policy below leaves a different mix of kept
checkpoints and manifest-less owners. All of it runs as real ``cairn`` processes, the
copies to moto's S3 server through the ``AWS_*`` environment only.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.artifacts import artifact_path
from support.cli import PREFIX, cairn, cairn_many, s3_env
from support.servers import S3Server

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
)

DAY_MS = 86_400_000


async def two_chains(url: str, old: int) -> list[CheckpointId]:
    """Six checkpoints in two chains; the first ``old`` are stamped two days ago."""
    ckpt = ObjectStoreCheckpointer(url, CheckpointPaths(PREFIX))
    now = int(time.time() * 1000)
    ids: list[CheckpointId] = []
    for epoch in range(1, 7):
        full = epoch in (1, 4)
        state = {
            ("agg", 0): f"agg-0 at {epoch} ".encode() * 40,
            ("join", epoch % 2): f"join-{epoch % 2} at {epoch}".encode(),
        }
        if full:
            state[("agg", 1)] = b"agg-1 base " * 30
            state[("join", (epoch + 1) % 2)] = b"join base"
        saved = await ckpt.save(
            CheckpointData(
                epoch=epoch,
                snapshots=state if full else {},
                deltas={} if full else state,
                parent_id=None if full else ids[-1],
                source_offsets={"events": SourceOffsetEntry("kafka", {"0": str(epoch)}, epoch)},
                timestamp_ms=now - 2 * DAY_MS if epoch <= old else None,
            )
        )
        ids.append(saved.checkpoint_id)
    return ids


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        (["--keep-last", "1"], [6]),
        (["--keep-last", "2"], [5, 6]),
        (["--keep-last", "1", "--keep-every-n-epochs", "3"], [3, 6]),
        (["--keep-last", "1", "--keep-within", "1d"], [3, 4, 5, 6]),
    ],
)
def test_backups_work_after_gc(
    policy: list[str],
    kept: list[int],
    tmp_path: Path,
    s3_server: S3Server,
    s3_bucket: str,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    ids = asyncio.run(two_chains(source.as_uri(), old=2))
    store = ["--store", str(source)]
    gc = cairn("gc", *policy, "--min-age", "0s", *store, "--json")
    assert gc.code == 0, gc.explain()
    assert gc.json()["retained"] == [str(ids[e - 1]) for e in kept]
    assert gc.json()["deleted"], "the policy deleted nothing: the test would prove nothing"

    local_copy, latest_copy, s3_copy = tmp_path / "copy", tmp_path / "latest", f"s3://{s3_bucket}"
    env = s3_env(s3_server)
    copies = cairn_many(
        [
            ["copy", "--all", "--to", str(local_copy), *store, "--json"],
            ["copy", "latest", "--to", str(latest_copy), *store, "--json"],
            ["copy", "--all", "--to", s3_copy, *store, "--json"],
            ["restore", "latest", "--to", str(tmp_path / "from-source"), *store],
        ],
        env=env,
    )
    for run in copies:
        assert run.code == 0, run.explain()
    assert [c["id"] for c in copies[0].json()["checkpoints"]] == [str(ids[e - 1]) for e in kept]
    assert [c["status"] for c in copies[2].json()["checkpoints"]] == ["copied"] * len(kept)
    assert [c["id"] for c in copies[1].json()["checkpoints"]] == [str(ids[5])]

    checks = cairn_many(
        [
            ["verify", "--all", "--store", str(local_copy), "--json"],
            ["verify", "--all", "--store", str(latest_copy), "--json"],
            ["verify", "--all", "--store", s3_copy, "--json"],
            ["restore", "latest", "--store", str(local_copy), "--to", str(tmp_path / "r1")],
            ["restore", "latest", "--store", str(latest_copy), "--to", str(tmp_path / "r2")],
            ["restore", "latest", "--store", s3_copy, "--to", str(tmp_path / "r3")],
        ],
        env=env,
    )
    for run in checks:
        assert run.code == 0, run.explain()
    for run, count in zip(checks[:3], [len(kept), 1, len(kept)], strict=True):
        doc = run.json()
        assert doc["ok"] is True and len(doc["checkpoints"]) == count, run.explain()
    expected = files_under(tmp_path / "from-source")
    assert f"{ids[5]}/manifest.json" in expected
    for restored in ("r1", "r2", "r3"):
        assert files_under(tmp_path / restored) == expected, restored


def test_copy_and_restore_keep_compressed_artifacts_as_stored(tmp_path: Path) -> None:
    """A zstd-compressed chain copies and restores as stored, and both verify."""
    source = tmp_path / "source"

    async def save() -> tuple[list[CheckpointId], str]:
        ckpt = ObjectStoreCheckpointer(str(source), compression="zstd")
        base = await ckpt.save(CheckpointData(epoch=1, snapshots={("agg", 0): b"a" * 5000}))
        delta = await ckpt.save(
            CheckpointData(epoch=2, deltas={("agg", 0): b"d" * 3000}, parent_id=base.checkpoint_id)
        )
        snapshot = artifact_path(ckpt.paths, base, "agg", 0).removeprefix(ckpt.paths.base_prefix)
        return [base.checkpoint_id, delta.checkpoint_id], snapshot

    (_, delta), snap = asyncio.run(save())
    stored = (source / PREFIX / snap).read_bytes()
    assert len(stored) < 5000, "not compressed: the test would prove nothing"
    store = ["--store", str(source)]
    gc = cairn("gc", "--keep-last", "1", "--min-age", "0s", *store)
    assert gc.code == 0, gc.explain()
    copied, restored = cairn_many(
        [
            ["copy", "latest", "--to", str(tmp_path / "copy"), *store],
            ["restore", "latest", "--to", str(tmp_path / "restored"), *store],
        ]
    )
    assert copied.code == 0 and restored.code == 0, copied.explain() + restored.explain()
    assert (tmp_path / "copy" / PREFIX / snap).read_bytes() == stored
    assert (tmp_path / "restored" / snap).read_bytes() == stored
    checks = cairn_many(
        [
            ["verify", "--all", "--store", str(tmp_path / "copy")],
            ["verify", str(delta), "--store", str(tmp_path / "restored"), "--prefix", ""],
        ]
    )
    for run in checks:
        assert run.code == 0, run.explain()
