"""``cairn history`` and ``cairn show`` say what a save cost: the bytes it stored and
the store requests it made, in text (within the terminal's width) and in ``--json``;
checkpoints saved before cairn recorded them still show, without."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import msgspec
from support.cli import PREFIX, cairn_many, document
from support.paths import DATA

from cairn import CheckpointData, CheckpointManifest, CheckpointPaths, ObjectStoreCheckpointer
from cairn.format.manifest import StoreRequests

OLD_STORE = DATA / "store-unpacked"


async def two_saves(root: Path) -> list[CheckpointManifest]:
    ckpt = ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths(PREFIX))
    first = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"s" * 5000}))
    second = await ckpt.save(
        CheckpointData(epoch=2, deltas={("op", 0): b"d" * 70}, parent_id=first.checkpoint_id)
    )
    return [first, second]


def requests_of(manifest: CheckpointManifest) -> dict[str, int]:
    assert manifest.stats is not None and isinstance(manifest.stats.requests, StoreRequests)
    return msgspec.structs.asdict(manifest.stats.requests)


def test_history_and_show_print_what_each_save_stored_and_asked(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    manifests = asyncio.run(two_saves(root))
    store = ["--store", root.as_uri()]
    latest = str(manifests[1].checkpoint_id)
    history, history_json, wide, shown, shown_json = cairn_many(
        [
            ["history", *store],
            ["history", *store, "--json"],
            ["history", *store, "--wide"],
            ["show", latest, *store],
            ["show", latest, *store, "--json"],
        ],
        env={"COLUMNS": "80"},
    )
    series = document("history", history_json)["series"]
    for row, manifest in zip(series, manifests, strict=True):
        assert manifest.stats is not None
        assert row["stored_bytes"] == manifest.stats.stored_bytes
        assert row["requests"] == requests_of(manifest)
    doc = document("show", shown_json)
    assert (doc["stored_bytes"], doc["requests"]) == (
        manifests[1].stats.stored_bytes,  # type: ignore[union-attr]
        requests_of(manifests[1]),
    )
    # Sent: the artifact bytes the save sent, as stored; not the manifest.
    assert [row["sent_bytes"] for row in series] == [5000, 70]
    assert doc["sent_bytes"] == 70

    for run in (history, shown):
        assert run.code == 0, run.explain()
        assert all(len(line) <= 80 for line in run.stdout.splitlines()), run.explain()
    totals = [sum(requests_of(m).values()) for m in manifests]
    assert [int(n) for n in re.findall(r"(\d+) req\b", history.stdout)] == totals
    assert wide.stdout.count(" stored") == 2, wide.explain()
    put = requests_of(manifests[1])["put"]
    assert f"{totals[1]} ({put} PUT, " in shown.stdout, shown.stdout
    assert "DELETE) up to its commit" in shown.stdout
    assert "70 B of artifacts by its save, as stored" in shown.stdout, shown.stdout


def test_checkpoints_saved_before_the_counts_show_without_them(tmp_path: Path) -> None:
    root = tmp_path / "old"
    shutil.copytree(OLD_STORE, root)
    store = ["--store", root.as_uri()]
    history, history_json, shown_json, shown = cairn_many(
        [
            ["history", *store, "--wide"],
            ["history", *store, "--json"],
            ["show", "latest", *store, "--json"],
            ["show", "latest", *store],
        ]
    )
    assert history.code == 0 and shown.code == 0, history.explain() + shown.explain()
    for row in document("history", history_json)["series"]:
        assert "duration_ms" in row and "requests" not in row and "stored_bytes" not in row
    doc = document("show", shown_json)
    assert "retries" in doc and "requests" not in doc and "stored_bytes" not in doc
    assert " req" not in history.stdout and " stored" not in history.stdout
    facts = {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines() if line}
    assert facts["stored"] == ["—"] and facts["requests"] == ["—"]
