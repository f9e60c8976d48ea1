"""The local file primitives (cairn.stores._localfs) and how a local directory becomes a store.

One walker, one atomic write and one staged tree serve the local store, the restore of
an artifact or a directory partition to a path, ``cairn restore`` and DCP's directories
(through :mod:`cairn.stores.localfiles`): these pin what each promises on its own, with
links planted where a walk, a read or a write would meet them.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from obstore.store import LocalStore as ObstoreLocalStore
from obstore.store import MemoryStore, S3Store

from cairn import InvalidInputError, ObjectStoreCheckpointer
from cairn.stores import ObstoreStore, StoreCapabilities, as_store, capabilities_of, open_store
from cairn.stores import _localfs as localfs
from cairn.stores._local import LocalStore
from cairn.stores._localfs import AtomicFile, LinkRefused, atomic_file_at, open_dirs
from cairn.stores.localfiles import LocalDirectory, StagedTree, file_state


def _staging(name: str) -> str:
    return f"{name}#1"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/a/b (real directories), root/link -> outside, root/a/file (a file)."""
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "file").write_bytes(b"f")
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (root / "link").symlink_to(outside, target_is_directory=True)
    return root


def test_a_walk_reaches_real_directories_and_stops_at_a_link_naming_it(tree: Path) -> None:
    with open_dirs(tree, ["a", "b"]) as dirs:
        assert dirs.complete and len(dirs.fds) == 3 and dirs.link is None
    with open_dirs(tree, ["link", "b"]) as dirs:
        assert not dirs.complete and dirs.link == 1 and len(dirs.fds) == 1
    with open_dirs(tree, ["a", "missing", "x"]) as dirs:
        assert not dirs.complete and dirs.link is None and len(dirs.fds) == 2
    with open_dirs(tree, ["a", "file"]) as dirs:
        assert not dirs.complete and dirs.link is None
    with open_dirs(tree / "no-root", ["a"]) as dirs:
        assert dirs.fds == [] and not dirs.complete


def test_a_walk_that_creates_makes_directories_and_refuses_links_and_files(tree: Path) -> None:
    with open_dirs(tree, ["a", "new", "deeper"], create=True) as dirs:
        assert dirs.complete
    assert (tree / "a" / "new" / "deeper").is_dir()
    with pytest.raises(LinkRefused) as refused, open_dirs(tree, ["link", "b"], create=True):
        pass
    assert refused.value.depth == 1
    with pytest.raises(NotADirectoryError), open_dirs(tree, ["a", "file", "x"], create=True):
        pass
    assert not (tree.parent / "outside" / "b" / "x").exists()


def test_an_atomic_file_appears_whole_or_not_at_all(tree: Path) -> None:
    with atomic_file_at(tree, ["a", "b", "obj"], _staging) as (file, dirs):
        file.write(b"half")
        assert not (tree / "a" / "b" / "obj").exists()
        assert (tree / "a" / "b" / "obj#1").read_bytes() == b"half"
        file.write(b" and half")
        file.commit(dirs.fds)
    assert (tree / "a" / "b" / "obj").read_bytes() == b"half and half"
    assert os.listdir(tree / "a" / "b") == ["obj"]

    def fail_midway() -> None:
        with atomic_file_at(tree, ["a", "b", "obj"], _staging) as (file, _):
            file.write(b"never named")
            raise RuntimeError("the write failed")

    with pytest.raises(RuntimeError):
        fail_midway()
    assert (tree / "a" / "b" / "obj").read_bytes() == b"half and half"
    assert os.listdir(tree / "a" / "b") == ["obj"], "the staging file is removed"


def test_an_exclusive_commit_never_replaces(tree: Path) -> None:
    def create_only() -> None:
        with atomic_file_at(tree, ["a", "file"], _staging) as (file, dirs):
            file.write(b"other")
            file.commit(dirs.fds, exclusive=True)

    with pytest.raises(FileExistsError):
        create_only()
    assert (tree / "a" / "file").read_bytes() == b"f"
    assert sorted(os.listdir(tree / "a")) == ["b", "file"], "the staging file is removed"


