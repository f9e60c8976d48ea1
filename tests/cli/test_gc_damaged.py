"""``cairn gc`` with a damaged checkpoint in the store: left alone, said so, exit 1.

A checkpoint whose manifest does not decode, or whose manifest misses a part, is left
alone by GC (what it references cannot be known) and reported in ``damaged``, with why;
``failures`` holds only objects GC could not delete. The command exits 1, the code for
damage (docs/cli.md), when something is damaged and nothing failed, and 3, a store
failure, only when a deletion failed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from support.cli import Filled, Run, cairn, document, store_root
from support.immutable import immutable

from cairn import CheckpointData, CheckpointManifest, ObjectStoreCheckpointer
from cairn.cli.errors import ExitCode

GC = ("gc", "--keep-last", "1", "--min-age", "0s")


def failed(run: Run, code: int, kind: str) -> dict[str, Any]:
    """The ``--json`` document of a gc that failed with ``code``; its error is the one
    ``error:`` line on stderr (the library's warnings come before it)."""
    assert run.code == code, run.explain()
    doc = document("gc", run)
    error = doc["error"]
    assert (error["exit_code"], error["type"]) == (code, kind), run.explain()
    assert error_lines(run) == [f"error: {error['message']}"], run.explain()
    return doc


def error_lines(run: Run) -> list[str]:
    assert "Traceback" not in run.stderr, run.explain()
    return [line for line in run.stderr.splitlines() if line.startswith("error: ")]


def files_under(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_a_corrupt_manifest_is_left_alone_and_reported_as_damage(local: Filled) -> None:
    root = store_root(local)
    (root / str(local.base) / "manifest.json").write_bytes(b'{"not": "a manifest"')
    damaged_dir = files_under(root / str(local.base))
    store = ("--store", local.url)

    text = cairn(*GC, "--dry-run", *store)
    assert text.code == ExitCode.INTEGRITY, text.explain()
    assert "left alone: damaged" in text.stdout and "store failure" not in text.stderr
    [line] = error_lines(text)
    assert line.startswith(f"error: 1 damaged checkpoint(s) left alone; {local.base}: ")

    for dry in (True, False):
        run = cairn(*GC, *(["--dry-run"] if dry else []), *store, "--json")
        doc = failed(run, ExitCode.INTEGRITY, "IntegrityError")
        [damaged] = doc["damaged"]
        assert damaged["checkpoint_id"] == str(local.base)
        assert "manifest" in damaged["reason"] and damaged["reason"] in doc["error"]["message"]
        assert doc["failures"] == [] and doc["dry_run"] is dry
        assert doc["deleted"] == [str(local.delta)] and doc["retained"] == [str(local.newest)]

    assert files_under(root / str(local.base)) == damaged_dir
    assert not (root / str(local.delta)).exists()
    listed = cairn("list", *store, "--json")
    assert [c["id"] for c in listed.json()["checkpoints"]] == [str(local.base), str(local.newest)]


def test_a_missing_manifest_part_is_left_alone_and_reported_as_damage(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()

    async def fill() -> tuple[CheckpointManifest, CheckpointManifest]:
        ckpt = ObjectStoreCheckpointer(url)
        snapshots = {("agg", p): p.to_bytes(4, "little") for p in range(5_000)}  # > 4,096
        large = await ckpt.save(CheckpointData(epoch=1, snapshots=snapshots))
        small = await ckpt.save(CheckpointData(epoch=2, snapshots={("agg", 0): b"small"}))
        return large, small

    large, small = asyncio.run(fill())
    assert len(large.parts) == 2
    part = large.parts[0].path
    (root / str(large.checkpoint_id) / part).unlink()
    damaged_dir = files_under(root / str(large.checkpoint_id))

    run = cairn(*GC, "--store", url, "--json")

    doc = failed(run, ExitCode.INTEGRITY, "IntegrityError")
    [damaged] = doc["damaged"]
    assert damaged["checkpoint_id"] == str(large.checkpoint_id)
    assert part in damaged["reason"] and "missing" in damaged["reason"]
    assert doc["failures"] == [] and doc["deleted"] == []
    assert doc["retained"] == [str(small.checkpoint_id)]
    assert files_under(root / str(large.checkpoint_id)) == damaged_dir


def test_without_damage_gc_exits_0_with_an_empty_damaged_list(local: Filled) -> None:
    run = cairn(*GC, "--store", local.url, "--json")
    assert run.code == ExitCode.OK, run.explain()
    doc = document("gc", run)
    assert doc["damaged"] == [] and doc["failures"] == [] and "error" not in doc


def test_a_deletion_that_fails_is_a_store_failure_even_beside_damage(local: Filled) -> None:
    root = store_root(local)
    (root / str(local.base) / "manifest.json").write_bytes(b"\x00")
    stuck = root / str(local.delta) / "manifest.json"
    with immutable(stuck):  # not even root may delete it
        run = cairn(*GC, "--store", local.url, "--json")
    doc = failed(run, ExitCode.STORE, "StoreError")
    assert [d["checkpoint_id"] for d in doc["damaged"]] == [str(local.base)]
    assert [f["path"] for f in doc["failures"]] == [f"{local.delta}/manifest.json"]
    assert "1 object(s) could not be deleted" in doc["error"]["message"]
    # Its manifest stands, so it was not deleted: it keeps every byte it names.
    assert doc["deleted"] == []
    verified = cairn("verify", str(local.delta), "--store", local.url)
    assert verified.code == ExitCode.OK, verified.explain()
