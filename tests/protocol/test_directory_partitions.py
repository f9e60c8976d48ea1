"""Directory partitions: saved file by file, carried file by file, restored whole.

On memory, local, S3 and Azure: a restore is bit-exact; a damaged file (uploaded or
carried) is caught naming it and leaves ``dest`` as it was; a link inside is refused with
the store unchanged; increments upload only changed files, trusting size and mtime
unless told to hash; GC and deletion keep every file a retained checkpoint names. A save
in two phases uploads directory partitions too, carrying unchanged files from the parent
its lease names (memory, local, S3), refuses bad input before any I/O, and ends on a
failure with nothing of it left.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from obstore.store import ObjectStore
from support.backends import make_checkpointer, make_store
from support.cli import PREFIX, cairn, cairn_many
from support.intents import intents_of, is_intent_path
from support.recording import RecordingStore
from support.swaps import link_before_rename

from cairn import (
    BrokenChainError,
    CheckpointData,
    CheckpointId,
    CheckpointInUseError,
    CheckpointPaths,
    IntegrityMismatchError,
    InvalidCheckpointDataError,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    RetryPolicy,
    SpecialFileError,
    SyncCheckpointer,
    TransientStoreError,
)
from cairn.format.manifest import (
    CheckpointManifest,
    check_manifest,
    decode_manifest,
    encode_manifest,
)
from cairn.integrations._interface import assemble_manifest, begin
from cairn.protocol import _save
from cairn.stores import ForwardingStore, ObjectInfo, as_store

KEY = ("db", 0)


@pytest.fixture(params=["memory", "local", "s3", "azure"])
def dir_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """A fresh store of each backend directory partitions are tested on."""
    return make_store(str(request.param), tmp_path, request)


@pytest.fixture
def dckpt(dir_store: ObjectStore) -> ObjectStoreCheckpointer:
    """A checkpointer over that store."""
    return make_checkpointer(dir_store)


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Create ``files`` (relative path to bytes) under ``root``."""
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


TREE = {
    "CURRENT": b"MANIFEST-000007\n",
    "000001.sst": bytes(range(256)) * 64,
    "empty": b"",
    "archive/nested/deep.log": b"deep" * 1000,
    "big.sst": os.urandom(9 * 2**20 + 17),  # over one read chunk: streamed
}


async def stored_paths(ckpt: ObjectStoreCheckpointer) -> set[str]:
    return {info.path for info in await ckpt.store.list((await ckpt.resolve_paths()).base_prefix)}


async def test_restore_is_bit_exact(dckpt: ObjectStoreCheckpointer, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, TREE)
    manifest = await dckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    assert manifest.total_size_bytes == sum(map(len, TREE.values()))
    assert manifest.stats is not None and manifest.stats.uploaded_artifacts == len(TREE)

    loaded = await dckpt.load(manifest.checkpoint_id)
    listed = {f.relative_path: f.size_bytes for f in loaded.directories[KEY]}
    assert listed == {name: len(data) for name, data in TREE.items()}
    assert loaded.artifacts == {}

    dest = tmp_path / "out" / "restored"
    files = await dckpt.restore_directory(manifest.checkpoint_id, *KEY, dest)
    assert read_tree(dest) == TREE
    assert len(files) == len(TREE)
    assert sorted(os.listdir(dest.parent)) == ["restored"]  # no staging left

    empty = tmp_path / "empty-dest"
    empty.mkdir()
    await dckpt.restore_directory(manifest.checkpoint_id, *KEY, empty)
    assert read_tree(empty) == TREE


async def saved_twice_into(
    ckpt: ObjectStoreCheckpointer, src: Path, files: dict[str, bytes], changed: str, new: bytes
) -> tuple[CheckpointManifest, CheckpointManifest]:
    """Two checkpoints of one directory partition in ``ckpt``: ``files`` written to
    ``src``, then the same with ``changed`` rewritten to ``new`` (the second carries the
    rest from the first)."""
    write_tree(src, files)
    first = await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    (src / changed).write_bytes(new)
    second = await ckpt.save(
        CheckpointData(epoch=2, directories={KEY: src}, parent_id=first.checkpoint_id)
    )
    return first, second


