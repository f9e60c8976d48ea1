"""One meaning of "latest" on a store whose newest checkpoint is damaged.

The library (``latest_id``, ``load_latest``) and every command (``list``, ``show``,
``restore``, ``verify``) name the same checkpoint "latest": the newest that loads and
verifies. "newest" names the newest committed one whether it loads or not; ``list``
marks it when it does not load, and ``verify newest`` reports its damage.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.artifacts import artifact_path
from support.cli import PREFIX, Filled, cairn_many, document, flip_byte, store_root

from cairn import CheckpointData, CheckpointPaths, ObjectStoreCheckpointer, SyncCheckpointer
from cairn.cli.catalog import MARK_VERIFIES_UP_TO


def _damage_newest(local: Filled) -> Path:
    """Flip one byte of an artifact of ``local.newest``, as examples/quickstart.py does:
    its manifest still reads, its artifacts do not verify. Returns the object."""
    ckpt = ObjectStoreCheckpointer(local.url, CheckpointPaths(PREFIX))
    manifest = asyncio.run(ckpt.load_manifest(local.newest))
    target = store_root(local) / artifact_path(ckpt.paths, manifest, "agg", 0)
    flip_byte(target)
    return target


def test_library_and_commands_agree_on_latest_when_the_newest_is_damaged(
    local: Filled, tmp_path: Path
) -> None:
    damaged = _damage_newest(local)
    ckpt = SyncCheckpointer(local.url, CheckpointPaths(PREFIX))
    loaded = ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == local.delta
    assert ckpt.latest_id() == local.delta
    assert ckpt.newest_id() == local.newest

    store = ["--store", local.url]
    target = tmp_path / "restored"
    listed, table, shown, shown_newest, restored, verified, verified_newest = cairn_many(
        [
            ["list", *store, "--json"],
            ["list", *store],
            ["show", "latest", *store, "--json"],
            ["show", "newest", *store],
            ["restore", "latest", "--to", str(target), *store, "--json"],
            ["verify", "latest", *store, "--json"],
            ["verify", "newest", *store],
        ]
    )
    doc = document("list", listed)
    assert listed.code == 0, listed.explain()
    assert doc["latest"] == str(local.delta) and doc["newest"] == str(local.newest)
    assert [c["latest"] for c in doc["checkpoints"]] == [False, True, False]
    assert [c["newest"] for c in doc["checkpoints"]] == [False, False, True]
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line.strip()}
    assert any(str(local.delta).startswith(k) and "◀ latest" in v for k, v in rows.items())
    assert any(
        str(local.newest).startswith(k) and "newest, does not load" in v for k, v in rows.items()
    ), table.explain()
    assert f"the newest checkpoint, {local.newest}, does not load" in table.stderr

    assert shown.code == 0, shown.explain()
    show = document("show", shown)
    assert show["id"] == str(local.delta) and show["latest"] is True and show["newest"] is False
    assert shown_newest.code == 0, shown_newest.explain()
    assert str(local.newest) in shown_newest.stdout and "does not load" in shown_newest.stdout

    assert restored.code == 0, restored.explain()
    assert document("restore", restored)["id"] == str(local.delta)
    assert (target / str(local.delta) / "manifest.json").is_file()

    assert verified.code == 0, verified.explain()
    assert [c["id"] for c in document("verify", verified)["checkpoints"]] == [str(local.delta)]
    assert verified_newest.code == 1, verified_newest.explain()
    assert damaged.name in verified_newest.error_line()


def test_latest_when_no_checkpoint_loads_is_an_integrity_failure(
    local: Filled, tmp_path: Path
) -> None:
    _damage_newest(local)
    flip_byte(store_root(local) / local.base_snapshot)  # the base, and the delta on it
    ckpt = SyncCheckpointer(local.url, CheckpointPaths(PREFIX))
    assert ckpt.load_latest() is None and ckpt.latest_id() is None
    assert ckpt.newest_id() == local.newest
    store = ["--store", local.url]
    listed, restored = cairn_many(
        [["list", *store, "--json"], ["restore", "latest", "--to", str(tmp_path / "r"), *store]]
    )
    assert listed.code == 0, listed.explain()
    doc = document("list", listed)
    assert doc["latest"] is None and doc["newest"] == str(local.newest)
    assert "no checkpoint loads" in listed.stderr
    assert restored.code == 1, restored.explain()
    *warnings, line = [line for line in restored.stderr.splitlines() if line.strip()]
    assert len(warnings) == 3 and all("does not load" in w for w in warnings), restored.explain()
    assert line.startswith("error: no checkpoint in ")
    assert "loads: all 3 committed checkpoint(s) are damaged" in line
    assert not (tmp_path / "r").exists()


def test_list_leaves_a_newest_too_large_to_read_unverified(tmp_path: Path) -> None:
    # `list` is meant to be quick: over MARK_VERIFIES_UP_TO bytes of artifacts, the
    # newest is marked newest, unverified, and none of it is read. Its damage (a flipped
    # byte) therefore goes unnoticed here, where reading it would have found it.
    root = tmp_path / "store"
    ckpt = SyncCheckpointer(str(root))
    small = ckpt.save(CheckpointData(epoch=1, snapshots={("agg", 0): b"small"}))
    big = ckpt.save(CheckpointData(epoch=2, snapshots={("agg", 0): bytes(MARK_VERIFIES_UP_TO + 1)}))
    manifest = asyncio.run(ObjectStoreCheckpointer(str(root)).load_manifest(big.checkpoint_id))
    flip_byte(root / artifact_path(ckpt.paths, manifest, "agg", 0))
    listed, table = cairn_many(
        [["list", "--store", str(root), "--json"], ["list", "--store", str(root)]]
    )
    assert listed.code == 0, listed.explain()
    doc = document("list", listed)
    assert doc["latest"] is None and doc["latest_verified"] is False
    assert doc["newest"] == str(big.checkpoint_id)
    assert [c["latest"] for c in doc["checkpoints"]] == [False, False]
    assert "does not load" not in table.stderr + table.stdout, table.explain()
    assert "too large to verify here" in table.stdout, table.explain()
    assert ckpt.latest_id() == small.checkpoint_id  # reading it all finds the damage
