"""What writes killed mid-way leave in a local store, and its removal.

A write stages its bytes in ``{name}#{n}`` and renames the file onto its name; a kill
leaves the staging file, which no listing shows. :func:`remove_staging_files` removes
those below a prefix, and nothing else: objects stay, links are neither followed nor
removed, and the folders it empties go, up to the root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from obstore.store import MemoryStore

from cairn import InvalidInputError
from cairn.stores import as_store, remove_staging_files


def files_below(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


async def test_staging_files_below_a_prefix_are_removed_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = as_store(str(root))
    await store.put("ck/a.snap", b"an object")
    await store.put("ck/deep/b.snap", b"another")
    await store.put("other/c.snap", b"outside the prefix")
    for name in ["ck/a.snap#1", "ck/deep/b.snap#22", "ck/only/x#333", "other/c.snap#4"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"half a write")
    (root / "ck/not#staging").write_bytes(b"a name with '#' but no digits after it")
    listed = ["ck/a.snap", "ck/deep/b.snap", "ck/not#staging"]
    assert sorted(info.path for info in await store.list("ck/")) == listed

    removed = await remove_staging_files(store, "ck/")

    assert sorted(removed) == ["ck/a.snap#1", "ck/deep/b.snap#22", "ck/only/x#333"]
    assert files_below(root) == [
        "ck/a.snap",
        "ck/deep/b.snap",
        "ck/not#staging",
        "other/c.snap",
        "other/c.snap#4",
    ]
    assert not (root / "ck/only").exists(), "the folder it emptied went"
    assert bytes((await store.get("ck/deep/b.snap")).data) == b"another"
    assert await remove_staging_files(store, "ck/") == []


async def test_a_prefix_of_staging_files_alone_goes_whole_up_to_the_root(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = as_store(str(root))
    await store.put("keep.txt", b"x")
    (root / "a/b").mkdir(parents=True)
    (root / "a/b/intent.json#9").write_bytes(b"cut")
    assert await remove_staging_files(store, "a/b/") == ["a/b/intent.json#9"]
    assert sorted(os.listdir(root)) == ["keep.txt"]


async def test_links_are_neither_followed_nor_removed(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs#1").write_bytes(b"not the store's")
    store = as_store(str(root))
    await store.put("ck/a.snap", b"an object")
    (root / "ck/dir-link").symlink_to(outside, target_is_directory=True)
    (root / "ck/file-link#5").symlink_to(outside / "theirs#1")
    (root / "linked").symlink_to(root / "ck", target_is_directory=True)

    assert await remove_staging_files(store, "ck/") == []
    assert await remove_staging_files(store, "linked/") == []

    assert (outside / "theirs#1").read_bytes() == b"not the store's"
    assert (root / "ck/dir-link").is_symlink() and (root / "ck/file-link#5").is_symlink()


async def test_a_missing_prefix_and_a_store_not_on_disk_remove_nothing(tmp_path: Path) -> None:
    assert await remove_staging_files(as_store(str(tmp_path / "store")), "missing/") == []
    memory = as_store(MemoryStore())
    await memory.put("ck/a.snap#1", b"an object of that name")
    assert await remove_staging_files(memory, "ck/") == []
    assert bytes((await memory.get("ck/a.snap#1")).data) == b"an object of that name"


async def test_the_root_is_refused_and_nothing_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = as_store(str(root))
    (root / "ck").mkdir(parents=True)
    (root / "ck/intent.json#1").write_bytes(b"a write in progress")
    for prefix in ("", "/"):
        with pytest.raises(InvalidInputError, match=f"below the root, got {prefix!r}"):
            await remove_staging_files(store, prefix)
    assert files_below(root) == ["ck/intent.json#1"]
