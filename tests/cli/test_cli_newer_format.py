"""The command line on a store a newer cairn wrote to: never "damaged", exit 5.

The store holds two checkpoints today's cairn wrote, and the newest, which a newer cairn
wrote (its manifest requires a format feature today's does not know). Every command runs
as today's cairn, in its own process: ``list``, ``history`` and ``show`` say the newest
"needs a newer cairn", ``verify`` and ``copy`` report it with status ``newer`` and exit 5
(damage would be 1), ``restore latest`` refuses to restore older state past it unless
``--skip-newer-format``, and ``gc`` and ``delete`` delete nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cli import Run, cairn, cairn_many, document
from support.newer import NEWER_VERSION, newer_cairn

from cairn import CheckpointData, CheckpointId, ObjectStoreCheckpointer
from cairn.cli.errors import ExitCode

NEEDS = f"needs a newer cairn (written by cairn {NEWER_VERSION}; unknown format features: teleport)"


@dataclass(frozen=True)
class Store:
    url: str
    root: Path
    older: CheckpointId
    middle: CheckpointId
    newer: CheckpointId


@pytest.fixture
def store(tmp_path: Path) -> Store:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()

    async def fill() -> list[CheckpointId]:
        ckpt = ObjectStoreCheckpointer(url)
        ids = []
        for epoch in (1, 2, 3):
            data = CheckpointData(epoch=epoch, snapshots={("op", 0): b"state %d" % epoch})
            if epoch == 3:
                with newer_cairn():
                    ids.append((await ckpt.save(data)).checkpoint_id)
            else:
                ids.append((await ckpt.save(data)).checkpoint_id)
        return ids

    older, middle, newer = asyncio.run(fill())
    return Store(url, root, older, middle, newer)


def failed(command: str, run: Run) -> dict[str, object]:
    """The ``error`` of ``run``'s document: exit 5, a NewerFormatError, the one
    ``error:`` line on stderr (warnings may come before it)."""
    assert run.code == ExitCode.NEWER_FORMAT, run.explain()
    error = document(command, run)["error"]
    assert (error["exit_code"], error["type"]) == (5, "NewerFormatError"), run.explain()
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {error['message']}"] and "Traceback" not in run.stderr
    return dict(error)


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_list_history_and_show_say_it_needs_a_newer_cairn(store: Store) -> None:
    at = ("--store", store.url)
    listed, table, history, show, show_older = cairn_many(
        [
            ["list", *at, "--json"],
            ["list", *at, "--wide"],
            ["history", *at, "--json"],
            ["show", str(store.newer), *at],
            ["show", str(store.older), *at, "--json"],
        ]
    )
    assert listed.code == 0, listed.explain()
    rows = {row["id"]: row for row in document("list", listed)["checkpoints"]}
    newer = rows[str(store.newer)]
    assert (newer["status"], newer["error"], newer["latest"]) == ("newer", NEEDS, True)
    assert rows[str(store.middle)]["epoch"] == 2 and "error" not in rows[str(store.middle)]
    assert table.code == 0, table.explain()
    assert "needs a newer cairn" in table.stdout
    assert "unreadable" not in table.stdout and "damaged" not in table.stdout
    series = {row["id"]: row["status"] for row in document("history", history)["series"]}
    assert series[str(store.newer)] == "newer"
    assert show.code == ExitCode.NEWER_FORMAT, show.explain()
    assert show.error_line() == f"error: checkpoint {store.newer} {NEEDS}"
    assert show_older.code == 0 and document("show", show_older)["latest"] is False


def test_verify_reports_it_as_newer_not_damaged_and_exits_5(store: Store) -> None:
    run = cairn("verify", "--all", "--store", store.url, "--json")
    error = failed("verify", run)
    doc = document("verify", run)
    states = {row["id"]: (row["status"], row["ok"]) for row in doc["checkpoints"]}
    assert states == {
        str(store.older): ("ok", True),
        str(store.middle): ("ok", True),
        str(store.newer): ("newer", False),
    }
    assert NEEDS in str(error["message"]) and "damaged" not in str(error["message"])


def test_restore_latest_refuses_older_state_unless_told(store: Store, tmp_path: Path) -> None:
    refused, skipped = tmp_path / "refused", tmp_path / "skipped"
    run = cairn("restore", "latest", "--to", str(refused), "--store", store.url)
    assert run.code == ExitCode.NEWER_FORMAT, run.explain()
    assert run.error_line() == f"error: checkpoint {store.newer} {NEEDS}"
    assert not refused.exists() or not any(refused.iterdir())
    run = cairn(
        "restore", "latest", "--to", str(skipped), "--store", store.url, "--skip-newer-format"
    )
    assert run.code == 0, run.explain()
    assert str(store.newer) in run.stderr  # the warning names what it passed over
    restored = files(skipped)
    assert f"{store.middle}/manifest.json" in restored
    assert not any(path.startswith(str(store.newer)) for path in restored)


@pytest.mark.parametrize("dry_run", [True, False])
def test_gc_deletes_nothing_and_exits_5(store: Store, dry_run: bool) -> None:
    before = files(store.root)
    args = ["gc", "--keep-last", "1", "--min-age", "0s", "--store", store.url, "--json"]
    run = cairn(*args, *(["--dry-run"] if dry_run else []))
    error = failed("gc", run)
    assert "need a newer cairn: nothing deleted" in str(error["message"])
    doc = document("gc", run)
    assert doc["deleted"] == [] and doc["orphans_deleted"] == []
    assert [item["checkpoint_id"] for item in doc["newer_format"]] == [str(store.newer)]
    assert files(store.root) == before
    text = cairn(*args[:-1])
    assert (
        text.code == ExitCode.NEWER_FORMAT and "needs a newer cairn: nothing deleted" in text.stdout
    )
    assert files(store.root) == before


def test_delete_deletes_nothing_and_exits_5(store: Store) -> None:
    before = files(store.root)
    for target in (store.newer, store.older):
        for extra in ([], ["--force"], ["--dry-run"]):
            run = cairn("delete", str(target), "--store", store.url, *extra)
            assert run.code == ExitCode.NEWER_FORMAT, run.explain()
            assert run.error_line() == f"error: checkpoint {store.newer} {NEEDS}"
    assert files(store.root) == before


def test_copy_copies_the_others_and_exits_5(store: Store, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    run = cairn("copy", "--all", "--to", target.as_uri(), "--store", store.url, "--json")
    error = failed("copy", run)
    assert NEEDS in str(error["message"])
    doc = document("copy", run)
    states = {row["id"]: row["status"] for row in doc["checkpoints"]}
    assert states == {
        str(store.older): "copied",
        str(store.middle): "copied",
        str(store.newer): "newer",
    }
    copied = files(target)
    assert not any(path.startswith(str(store.newer)) for path in copied)
    assert f"{store.middle}/manifest.json" in copied
