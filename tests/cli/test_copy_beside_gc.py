"""``cairn copy --all`` while a GC of the source runs beside it.

A store wrapper plays the GC: right after the copy listed the source, at the first read
of checkpoint X (its manifest, or later one of its artifacts), it deletes X as GC does,
the manifest first, then everything under X's directory. X is then skipped with a note,
the others are copied and verified, and the exit code is 0. A checkpoint that is
damaged instead (its manifest still there) fails the copy, as ever.

The command runs in this process (``cairn.cli.main``, what the console script runs), its
source store opened through the wrapper.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import pytest
from support.cli import PREFIX, Run

import cairn.cli
import cairn.cli.session
from cairn import CheckpointData, CheckpointId, CheckpointPaths, ObjectStoreCheckpointer
from cairn.cli import views
from cairn.protocol.discover import short_ids
from cairn.stores import ForwardingStore, PutMode, Store, StoreMethod, as_store, open_store

T = TypeVar("T")


class GcBeside(ForwardingStore):
    """Deletes checkpoint ``victim`` (manifest first, then its directory) just before the
    first read whose path ``when`` accepts, as a GC running beside the reader would."""

    def __init__(self, inner: Store, paths: CheckpointPaths, victim: CheckpointId, when: str):
        super().__init__(inner)
        self.manifest = paths.manifest(victim)
        self.directory = paths.checkpoint_dir(victim)
        self.when = when
        self.fired = False

    def _matches(self, path: str) -> bool:
        if self.when == "manifest":
            return path == self.manifest
        return path.startswith(self.directory) and path != self.manifest

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if not self.fired and operation in ("get", "get_range") and self._matches(path):
            self.fired = True
            await self.inner.delete([self.manifest])
            await self.inner.delete_prefix(self.directory)
        return await call()


async def three_checkpoints(root: Path) -> list[CheckpointId]:
    """Three full checkpoints, each standing alone (no chains between them)."""
    ckpt = ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths(PREFIX), compression="zstd")
    saved = []
    for epoch in (1, 2, 3):
        data = CheckpointData(
            epoch=epoch,
            snapshots={("agg", p): f"agg-{p} at {epoch} ".encode() * 500 for p in range(3)},
        )
        saved.append((await ckpt.save(data)).checkpoint_id)
    return saved


def copy_all(
    source: Path,
    target: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    wrap: Callable[[Store], Store],
    *options: str,
) -> Run:
    """``cairn copy --all`` from ``source`` (its store wrapped by ``wrap``) to ``target``."""

    def opening(url: str, **kwargs: Any) -> Any:
        opened = open_store(url, **kwargs)
        return wrap(as_store(opened)) if url == source.as_uri() else opened

    monkeypatch.setattr(cairn.cli.session, "open_store", opening)
    args = ("copy", "--all", "--to", target.as_uri(), "--store", source.as_uri(), *options)
    code = cairn.cli.main(list(args))
    out = capsys.readouterr()
    return Run(args, code, out.out, out.err)


@pytest.mark.parametrize("when", ["manifest", "artifact"])
def test_a_checkpoint_gc_deletes_during_copy_all_is_skipped_with_a_note(
    when: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Deleted when the copy first reads its manifest (planning), or, its manifest read,
    when it first reads one of its artifacts (copying)."""
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    first, victim, last = asyncio.run(three_checkpoints(source))
    paths = CheckpointPaths(PREFIX)
    run = copy_all(
        source,
        target,
        monkeypatch,
        capsys,
        lambda store: GcBeside(store, paths, victim, when),
        "--json",
    )
    assert run.code == 0, run.explain()
    doc = json.loads(run.stdout)
    jsonschema.Draft202012Validator(views.json_schema("copy")).validate(doc)
    rows = {row["id"]: row for row in doc["checkpoints"]}
    assert doc["ok"] is True and "error" not in doc
    assert [rows[str(c)]["status"] for c in (first, victim, last)] == [
        "copied",
        "skipped",
        "copied",
    ]
    assert "deleted from the source while copying" in rows[str(victim)]["note"]
    assert rows[str(victim)]["error"] is None and rows[str(victim)]["uploaded_bytes"] == 0
    assert not (source / PREFIX / str(victim)).exists(), "the wrapper did delete it"

    copied = ObjectStoreCheckpointer(target.as_uri(), CheckpointPaths(PREFIX))
    assert asyncio.run(copied.list_checkpoints()) == [first, last]
    assert not (target / PREFIX / str(victim)).exists(), "nothing of it was written"
    for cid in (first, last):
        loaded = asyncio.run(copied.load(cid))  # every digest verified
        assert set(loaded.artifacts) == {("agg", p) for p in range(3)}


def test_the_note_is_in_the_table_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    ids = asyncio.run(three_checkpoints(source))
    victim = ids[1]
    paths = CheckpointPaths(PREFIX)
    monkeypatch.setenv("COLUMNS", "200")
    run = copy_all(
        source, target, monkeypatch, capsys, lambda s: GcBeside(s, paths, victim, "manifest")
    )
    assert run.code == 0, run.explain()
    name = short_ids(ids)
    [line] = [line for line in run.stdout.splitlines() if " skipped " in line]
    assert line.split()[0] == name[victim], run.stdout
    assert "deleted from the source while copying" in line, run.stdout


@pytest.mark.parametrize("damage", ["manifest", "artifact"])
def test_a_damaged_checkpoint_still_fails_the_copy(
    damage: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its manifest is still there: a flipped byte in it, or one of its artifacts gone,
    is damage, not a deletion."""
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    first, damaged, last = asyncio.run(three_checkpoints(source))
    directory = source / PREFIX / str(damaged)
    if damage == "manifest":
        manifest = directory / "manifest.json"
        manifest.write_bytes(manifest.read_bytes().replace(b'"epoch": 2', b'"epoch": 7'))
    else:
        [pack] = (directory / "packs").iterdir()
        pack.unlink()
    run = copy_all(source, target, monkeypatch, capsys, lambda store: store, "--json")
    assert run.code == 1, run.explain()
    doc = json.loads(run.stdout)
    rows = {row["id"]: row for row in doc["checkpoints"]}
    assert [rows[str(c)]["status"] for c in (first, damaged, last)] == [
        "copied",
        "failed",
        "copied",
    ]
    assert rows[str(damaged)]["error"] and doc["ok"] is False
    assert doc["error"]["exit_code"] == 1 and str(damaged) in doc["error"]["message"]
