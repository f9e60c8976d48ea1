"""Symbolic links in a local store, or in a restore target, are never followed.

Each test plants links inside a ``file://`` store (or a ``cairn restore`` target) that
point at real files in a directory outside it, runs an operation that could follow
them (delete, GC, listing, loads, writes, the command line), and checks that every
file outside is still there, byte for byte, and that nothing new appeared there. See
the invariants of :mod:`cairn.stores` and :mod:`cairn.cli.files`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.artifacts import artifact_path
from support.cli import cairn as run_cli
from support.cli import cairn_many

from cairn import (
    BrokenChainError,
    CheckpointData,
    CheckpointId,
    CheckpointNotFoundError,
    CheckpointPaths,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    StoreError,
)
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.files import write_atomic
from cairn.stores import IfMatch, ObstoreStore, PutMode, open_store

PREFIX = "checkpoints/"
ZERO = dt.timedelta(0)


class Outside:
    """A directory outside the store, and what it held before the test touched anything."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        (root / "secret.txt").write_bytes(b"outside secret\n")
        (root / "sub").mkdir()
        (root / "sub" / "deep.txt").write_bytes(b"outside deep\n")
        # Named like what cairn writes, so a write or delete through a link would hit it.
        (root / "manifest.json").write_bytes(b'{"not": "a manifest"}')
        (root / "operators" / "agg").mkdir(parents=True)
        (root / "operators" / "agg" / "partition-0.snap").write_bytes(b"outside snapshot")
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, bytes | None]:
        """Every entry under the directory: a file's bytes, None for a directory."""
        return {
            str(p.relative_to(self.root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(self.root.rglob("*"))
        }

    def assert_untouched(self) -> None:
        """Nothing outside was deleted, changed or added."""
        assert self.snapshot() == self.before


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    """Files outside the store that links will point at."""
    return Outside(tmp_path / "outside")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The directory of the local store."""
    path = tmp_path / "store"
    path.mkdir()
    return path


def checkpointer(root: Path) -> ObjectStoreCheckpointer:
    """A checkpointer over the local store at ``root``."""
    return ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths(PREFIX))


async def save(ckpt: ObjectStoreCheckpointer, epoch: int) -> CheckpointId:
    """Save a small full checkpoint; its id."""
    data = CheckpointData(epoch=epoch, snapshots={("agg", 0): b"state %d" % epoch})
    return (await ckpt.save(data)).checkpoint_id


def plant_links(directory: Path, outside: Outside) -> list[Path]:
    """Links to a file, to a directory, and one level down, inside ``directory``."""
    links = [directory / "link-file", directory / "link-dir", directory / "operators" / "ln"]
    (directory / "operators").mkdir(exist_ok=True)
    links[0].symlink_to(outside.root / "secret.txt")
    links[1].symlink_to(outside.root / "sub", target_is_directory=True)
    links[2].symlink_to(outside.root, target_is_directory=True)
    return links


def absent(path: Path) -> bool:
    """Nothing at ``path``, not even a link."""
    return not os.path.lexists(path)


def older_id(than: CheckpointId) -> CheckpointId:
    """A valid id that sorts (and dates) a minute before ``than``."""
    value = than.uuid.int - (60_000 << 80)
    return CheckpointId.from_uuid(uuid.UUID(int=value))


# -- delete_checkpoint -----------------------------------------------------------------------


async def test_delete_checkpoint_removes_its_objects_not_links_inside_it_nor_their_targets(
    root: Path, outside: Outside
) -> None:
    ckpt = checkpointer(root)
    cid = await save(ckpt, 1)
    directory = root / PREFIX / str(cid)
    snapshot = root / artifact_path(ckpt.paths, await ckpt.load_manifest(cid), "agg", 0)
    links = plant_links(directory, outside)

    await ckpt.delete_checkpoint(cid)

    outside.assert_untouched()
    assert absent(directory / "manifest.json") and absent(snapshot)
    # With nothing listed left, the directory goes whole: the links as links, never followed.
    assert absent(directory) and not any(link.is_symlink() for link in links)
    assert await ckpt.list_checkpoints() == []


async def test_delete_checkpoint_of_a_linked_directory_follows_not_the_link(
    root: Path, outside: Outside
) -> None:
    ckpt = checkpointer(root)
    cid = await save(ckpt, 1)
    fake = older_id(cid)
    link = root / PREFIX / str(fake)
    link.symlink_to(outside.root, target_is_directory=True)

    assert await ckpt.list_checkpoints() == [cid], "a linked directory is no checkpoint"
    await ckpt.delete_checkpoint(fake)

    outside.assert_untouched()
    assert link.is_symlink()
    assert (await ckpt.load(cid)).epoch == 1


# -- gc --------------------------------------------------------------------------------------


async def test_gc_sweeps_neither_through_a_linked_orphan_nor_links_in_doomed_checkpoints(
    root: Path, outside: Outside
) -> None:
    ckpt = checkpointer(root)
    old = await save(ckpt, 1)
    new = await save(ckpt, 2)
    old_snapshot = root / artifact_path(ckpt.paths, await ckpt.load_manifest(old), "agg", 0)
    assert old_snapshot.exists()
    orphan = root / PREFIX / str(older_id(old))
    orphan.symlink_to(outside.root, target_is_directory=True)
    links = plant_links(root / PREFIX / str(old), outside)

    planned = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO, dry_run=True)
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO)

    outside.assert_untouched()
    for run in (planned, result):
        assert run.deleted == [old] and run.failures == []
        assert not [p for p in run.orphans_deleted if p.startswith(f"{PREFIX}{orphan.name}/")]
    # Links are not objects: GC neither lists nor removes them (nor does delete_checkpoint).
    assert orphan.is_symlink() and all(link.is_symlink() for link in links)
    assert not (root / PREFIX / str(old) / "manifest.json").exists()
    assert not old_snapshot.exists()
    assert await ckpt.list_checkpoints() == [new]
    assert (await ckpt.load(new)).epoch == 2


# -- listing ---------------------------------------------------------------------------------


async def test_listing_neither_reports_nor_follows_links(root: Path, outside: Outside) -> None:
    ckpt = checkpointer(root)
    cid = await save(ckpt, 1)
    directory = root / PREFIX / str(cid)
    plant_links(directory, outside)
    (directory / "loop").symlink_to(root, target_is_directory=True)  # would list forever
    (directory / "dangling").symlink_to(outside.root / "missing")
    (root / PREFIX / str(older_id(cid))).symlink_to(outside.root, target_is_directory=True)
    store = ObstoreStore(open_store(root.as_uri()))

    def real(under: Path, recursive: bool) -> list[str]:
        entries = under.rglob("*") if recursive else under.iterdir()
        return sorted(p.relative_to(root).as_posix() for p in entries if p.is_file())

    # rglob does not descend into linked directories; drop the links themselves.
    files = [p for p in real(root, True) if not (root / p).is_symlink()]
    assert len(files) >= 3  # _latest, the manifest, the snapshot
    listed = await store.list("")
    assert sorted(info.path for info in listed) == files
    assert [i.path for i in await store.list(f"{PREFIX}{cid}/link-dir/")] == []
    level = await store.list_dir(f"{PREFIX}{cid}/")
    assert level.prefixes == [f"{PREFIX}{cid}/operators/"]
    assert [info.path for info in level.objects] == [
        p for p in real(directory, False) if not (root / p).is_symlink()
    ]
    base = await store.list_dir(PREFIX)
    assert base.prefixes == [f"{PREFIX}{cid}/"]
    assert await ckpt.list_checkpoints() == [cid]
    # A listing reports what a HEAD of the same object does.
    for info in listed:
        assert await store.head(info.path) == info
    outside.assert_untouched()


# -- reads -----------------------------------------------------------------------------------


async def test_reads_through_links_are_refused_and_loading_falls_back(
    root: Path, outside: Outside
) -> None:
    ckpt = checkpointer(root)
    good = await save(ckpt, 1)
    bad = await save(ckpt, 2)
    artifact = artifact_path(ckpt.paths, await ckpt.load_manifest(bad), "agg", 0)
    # The same bytes outside: only refusing the link makes the load fail.
    copy = outside.root / "copy.snap"
    copy.write_bytes((root / artifact).read_bytes())
    outside.before = outside.snapshot()
    (root / artifact).unlink()
    (root / artifact).symlink_to(copy)

    with pytest.raises(BrokenChainError, match=artifact):
        await ckpt.load(bad)
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == good

    store = ckpt.store
    (root / PREFIX / str(good) / "link-dir").symlink_to(outside.root, target_is_directory=True)
    through = f"{PREFIX}{good}/link-dir/secret.txt"
    for path, link in ((artifact, artifact), (through, f"{PREFIX}{good}/link-dir")):
        with pytest.raises(CheckpointNotFoundError, match=f"symbolic link '{link}'"):
            await ckpt.load_artifact(path)
        with pytest.raises(CheckpointNotFoundError, match=f"symbolic link '{link}'"):
            await store.get_range(path, 0, 4)
        with pytest.raises(CheckpointNotFoundError, match=f"symbolic link '{link}'"):
            await store.head(path)
        with pytest.raises(CheckpointNotFoundError, match=f"symbolic link '{link}'"):
            await store.stat(path)
        with pytest.raises(CheckpointNotFoundError):
            await ckpt.load_artifact_to(path, root.parent / "dest.bin")
    assert not (root.parent / "dest.bin").exists()
    outside.assert_untouched()


async def test_a_linked_manifest_is_no_checkpoint(root: Path, outside: Outside) -> None:
    ckpt = checkpointer(root)
    good = await save(ckpt, 1)
    bad = await save(ckpt, 2)
    manifest = root / PREFIX / str(bad) / "manifest.json"
    manifest.unlink()
    manifest.symlink_to(outside.root / "manifest.json")

    assert await ckpt.list_checkpoints() == [good]
    with pytest.raises(CheckpointNotFoundError):
        await ckpt.load(bad)
    outside.assert_untouched()


# -- writes ----------------------------------------------------------------------------------


async def test_writes_through_or_over_links_are_refused(root: Path, outside: Outside) -> None:
    store = ObstoreStore(open_store(root.as_uri()))
    (root / "dir-link").symlink_to(outside.root, target_is_directory=True)
    (root / "file-link").symlink_to(outside.root / "secret.txt")
    (root / "new-link").symlink_to(outside.root / "created.txt")  # dangling

    async def chunks() -> AsyncIterator[bytes]:
        yield b"streamed"

    modes: tuple[PutMode, ...] = ("overwrite", "create")

    for path, link in (
        ("dir-link/secret.txt", "dir-link"),
        ("dir-link/fresh/new.bin", "dir-link"),
        ("file-link", "file-link"),
        ("new-link", "new-link"),
    ):
        for mode in modes:
            with pytest.raises(StoreError, match=f"'{link}' is a symbolic link") as info:
                await store.put(path, b"written", mode=mode)
            assert info.value.path == path and info.value.operation == "put"
        with pytest.raises(StoreError, match=f"'{link}' is a symbolic link"):
            await store.put_stream(path, chunks)
    outside.assert_untouched()
    assert (root / "file-link").is_symlink() and (root / "new-link").is_symlink()


async def test_latest_pointer_and_a_leftover_lock_file_are_never_written_through(
    root: Path, outside: Outside
) -> None:
    ckpt = checkpointer(root)
    first = await save(ckpt, 1)
    # Earlier versions locked a ``._latest.lock`` sidecar; one left behind as a link
    # (dangling: O_CREAT would create its target) is never opened, let alone created.
    lock = root / PREFIX / "._latest.lock"
    lock.symlink_to(outside.root / "created-by-lock")
    second = await save(ckpt, 2)
    outside.assert_untouched()
    assert await ckpt.read_latest() == second and lock.is_symlink()

    pointer = root / PREFIX / "_latest"
    pointer.unlink()
    pointer.symlink_to(outside.root / "secret.txt")
    third = await save(ckpt, 3)
    outside.assert_untouched()
    assert await ckpt.exists(third) and pointer.is_symlink()
    with pytest.raises(StoreError, match="'checkpoints/_latest' is a symbolic link"):
        await ckpt.update_latest(third)
    # The pointer reads as absent, so readers fall back to listing.
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.epoch == 3
    assert first in await ckpt.list_checkpoints()


async def test_compare_and_swap_stays_in_the_root_and_leaves_no_lock_file(
    root: Path, outside: Outside
) -> None:
    # obstore reads "/abs/x" as "abs/x" under the root; the directory locked is there too.
    store = ObstoreStore(open_store(root.as_uri()))
    path = str(outside.root / "pointer")
    first = await store.put(path, b"1")
    assert first.path == path
    await store.put(path, b"2", mode=IfMatch((await store.head(path)).e_tag or ""))
    assert (await store.get(path)).data == b"2"
    inside = root.joinpath(*path.strip("/").split("/"))
    assert inside.read_bytes() == b"2"
    assert sorted(p.name for p in inside.parent.iterdir()) == ["pointer"]
    outside.assert_untouched()


async def test_store_delete_and_delete_prefix_never_follow_links(
    root: Path, outside: Outside
) -> None:
    store = ObstoreStore(open_store(root.as_uri()))
    await store.put("a/real.bin", b"real")
    (root / "a" / "dir-link").symlink_to(outside.root, target_is_directory=True)
    (root / "a" / "file-link").symlink_to(outside.root / "secret.txt")
    (root / "b").symlink_to(outside.root, target_is_directory=True)

    await store.delete(["a/dir-link/secret.txt", "a/dir-link/sub/deep.txt", "b/manifest.json"])
    outside.assert_untouched()
    await store.delete(["a/file-link"])
    assert absent(root / "a" / "file-link")
    await store.delete_prefix("b/operators/")
    await store.delete_prefix("a/dir-link/sub/")
    outside.assert_untouched()
    await store.delete_prefix("a/")
    outside.assert_untouched()
    assert absent(root / "a")
    with pytest.raises(StoreError, match="not a valid object path"):
        await store.list("../outside/")


async def test_local_listing_and_delete_keep_obstore_semantics(root: Path) -> None:
    # Listing and deleting are cairn's own on a local store: what obstore did still holds.
    plain = ObstoreStore(open_store(root.as_uri()))
    tidy = ObstoreStore(open_store(root.as_uri(), automatic_cleanup=True))
    await plain.put("a/b/kept.bin", b"1")
    await plain.put("c/d/gone.bin", b"2")
    (root / "a" / "b" / "kept.bin#3").write_bytes(b"a write in flight")  # obstore's staging
    assert [info.path for info in await plain.list("a/")] == ["a/b/kept.bin"]
    assert (await plain.list_dir("a/b/")).objects == [await plain.head("a/b/kept.bin")]
    assert await plain.list("missing/") == [] and await plain.list("a/b/kept.bin/") == []

    await plain.delete(["a/b/kept.bin", "a/b/never-was.bin", "x/y/z.bin"])
    assert absent(root / "a" / "b" / "kept.bin") and (root / "a" / "b").is_dir()  # staging
    await tidy.delete(["c/d/gone.bin"])
    assert absent(root / "c") and not absent(root), "emptied folders go, the root stays"
    with pytest.raises(StoreError, match="store delete failed for 'a/b'"):
        await plain.delete(["a/b"])  # a directory is no object
    with pytest.raises(StoreError, match="store delete failed for 'a/b/kept.bin#3'"):
        await plain.delete(["a/b/kept.bin#3"])  # as obstore: a staging name is no object
    assert (root / "a" / "b" / "kept.bin#3").read_bytes() == b"a write in flight"


async def test_a_restore_to_a_path_neither_follows_nor_replaces_a_link_there(
    root: Path, outside: Outside, tmp_path: Path
) -> None:
    # load_artifact_to(path) must not rename its verified file over whatever holds the
    # name: a link there is refused, as everywhere else in cairn.
    ckpt = checkpointer(root)
    cid = await save(ckpt, 1)
    manifest = await ckpt.load_manifest(cid)
    artifact = artifact_path(ckpt.paths, manifest, "agg", 0)
    dest_dir = tmp_path / "dest"
    dest_dir.mkdir()
    links = {
        "file-link": outside.root / "secret.txt",
        "dangling": outside.root / "created.txt",
        "dir-link": outside.root / "sub",
    }
    for name, target in links.items():
        (dest_dir / name).symlink_to(target)
        with pytest.raises(InvalidInputError, match="a symbolic link"):
            await ckpt.load_artifact_to(artifact, dest_dir / name)
        assert (dest_dir / name).is_symlink() and os.readlink(dest_dir / name) == str(target)
    assert sorted(p.name for p in dest_dir.iterdir()) == sorted(links), "no temp file left"
    outside.assert_untouched()
    digest = await ckpt.load_artifact_to(artifact, dest_dir / "real.bin")
    assert (dest_dir / "real.bin").read_bytes() == (root / artifact).read_bytes()
    assert digest == hashlib.sha256((root / artifact).read_bytes()).hexdigest()


# -- cairn restore into a directory holding links --------------------------------------------


def test_write_atomic_refuses_links_on_the_way_and_at_the_name(
    tmp_path: Path, outside: Outside
) -> None:
    target = tmp_path / "target"
    (target / "real").mkdir(parents=True)
    (target / "dir-link").symlink_to(outside.root, target_is_directory=True)
    (target / "real" / "name-link").symlink_to(outside.root / "secret.txt")

    for path, link in (
        (target / "dir-link" / "secret.txt", target / "dir-link"),
        (target / "dir-link" / "new" / "file.bin", target / "dir-link"),
        (target / "real" / "name-link", target / "real" / "name-link"),
    ):
        with pytest.raises(CliError, match=f"cannot write through {link}: it is a symbolic"):
            write_atomic(path, b"restored", root=target)
    outside.assert_untouched()
    assert sorted(p.name for p in (target / "real").iterdir()) == ["name-link"], "no temp left"
    write_atomic(target / "real" / "new" / "file.bin", b"restored", root=target)
    assert (target / "real" / "new" / "file.bin").read_bytes() == b"restored"


def test_cli_restore_delete_and_gc_never_follow_links(
    root: Path, outside: Outside, tmp_path: Path
) -> None:
    ckpt = checkpointer(root)
    old, new = asyncio.run(save(ckpt, 1)), asyncio.run(save(ckpt, 2))
    links = plant_links(root / PREFIX / str(old), outside)
    (root / PREFIX / str(older_id(old))).symlink_to(outside.root, target_is_directory=True)
    on_the_way = (tmp_path / "on-the-way").resolve()  # the CLI resolves --to
    on_the_way.mkdir()
    (on_the_way / str(new)).symlink_to(outside.root, target_is_directory=True)
    at_the_name = (tmp_path / "at-the-name").resolve()
    (at_the_name / str(new)).mkdir(parents=True)
    (at_the_name / str(new) / "manifest.json").symlink_to(outside.root / "manifest.json")
    store = ["--store", root.as_uri(), "--prefix", PREFIX]

    way, name = cairn_many(
        [
            ["restore", str(new), "--to", str(on_the_way), *store],
            ["restore", str(new), "--to", str(at_the_name), *store],
        ]
    )
    for run, link in ((way, on_the_way / str(new)), (name, at_the_name / str(new))):
        assert run.code == ExitCode.USAGE, run.explain()
        assert f"cannot write through {link}" in run.error_line(), run.explain()
    # Refused before any file was written: the only entry is still the link.
    assert [p.name for p in at_the_name.rglob("*")] == [str(new), "manifest.json"]
    assert (at_the_name / str(new) / "manifest.json").is_symlink()
    outside.assert_untouched()

    deleted = run_cli("delete", str(old), *store, "--json")
    assert deleted.code == 0, deleted.explain()
    assert absent(root / PREFIX / str(old)), "the links are removed, as links"
    assert not any(link.is_symlink() for link in links)
    outside.assert_untouched()
    collected = run_cli("gc", "--keep-last", "1", "--min-age", "0s", *store, "--json")
    assert collected.code == 0, collected.explain()
    assert collected.json()["orphans_deleted"] == []
    outside.assert_untouched()
    again = run_cli("restore", "latest", "--to", str(tmp_path / "restored"), *store, "--json")
    assert again.code == 0, again.explain()
    assert again.json()["id"] == str(new)
    outside.assert_untouched()
