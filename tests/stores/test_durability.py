"""A local store's writes are durable when they return, as a PUT to S3 is.

Without fsyncs (obstore's local store makes none), a power cut after a "committed" save
could leave the manifest naming artifacts whose bytes or names never reached the disk.
A power cut cannot be staged in a test, so these record every ``os.fsync`` (which file
or directory each descriptor is, from ``/proc/self/fd``) and check that each put, each
artifact of a save, and a restore fsync what a power cut would otherwise lose, in an
order that keeps the commit protocol: artifacts before the manifest that names them. A
file is fsynced under its staging name (``name#N``), before the rename that gives it its
name: it is recorded under the name it gets.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from cairn import CheckpointData, ObjectStoreCheckpointer
from cairn.errors import NotDurableError, PreconditionFailedError
from cairn.stores import IfMatch, ObstoreStore, open_store
from cairn.stores import _local as _localstore

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/fd to name descriptors"
)


def _named(fd: int) -> str:
    """The real path of ``fd``, a staging file's (``name#N``) as the name it gets."""
    return re.sub(r"#\d+$", "", os.readlink(f"/proc/self/fd/{fd}"))


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The real paths of every descriptor fsynced while the test runs, in order."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(_named(fd))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced


def _store(root: Path) -> ObstoreStore:
    root.mkdir(parents=True, exist_ok=True)
    return ObstoreStore(open_store(str(root)))


def _chain_to(root: Path, path: str) -> list[str]:
    """The file, then each directory from its parent up to ``root``."""
    target = (root / path).resolve()
    chain = [str(target)]
    directory = target.parent
    while True:
        chain.append(str(directory))
        if directory == root.resolve():
            return chain
        directory = directory.parent


def test_a_local_put_fsyncs_the_file_then_every_directory_up_to_the_root(
    tmp_path: Path, fsynced: list[str]
) -> None:
    store = _store(tmp_path / "store")
    asyncio.run(store.put("a/b/c/object", b"payload"))
    assert fsynced == _chain_to(tmp_path / "store", "a/b/c/object")


def test_a_local_put_stream_is_durable_too(tmp_path: Path, fsynced: list[str]) -> None:
    store = _store(tmp_path / "store")

    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(3):
            yield b"x" * 1000

    asyncio.run(store.put_stream("d/streamed", chunks))
    assert fsynced == _chain_to(tmp_path / "store", "d/streamed")


def test_a_local_compare_and_swap_is_durable(tmp_path: Path, fsynced: list[str]) -> None:
    store = _store(tmp_path / "store")

    async def swap() -> None:
        first = await store.put("_latest", b"one")
        assert first.e_tag is not None
        fsynced.clear()
        await store.put("_latest", b"two", mode=IfMatch(first.e_tag))

    asyncio.run(swap())
    assert fsynced[:2] == _chain_to(tmp_path / "store", "_latest")


def test_a_save_fsyncs_every_artifact_before_the_manifest_that_names_them(
    tmp_path: Path, fsynced: list[str]
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = ObjectStoreCheckpointer(str(root))
    data = CheckpointData(epoch=1, snapshots={("op", 0): b"a" * 100, ("op", 1): b"b"})
    manifest = asyncio.run(ckpt.save(data))
    base = root / ckpt.paths.base_prefix  # the store's root, the default
    directory = base / str(manifest.checkpoint_id)
    artifacts = [str((directory / e.path).resolve()) for _, e in manifest.partition_entries()]
    manifest_file = str((directory / "manifest.json").resolve())
    assert len(artifacts) == 2
    for path in [*artifacts, manifest_file]:
        assert path in fsynced, f"{path} was never fsynced"
    manifest_at = fsynced.index(manifest_file)
    assert all(fsynced.index(path) < manifest_at for path in artifacts)
    # Each artifact's directory, and the new checkpoint's directories, were fsynced after
    # the artifact itself: the names are durable, not only the bytes.
    for path in artifacts:
        parent = str(Path(path).parent)
        assert parent in fsynced[fsynced.index(path) :]
    assert str(base.resolve()) in fsynced


def test_a_restored_file_is_fsynced_and_so_is_its_directory(
    tmp_path: Path, fsynced: list[str]
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    ckpt = ObjectStoreCheckpointer(str(root))
    manifest = asyncio.run(ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"abc"})))
    target_dir = tmp_path / "out"
    target_dir.mkdir()
    target = target_dir / "restored"
    fsynced.clear()
    ((_, entry),) = manifest.partition_entries()
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    asyncio.run(ckpt.load_artifact_to(path, target, expected_sha256=entry.sha256))
    assert target.read_bytes() == b"abc"
    assert fsynced[-1] == str(target_dir.resolve())


def test_many_concurrent_local_swaps_finish(tmp_path: Path) -> None:
    """More compare-and-swap waiters than the loop has worker threads: all finish.

    A waiter that blocked in ``flock`` on a worker thread would, with every worker taken
    by waiters, leave the lock holder no thread to fsync its put, and all of them hang.
    """
    store = _store(tmp_path / "store")
    waiters = 4 * (min(32, (os.cpu_count() or 1) + 4))

    async def swap_until_done(first_e_tag: str | None) -> bool:
        e_tag = first_e_tag
        while True:
            assert e_tag is not None
            try:
                await store.put("_latest", b"mine", mode=IfMatch(e_tag))
                return True
            except PreconditionFailedError:
                e_tag = (await store.head("_latest")).e_tag

    async def race() -> list[bool]:
        first = await store.put("_latest", b"start")
        swaps = [swap_until_done(first.e_tag) for _ in range(waiters)]
        return await asyncio.wait_for(asyncio.gather(*swaps), timeout=60)

    assert asyncio.run(race()) == [True] * waiters