def test_an_atomic_file_refuses_a_link_at_its_name_and_on_its_way(tree: Path) -> None:
    (tree / "a" / "name-link").symlink_to(tree.parent / "outside" / "created")
    dir_fd = os.open(tree / "a", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(LinkRefused) as at_name:
            AtomicFile(dir_fd, "name-link", _staging, 2)
    finally:
        os.close(dir_fd)
    assert at_name.value.depth == 2
    with (
        pytest.raises(LinkRefused) as on_the_way,
        atomic_file_at(tree, ["link", "b", "x"], _staging),
    ):
        pass
    assert on_the_way.value.depth == 1
    assert not (tree.parent / "outside" / "created").exists()
    assert os.listdir(tree.parent / "outside" / "b") == []


def test_every_way_of_naming_a_local_directory_gives_cairns_local_store(tmp_path: Path) -> None:
    for store in (
        ObstoreStore(ObstoreLocalStore(tmp_path)),
        as_store(ObstoreLocalStore(tmp_path)),
        as_store(str(tmp_path)),
        as_store(tmp_path.as_uri()),
        ObjectStoreCheckpointer(str(tmp_path)).store,
    ):
        while not isinstance(store, LocalStore):
            store = store.inner  # type: ignore[attr-defined]
        assert capabilities_of(store) == StoreCapabilities(local_path=tmp_path)
    # open_store still gives obstore's store, as documented; the adapter adapts the rest.
    assert isinstance(open_store(tmp_path.as_uri()), ObstoreLocalStore)
    assert type(ObstoreStore(MemoryStore())) is ObstoreStore
    assert repr(LocalStore(tmp_path)) == f"LocalStore({str(tmp_path)!r})"


def test_both_kinds_of_store_pickle(tmp_path: Path) -> None:
    # dcp.async_save in process mode pickles the writer, and the store in it.
    local = pickle.loads(pickle.dumps(ObstoreStore(ObstoreLocalStore(tmp_path))))
    assert isinstance(local, LocalStore) and local.root == tmp_path
    s3 = pickle.loads(pickle.dumps(ObstoreStore(S3Store("bucket", region="us-east-1"))))
    assert type(s3) is ObstoreStore and isinstance(s3.obstore, S3Store)


def test_a_walk_opens_a_directory_another_writer_made_after_it_looked(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two puts make the same new folders: one finds a name missing, the other makes it
    # before the first gets to make it. That is a directory to open, not a file in the way.
    real = localfs.open_dir
    made: list[str] = []

    def racing(dir_fd: int, name: str) -> int | None:
        if name not in made:
            made.append(name)
            os.mkdir(name, dir_fd=dir_fd)  # the other writer, just after this one looked
            return None
        return real(dir_fd, name)

    monkeypatch.setattr(localfs, "open_dir", racing)
    with open_dirs(tree, ["new", "deeper"], create=True) as dirs:
        assert dirs.complete
    assert made == ["new", "deeper"] and (tree / "new" / "deeper").is_dir()


def test_a_staged_tree_appears_whole_at_a_missing_or_empty_destination(tmp_path: Path) -> None:
    for dest in (tmp_path / "new" / "dest", tmp_path / "empty"):
        if dest.name == "empty":
            dest.mkdir()
        with StagedTree(dest, "stage") as tree:
            with tree.create("a/b/file") as handle:
                handle.write(b"bytes")
            assert not dest.exists() or os.listdir(dest) == []
            with tree.open("a/b/file") as staged:
                assert staged.read() == b"bytes" and tree.names() == ["a"]
            tree.publish()
        assert (dest / "a" / "b" / "file").read_bytes() == b"bytes"
        assert [p.name for p in dest.parent.iterdir() if p.name.startswith(".")] == []


def test_a_staged_tree_left_unpublished_leaves_nothing(tmp_path: Path) -> None:
    with StagedTree(tmp_path / "dest", "stage") as tree, tree.create("file") as handle:
        handle.write(b"never published")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("link", "it is a symbolic link, which is never followed"),
        ("dangling", "it is a symbolic link, which is never followed"),
        ("file", "it is a file, not a directory"),
        (
            "full",
            "it is a directory that is not empty ('x' is in it): a whole directory is "
            "written, never mixed with other files",
        ),
    ],
)
def test_a_staged_tree_refuses_every_other_destination(
    tmp_path: Path, kind: str, reason: str
) -> None:
    dest, empty = tmp_path / "dest", tmp_path / "empty"
    empty.mkdir()
    if kind == "link":
        dest.symlink_to(empty, target_is_directory=True)
    elif kind == "dangling":
        dest.symlink_to(tmp_path / "missing")
    elif kind == "file":
        dest.write_bytes(b"f")
    else:
        dest.mkdir()
        (dest / "x").write_bytes(b"x")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(InvalidInputError) as refused:
        StagedTree(dest, "stage")
    assert str(refused.value) == (
        f"cannot stage into {str(dest)!r}: {reason}; give a missing or empty directory"
    )
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(empty) == []
    assert not (tmp_path / "missing").exists()


def test_a_link_planted_in_a_staged_tree_is_never_written_through(tree: Path) -> None:
    outside = tree.parent / "outside"
    with StagedTree(tree.parent / "dest", "stage") as staged:
        (staged.path / "sub").symlink_to(outside, target_is_directory=True)
        with pytest.raises(LinkRefused):
            staged.create("sub/file")
        (staged.path / "name").symlink_to(outside / "created")
        with pytest.raises(FileExistsError):
            staged.create("name")
        with pytest.raises(InvalidInputError, match="is a symbolic link, never followed"):
            staged.open("sub/b")
    assert sorted(os.listdir(outside)) == ["b"] and os.listdir(outside / "b") == []


def test_a_local_directory_reads_plain_files_only(tree: Path) -> None:
    directory = LocalDirectory(tree)
    assert directory.names() == ["a", "link"]
    with directory.open("a/file") as plain:
        assert plain.read() == b"f"
    (tree / "a" / "file-link").symlink_to(tree / "a" / "file")
    for relative, link in (("a/file-link", "a/file-link"), ("link/b", "link")):
        with pytest.raises(InvalidInputError, match=f"{tree / link}.* symbolic link"):
            directory.open(relative)
    with pytest.raises(InvalidInputError, match="not a plain file"):
        directory.open("a/b")
    with pytest.raises(FileNotFoundError):
        directory.open("a/missing")
    assert file_state(tree / "a" / "file-link", b"f") == "other"
    assert file_state(tree / "a" / "file", b"f") == "same"
    assert file_state(tree / "a" / "file", b"g") == "different"
    assert file_state(tree / "a" / "file" / "x", b"f") == "other"
    assert file_state(tree / "a" / "missing", b"f") == "absent"


def test_a_staged_tree_closed_under_a_late_worker_refuses_it(tmp_path: Path) -> None:
    # A worker thread that outlived a cancelled export must not reach a descriptor
    # closed (and maybe reused for another directory) under it.
    tree = StagedTree(tmp_path / "dest", "stage")
    tree.close()
    for call in (lambda: tree.create("late"), lambda: tree.open("late"), tree.publish):
        with pytest.raises(ValueError, match="is closed"):
            call()
    assert os.listdir(tmp_path) == []