async def test_a_flipped_byte_is_caught_naming_the_file(
    dckpt: ObjectStoreCheckpointer, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    first, second = await saved_twice_into(
        dckpt, src, {"kept.sst": b"k" * 500, "changed.sst": b"a" * 300}, "changed.sst", b"b" * 301
    )
    files = {f.relative_path: f for f in second.directories[0].files}
    assert files["kept.sst"].owner == first.checkpoint_id
    assert files["changed.sst"].owner is None

    dest = tmp_path / "dest"
    dest.mkdir()
    for name in ("kept.sst", "changed.sst"):
        entry = files[name]
        path = dckpt.paths.resolve(entry.owner or second.checkpoint_id, entry.path)
        original = bytes((await dckpt.store.get(path)).data)
        await dckpt.store.put(path, bytes([original[0] ^ 1]) + original[1:])
        with pytest.raises(IntegrityMismatchError, match=name):
            await dckpt.restore_directory(second.checkpoint_id, *KEY, dest)
        assert os.listdir(dest) == []
        assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]
        await dckpt.store.put(path, original)
    await dckpt.restore_directory(second.checkpoint_id, *KEY, dest)
    assert read_tree(dest) == read_tree(src)


async def test_a_link_inside_is_refused_and_the_store_is_unchanged(
    dckpt: ObjectStoreCheckpointer, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a.sst": b"a", "sub/b.sst": b"b"})
    await dckpt.save(CheckpointData(epoch=1, snapshots={("other", 0): b"x"}))
    before = await stored_paths(dckpt)
    (src / "sub" / "link").symlink_to(tmp_path)
    with pytest.raises(SpecialFileError, match="sub/link") as caught:
        await dckpt.save(CheckpointData(epoch=2, directories={KEY: src}))
    assert caught.value.kind == "symbolic link"
    assert await stored_paths(dckpt) == before
    assert len(await dckpt.list_checkpoints()) == 1


async def test_a_fifo_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a": b"a"})
    os.mkfifo(src / "pipe")
    ckpt = make_checkpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    with pytest.raises(SpecialFileError, match="FIFO"):
        await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))