def test_a_cancelled_local_swap_does_not_keep_the_lock(tmp_path: Path) -> None:
    """A swap cancelled while another process holds the lock never takes it later."""
    store = _store(tmp_path / "store")

    async def scenario() -> None:
        first = await store.put("_latest", b"start")
        assert first.e_tag is not None
        # The lock is on the directory that holds the object, here the store's root.
        holder = os.open(tmp_path / "store", os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(holder, fcntl.LOCK_EX)  # as another process holding the lock would
        waiting = asyncio.ensure_future(store.put("_latest", b"x", mode=IfMatch(first.e_tag)))
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        os.close(holder)  # releases it
        await asyncio.sleep(0.2)
        # The lock is free again: a new swap takes it at once.
        await asyncio.wait_for(store.put("_latest", b"y", mode=IfMatch(first.e_tag)), 10)

    asyncio.run(scenario())
    assert (tmp_path / "store" / "_latest").read_bytes() == b"y"


def _failing_fsync_of(monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    """Make ``os.fsync`` fail with EIO, as a dying disk does, for files ending in ``suffix``."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if _named(fd).endswith(suffix):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_put_whose_fsync_fails_raises_not_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path / "store")
    _failing_fsync_of(monkeypatch, "/object")
    with pytest.raises(NotDurableError) as caught:
        asyncio.run(store.put("dir/object", b"payload"))
    assert caught.value.path == "dir/object"
    assert "not made durable" in str(caught.value)


@pytest.mark.parametrize("failing", ["/manifest.json", ".snap"])
def test_a_save_that_cannot_be_made_durable_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A manifest (or artifact) whose fsync fails: the save fails and nothing stands as
    committed, although the manifest's bytes landed (they are not counted as committed
    as "our own bytes at the manifest path")."""
    root = tmp_path / "store"
    root.mkdir()
    ckpt = ObjectStoreCheckpointer(str(root))
    first = asyncio.run(ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"one"})))
    _failing_fsync_of(monkeypatch, failing)
    with pytest.raises(NotDurableError):
        asyncio.run(ckpt.save(CheckpointData(epoch=2, snapshots={("op", 0): b"two"})))
    monkeypatch.undo()
    listed = asyncio.run(ckpt.list_checkpoints())
    assert listed == [first.checkpoint_id]
    assert len(list(root.rglob("manifest.json"))) == 1
    loaded = asyncio.run(ckpt.load_latest())
    assert loaded is not None
    assert loaded.manifest.checkpoint_id == first.checkpoint_id


def test_a_local_put_fsyncs_the_bytes_before_its_name_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut between the rename and the file's fsync could leave a name holding
    bytes never written: the old ``_latest`` (or ``_writer``) lost, not the new one kept.
    So the staging file is fsynced first; the name changes only after that."""
    store = _store(tmp_path / "store")
    pointer = tmp_path / "store" / "_latest"
    asyncio.run(store.put("_latest", b"old"))
    at_name: list[bytes] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if _named(fd) == str(pointer.resolve()):
            at_name.append(pointer.read_bytes())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    asyncio.run(store.put("_latest", b"new"))
    assert at_name == [b"old"], "the name held the new bytes before they were fsynced"
    assert pointer.read_bytes() == b"new"


def _chunks(count: int, size: int) -> Callable[[], AsyncIterator[bytes]]:
    async def chunks() -> AsyncIterator[bytes]:
        for index in range(count):
            yield bytes([index]) * size

    return chunks


def test_a_streamed_put_flushes_what_it_wrote_while_the_rest_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsynced: list[str]
) -> None:
    monkeypatch.setattr(_localstore, "WRITEBACK_BYTES", 3000)
    flushed: list[str] = []
    started = threading.Event()
    real_fdatasync = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        flushed.append(_named(fd))
        started.set()
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)

    async def chunks() -> AsyncIterator[bytes]:
        for index in range(9):
            yield bytes([index]) * 1000
        # The last chunk waits for a flush: one must have begun while the stream runs.
        assert await asyncio.to_thread(started.wait, 10), "no flush before the stream ended"
        yield bytes([9]) * 1000

    store = _store(tmp_path / "store")
    asyncio.run(store.put_stream("dir/object", chunks))
    target = str((tmp_path / "store" / "dir" / "object").resolve())
    assert (tmp_path / "store" / "dir" / "object").read_bytes() == b"".join(
        bytes([i]) * 1000 for i in range(10)
    )
    assert flushed and all(name == target for name in flushed)
    assert fsynced[0] == target  # and the final fsync, as for every put


def test_a_streamed_put_whose_early_flush_fails_is_not_durable_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_localstore, "WRITEBACK_BYTES", 3000)

    def failing_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    store = _store(tmp_path / "store")
    with pytest.raises(NotDurableError) as caught:
        asyncio.run(store.put_stream("dir/object", _chunks(10, 1000)))
    assert caught.value.path == "dir/object" and "not made durable" in str(caught.value)
    assert [p.name for p in (tmp_path / "store").rglob("*") if p.is_file()] == []