async def test_deleted_and_renamed_files_disappear(
    dckpt: ObjectStoreCheckpointer, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a": b"1" * 10, "b": b"2" * 20, "c": b"3" * 30})
    first = await dckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    (src / "a").unlink()
    (src / "b").rename(src / "renamed")
    second = await dckpt.save(
        CheckpointData(epoch=2, directories={KEY: src}, parent_id=first.checkpoint_id)
    )
    dest = tmp_path / "dest"
    await dckpt.restore_directory(second.checkpoint_id, *KEY, dest)
    assert read_tree(dest) == {"c": b"3" * 30, "renamed": b"2" * 20}
    old = tmp_path / "old"
    await dckpt.restore_directory(first.checkpoint_id, *KEY, old)
    assert set(read_tree(old)) == {"a", "b", "c"}


async def test_an_increment_uploads_only_changed_files(tmp_path: Path) -> None:
    store = RecordingStore(as_store(make_store("memory", tmp_path, None)))  # type: ignore[arg-type]
    ckpt = make_checkpointer(store)
    src = tmp_path / "src"
    write_tree(src, {f"{i:06}.sst": bytes([i]) * (100 + i) for i in range(20)})
    first = await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    (src / "000003.sst").write_bytes(b"new" * 50)
    (src / "000099.sst").write_bytes(b"added")
    store.log.clear()
    second = await ckpt.save(
        CheckpointData(epoch=2, directories={KEY: src}, parent_id=first.checkpoint_id)
    )
    sent = [path for op, path in store.log if op.startswith("put") and ".file-" in path]
    assert len(sent) == 2
    assert second.stats is not None
    assert (second.stats.uploaded_artifacts, second.stats.carried_artifacts) == (2, 19)
    assert second.stats.uploaded_bytes == 150 + 5
    dest = tmp_path / "dest"
    await ckpt.restore_directory(second.checkpoint_id, *KEY, dest)
    assert read_tree(dest) == read_tree(src)


async def test_same_size_and_mtime_is_carried_stale_unless_hashing(
    dckpt: ObjectStoreCheckpointer, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    write_tree(src, {"data.sst": b"old-bytes", "other": b"o"})
    first = await dckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    stat = (src / "data.sst").stat()
    (src / "data.sst").write_bytes(b"new-bytes")
    os.utime(src / "data.sst", ns=(stat.st_atime_ns, stat.st_mtime_ns))

    trusted = await dckpt.save(
        CheckpointData(epoch=2, directories={KEY: src}, parent_id=first.checkpoint_id)
    )
    dest = tmp_path / "trusted"
    await dckpt.restore_directory(trusted.checkpoint_id, *KEY, dest)
    assert (dest / "data.sst").read_bytes() == b"old-bytes"  # carried stale, as documented

    hashed = await dckpt.save(
        CheckpointData(
            epoch=3,
            directories={KEY: src},
            parent_id=trusted.checkpoint_id,
            directory_check="hash",
        )
    )
    owners = {f.relative_path: f.owner for f in hashed.directories[0].files}
    assert owners == {"data.sst": None, "other": first.checkpoint_id}
    dest = tmp_path / "hashed"
    await dckpt.restore_directory(hashed.checkpoint_id, *KEY, dest)
    assert (dest / "data.sst").read_bytes() == b"new-bytes"


async def test_gc_and_delete_keep_the_files_a_retained_checkpoint_names(
    dckpt: ObjectStoreCheckpointer, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    first, second = await saved_twice_into(
        dckpt, src, {"a": b"a" * 100, "b": b"b" * 100}, "b", b"B" * 101
    )
    assert await dckpt.dependents(first.checkpoint_id) == [second.checkpoint_id]
    with pytest.raises(CheckpointInUseError):
        await dckpt.delete_checkpoint(first.checkpoint_id)
    await dckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert await dckpt.list_checkpoints() == [second.checkpoint_id]
    dest = tmp_path / "dest"
    await dckpt.restore_directory(second.checkpoint_id, *KEY, dest)
    assert read_tree(dest) == read_tree(src)


async def test_a_directory_the_save_does_not_mention_is_carried(tmp_path: Path) -> None:
    ckpt = make_checkpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    src = tmp_path / "src"
    write_tree(src, {"a": b"a"})
    first = await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    second = await ckpt.save(
        CheckpointData(epoch=2, snapshots={("x", 0): b"x"}, parent_id=first.checkpoint_id)
    )
    loaded = await ckpt.load(second.checkpoint_id)
    assert [f.owner for f in loaded.directories[KEY]] == [first.checkpoint_id]
    await ckpt.restore_directory(second.checkpoint_id, *KEY, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == {"a": b"a"}
    with pytest.raises(InvalidCheckpointDataError):
        CheckpointData(epoch=3, snapshots={KEY: b"x"}, directories={KEY: src})


async def test_restore_refuses_a_dest_that_holds_something(tmp_path: Path) -> None:
    ckpt = make_checkpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    src = tmp_path / "src"
    write_tree(src, {"a": b"a"})
    saved = await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    with pytest.raises(InvalidInputError, match="a directory that is not empty"):
        await ckpt.restore_directory(saved.checkpoint_id, *KEY, src)
    assert read_tree(src) == {"a": b"a"}
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "linked").symlink_to(empty, target_is_directory=True)
    with pytest.raises(InvalidInputError, match="linked': it is a symbolic link"):
        await ckpt.restore_directory(saved.checkpoint_id, *KEY, tmp_path / "linked")
    assert os.readlink(tmp_path / "linked") == str(empty) and os.listdir(empty) == []
    with pytest.raises(InvalidInputError, match="a': it is a file, not a directory"):
        await ckpt.restore_directory(saved.checkpoint_id, *KEY, src / "a")
    assert read_tree(src) == {"a": b"a"}
    gone = saved.directories[0].files[0]
    await ckpt.store.delete([ckpt.paths.resolve(saved.checkpoint_id, gone.path)])
    with pytest.raises(BrokenChainError, match="'a'"):
        await ckpt.restore_directory(saved.checkpoint_id, *KEY, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


class _SwappingStore(ForwardingStore):
    """Swaps the staging directory of a restore into ``dest`` for a link to ``outside``
    (moving the real one aside) as the restore reads its first file."""

    def __init__(self, inner: Any, dest: Path, outside: Path) -> None:
        super().__init__(inner)
        self.dest, self.outside, self.swapped = dest, outside, False

    async def _around(self, operation: str, path: str, call: Any, **kwargs: Any) -> Any:
        if operation == "get_range" and not self.swapped:
            [staging] = self.dest.parent.glob(f".{self.dest.name}.*.partial")
            staging.rename(self.dest.parent / "moved-aside")
            staging.symlink_to(self.outside, target_is_directory=True)
            self.swapped = True
        return await call()


async def test_a_staging_directory_swapped_for_a_link_is_never_written_through(
    tmp_path: Path,
) -> None:
    src, outside, dest = tmp_path / "src", tmp_path / "outside", tmp_path / "out" / "dest"
    write_tree(src, {"a": b"a" * 10, "sub/b": b"b" * 20})
    outside.mkdir()
    store = as_store(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    saved = await make_checkpointer(store).save(CheckpointData(epoch=1, directories={KEY: src}))
    swapping = _SwappingStore(store, dest, outside)
    ckpt = make_checkpointer(swapping)

    with pytest.raises(InvalidInputError, match="staging directory .* was replaced"):
        await ckpt.restore_directory(saved.checkpoint_id, *KEY, dest)
    assert swapping.swapped
    assert os.listdir(outside) == [], "nothing written through the link"
    assert not dest.exists() and not dest.is_symlink()


async def test_a_link_swapped_in_at_dest_before_the_rename_is_refused_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, outside, dest = tmp_path / "src", tmp_path / "outside", tmp_path / "dest"
    write_tree(src, {"a": b"a"})
    outside.mkdir()
    ckpt = make_checkpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    saved = await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    link_before_rename(monkeypatch, dest, outside)
    with pytest.raises(InvalidInputError, match="dest': it is a symbolic link"):
        await ckpt.restore_directory(saved.checkpoint_id, *KEY, dest)
    assert os.readlink(dest) == str(outside) and os.listdir(outside) == []
    assert sorted(os.listdir(tmp_path)) == ["dest", "outside", "src"], "no staging left"


def test_the_sync_twin_restores(tmp_path: Path) -> None:
    ckpt = SyncCheckpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    src = tmp_path / "src"
    write_tree(src, {"x/y": b"xy"})
    saved = ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    ckpt.restore_directory(saved.checkpoint_id, *KEY, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == {"x/y": b"xy"}


def test_the_manifest_round_trips_and_refuses_bad_file_entries(tmp_path: Path) -> None:
    ckpt = SyncCheckpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    src = tmp_path / "src"
    write_tree(src, {"a": b"a"})
    saved = ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    body = encode_manifest(saved)
    assert decode_manifest("m", body) == saved
    directory = saved.directories[0]
    for change in ({"relative_path": "../a"}, {"path": "operators/db/partition-0.snap"}):
        file = msgspec.structs.replace(directory.files[0], **change)
        bad = msgspec.structs.replace(
            saved, directories=(msgspec.structs.replace(directory, files=(file,)),)
        )
        with pytest.raises(InvalidInputError):
            check_manifest(bad)
    twice = msgspec.structs.replace(saved, directories=(directory, directory))
    with pytest.raises(InvalidInputError, match="twice"):
        check_manifest(twice)


def saved_twice(
    tmp_path: Path, files: dict[str, bytes], changed: str, new: bytes
) -> tuple[Path, Path, CheckpointManifest, CheckpointManifest]:
    """A local store (under the CLI's prefix) with two checkpoints of one directory
    partition: ``files``, then the same with ``changed`` rewritten to ``new`` (the
    second carries the rest). Returns the store's root, the directory, both manifests."""
    source = tmp_path / "source"
    src = tmp_path / "src"
    write_tree(src, files)
    ckpt = SyncCheckpointer(str(source), CheckpointPaths(PREFIX))
    first = ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    (src / changed).write_bytes(new)
    second = ckpt.save(
        CheckpointData(epoch=2, directories={KEY: src}, parent_id=first.checkpoint_id)
    )
    return source, src, first, second


def test_copy_and_cli_restore_of_an_incremental_directory_checkpoint(tmp_path: Path) -> None:
    """``cairn copy`` brings every file (uploaded and carried) and verifies it in the
    target; ``cairn restore`` writes the files as stored; both then restore bit-exact."""
    source, src, _, second = saved_twice(
        tmp_path, {"a.sst": b"a" * 1000, "b.sst": b"b" * 2000}, "b.sst", b"B" * 2001
    )
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
    for root, prefix in ((tmp_path / "copy", PREFIX), (tmp_path / "restored", "")):
        target = SyncCheckpointer(str(root), CheckpointPaths(prefix))
        dest = tmp_path / f"tree-{root.name}"
        target.restore_directory(second.checkpoint_id, *KEY, dest)
        assert read_tree(dest) == read_tree(src)


async def test_a_save_from_a_restored_tree_carries_every_file(tmp_path: Path) -> None:
    store = RecordingStore(as_store(make_store("memory", tmp_path, None)))  # type: ignore[arg-type]
    ckpt = make_checkpointer(store)
    src = tmp_path / "src"
    write_tree(src, {"a": b"a" * 10, "d/b": b"b" * 20})
    first = await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    dest = tmp_path / "dest"
    await ckpt.restore_directory(first.checkpoint_id, *KEY, dest)
    store.log.clear()
    second = await ckpt.save(
        CheckpointData(epoch=2, directories={KEY: dest}, parent_id=first.checkpoint_id)
    )
    assert not [path for op, path in store.log if op.startswith("put") and ".file-" in path]
    assert all(f.owner == first.checkpoint_id for f in second.directories[0].files)


class FailingFilePut(ForwardingStore):
    """Fails the upload of one directory file; every other call goes through."""

    async def put(self, path: str, data: Any, **options: Any) -> ObjectInfo:
        if path.endswith(".file-2"):
            raise TransientStoreError("put", path, "injected")
        return await super().put(path, data, **options)


async def test_a_failed_upload_leaves_no_file_behind(tmp_path: Path) -> None:
    inner = as_store(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    ckpt = make_checkpointer(FailingFilePut(inner), retry=RetryPolicy(attempts=1))
    src = tmp_path / "src"
    write_tree(src, {f"f{i}": bytes([i]) * 10 for i in range(6)})
    with pytest.raises(TransientStoreError):
        await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    left = [info.path for info in await inner.list(ckpt.paths.base_prefix)]
    assert not [path for path in left if ".file-" in path or is_intent_path(path)]
    assert await ckpt.list_checkpoints() == []


async def test_a_save_failing_after_its_uploads_leaves_no_file_behind(tmp_path: Path) -> None:
    ckpt = make_checkpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    src = tmp_path / "src"
    write_tree(src, {"a": b"a", "b": b"b"})

    async def fail() -> None:
        raise RuntimeError("stopped before the commit")

    with pytest.raises(RuntimeError):
        await _save.save(
            await ckpt._context(), CheckpointData(epoch=1, directories={KEY: src}), fail
        )
    assert not [p for p in await stored_paths(ckpt) if ".file-" in p]


def test_cli_verify_reads_every_directory_file_and_names_a_damaged_one(tmp_path: Path) -> None:
    """``cairn verify`` checks the files of directory partitions, carried ones too (which
    ``load`` lists without reading), and a flipped byte fails it naming the file."""
    source, _, first, second = saved_twice(
        tmp_path, {"kept.sst": b"k" * 700, "changed.sst": b"a" * 300}, "changed.sst", b"b" * 301
    )
    store = ["--store", str(source)]
    ok = cairn("verify", "--all", "--json", *store)
    assert ok.code == 0, ok.explain()
    kept = next(f for f in second.directories[0].files if f.relative_path == "kept.sst")
    assert kept.owner == first.checkpoint_id
    stored = source / PREFIX / str(first.checkpoint_id) / kept.path
    original = stored.read_bytes()
    stored.write_bytes(bytes([original[0] ^ 1]) + original[1:])
    damaged = cairn("verify", str(second.checkpoint_id), *store)
    assert damaged.code != 0, damaged.explain()
    assert "kept.sst" in damaged.stdout + damaged.stderr, damaged.explain()


def test_cli_show_summarises_directory_partitions(tmp_path: Path) -> None:
    """``cairn show`` names each directory partition with its files, the carried ones and
    their bytes, in its table and its ``--json``."""
    source, _, _, _ = saved_twice(
        tmp_path, {"a.sst": b"a" * 1000, "b.sst": b"b" * 2000}, "b.sst", b"B" * 2001
    )
    store = ["--store", str(source)]
    table, doc = cairn_many([["show", "latest", *store], ["show", "latest", "--json", *store]])
    assert table.code == 0 and doc.code == 0, table.explain() + doc.explain()
    assert doc.json()["directories"] == [
        {
            "operator": KEY[0],
            "partition": KEY[1],
            "files": 2,
            "carried_files": 1,
            "size_bytes": 3001,
        }
    ]
    assert doc.json()["kind"] == "incremental"
    assert "directory partitions" in table.stdout
    assert "2.9 KiB" in table.stdout or "3.0 KiB" in table.stdout, table.stdout


# -- directory partitions in a save of two phases (cairn.integrations._interface) ------


@pytest.fixture(params=["memory", "local", "s3"])
def tckpt(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStoreCheckpointer:
    """A checkpointer over a fresh store of each backend two-phase saves are tested on."""
    return make_checkpointer(make_store(str(request.param), tmp_path, request))


async def own_files(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> set[str]:
    """The directory-file objects stored under ``cid``'s own directory."""
    listed = await ckpt.store.list(ckpt.paths.checkpoint_dir(cid))
    return {info.path for info in listed if ".file-" in info.path}


async def test_a_two_phase_save_uploads_directories_and_carries_unchanged_files(
    tckpt: ObjectStoreCheckpointer, tmp_path: Path
) -> None:
    src, other = tmp_path / "src", tmp_path / "other"
    write_tree(src, {"kept.sst": b"k" * 500, "changed.sst": b"a" * 300, "CURRENT": b"M-1\n"})
    write_tree(other, {"x/y": b"xy"})
    first_id = CheckpointId.now()
    async with await begin(tckpt, first_id) as save:
        entries = await save.upload([("meta", 0, False, b"m")])
        dirs = await save.upload_directories({KEY: src, ("db", 1): str(other)})
        assert [(d.operator, d.partition_id) for d in dirs] == [KEY, ("db", 1)]
        first = await save.commit(assemble_manifest(first_id, 1, entries, directories=dirs))
    assert first.total_size_bytes == 1 + 500 + 300 + 4 + 2
    assert len(await own_files(tckpt, first_id)) == 4

    (src / "changed.sst").write_bytes(b"b" * 301)
    second_id = CheckpointId.now()
    async with await begin(tckpt, second_id, first_id) as save:
        [directory] = await save.upload_directories({KEY: src})
        owners = {f.relative_path: f.owner for f in directory.files}
        assert owners == {"kept.sst": first_id, "changed.sst": None, "CURRENT": first_id}
        assert len(await own_files(tckpt, second_id)) == 1, "only the changed file is sent"
        manifest = assemble_manifest(second_id, 2, [], parent_id=first_id, directories=[directory])
        second = await save.commit(manifest)
    assert second.total_size_bytes == 500 + 301 + 4
    loaded = await tckpt.load(second_id)
    assert set(loaded.directories) == {KEY}, "the parent's other partition is not carried"
    assert await tckpt.read_latest() == second_id
    for cid, key, tree in ((second_id, KEY, src), (first_id, ("db", 1), other)):
        dest = tmp_path / f"dest-{cid}"
        await tckpt.restore_directory(cid, *key, dest)
        assert read_tree(dest) == read_tree(tree)


async def test_a_two_phase_directory_upload_refuses_bad_input_and_a_failure_ends_it(
    tmp_path: Path,
) -> None:
    inner = as_store(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    ckpt = make_checkpointer(inner)
    src = tmp_path / "src"
    write_tree(src, {"a": b"a", "b": b"b"})
    cid = CheckpointId.now()
    save = await begin(ckpt, cid)
    bad: list[tuple[Any, Any, str]] = [
        ({("db", -1): src}, "mtime", "-1"),
        ({"db": src}, "mtime", "'db'"),
        ({KEY: 3}, "mtime", "must be a path, got int"),
        ([src], "mtime", "must map"),
        ({KEY: src}, "size", "'size'"),
    ]
    for directories, check, named in bad:
        with pytest.raises(InvalidInputError, match=named):
            await save.upload_directories(directories, check=check)
    intents = set(await intents_of(ckpt.store, ckpt.paths, cid))
    assert len(intents) == 1 and await stored_paths(ckpt) == intents, "bad input writes nothing"
    (src / "link").symlink_to(src / "a")
    with pytest.raises(SpecialFileError, match="link"):
        await save.upload_directories({KEY: src})
    assert await stored_paths(ckpt) == set(), "the failure ended the save, its intent too"

    failing = make_checkpointer(FailingFilePut(inner), retry=RetryPolicy(attempts=1))
    (src / "link").unlink()
    write_tree(src, {f"f{i}": bytes([i]) * 10 for i in range(4)})
    async with await begin(failing, CheckpointId.now()) as save:
        with pytest.raises(TransientStoreError):
            await save.upload_directories({KEY: src})
    assert await stored_paths(ckpt) == set(), "no file and no intent left"


async def test_a_two_phase_save_keeps_the_parent_it_carries_from_through_a_gc(
    tmp_path: Path,
) -> None:
    ckpt = make_checkpointer(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    src = tmp_path / "src"
    write_tree(src, {"a": b"a" * 100, "b": b"b" * 100})
    first = await ckpt.save(CheckpointData(epoch=1, directories={KEY: src}))
    (src / "b").write_bytes(b"B" * 101)
    cid = CheckpointId.now()
    async with await begin(ckpt, cid, first.checkpoint_id) as save:
        dirs = await save.upload_directories({KEY: src})
        await ckpt.save(CheckpointData(epoch=2, snapshots={("x", 0): b"x"}))
        await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
        assert first.checkpoint_id in await ckpt.list_checkpoints(), "the lease keeps it"
        parent = first.checkpoint_id
        await save.commit(assemble_manifest(cid, 3, [], parent_id=parent, directories=dirs))
    dest = tmp_path / "dest"
    await ckpt.restore_directory(cid, *KEY, dest)
    assert read_tree(dest) == read_tree(src)


async def test_a_two_phase_directory_upload_refuses_a_fenced_writers_parent(
    tmp_path: Path,
) -> None:
    store = as_store(make_store("memory", tmp_path, None))  # type: ignore[arg-type]
    old, new = make_checkpointer(store), make_checkpointer(store)
    await old.take_over()
    await old.save(CheckpointData(epoch=1, snapshots={("x", 0): b"x"}))
    await new.take_over()
    # A late commit of the fenced generation, past where it ended, as it would land.
    stale = msgspec.structs.replace(
        CheckpointManifest.new(CheckpointId.now(), 9), writer_generation=old.writer_generation
    )
    await new.save_manifest(stale)
    src = tmp_path / "src"
    write_tree(src, {"a": b"a"})
    cid = CheckpointId.now()
    async with await begin(new, cid, stale.checkpoint_id) as save:
        with pytest.raises(InvalidCheckpointDataError, match="fenced writer"):
            await save.upload_directories({KEY: src})
    assert not [p for p in await stored_paths(new) if str(cid) in p], "nothing of it is left"
