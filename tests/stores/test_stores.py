"""open_store, error translation, capabilities, the forwarding base of wrappers, and the
local compare-and-swap between processes. The rules every store keeps are the store
contract's (tests/stores/test_store_contract.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import errno
import fcntl
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, GenericError, PreconditionError
from obstore.store import GCSStore, HTTPStore, LocalStore, MemoryStore
from support.faults import FaultPlan, FaultyStore, PutFault
from support.servers import gcs_store_options

from cairn import (
    CheckpointData,
    InvalidStoreUrlError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreCheckpointer,
    PreconditionFailedError,
    StoreCredentialsError,
    StoreError,
    TransientStoreError,
    open_store,
)
from cairn.format._buffer import Buffer
from cairn.stores import (
    Blob,
    ForwardingStore,
    IfMatch,
    ListDirResult,
    ObjectInfo,
    ObstoreStore,
    PutMode,
    Store,
    StoreCapabilities,
    StoreMethod,
    as_store,
    capabilities_of,
    explain_store_error,
    translate_error,
)
from cairn.stores import _local as _localstore
from cairn.stores import _localfs as localfs
from cairn.stores._local import LOCAL_PUT_ATTEMPTS
from cairn.stores._local import LocalStore as LocalDirectoryStore
from cairn.stores.retry import RetryingStore, RetryPolicy

T = TypeVar("T")


def test_memory_and_file_urls(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    target = tmp_path / "made" / "by open_store"
    store = open_store(target.as_uri())
    assert isinstance(store, LocalStore) and target.is_dir()
    obstore.put(store, "a", b"1")
    assert (target / "a").read_bytes() == b"1"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("ftp://host/x", "unknown scheme"),
        ("nonsense:x", "unknown scheme"),
        ("file://relative/dir", "not host"),
        ("file:", "absolute path"),
        ("s3://", "missing bucket"),
        ("s3:/x", "malformed URL: s3: must be followed by //"),
        ("memory://x", "no path"),
        ("", "empty"),
    ],
)
def test_bad_urls_raise_naming_the_url(url: str, match: str) -> None:
    with pytest.raises(InvalidStoreUrlError, match=match) as info:
        open_store(url)
    assert info.value.url == url and repr(url) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_option_is_a_bad_url(tmp_path: Path) -> None:
    with pytest.raises(InvalidStoreUrlError, match="unknown option"):
        open_store(tmp_path.as_uri(), region="eu")
    with pytest.raises(InvalidStoreUrlError, match="s3://bucket"):
        open_store("s3://bucket/prefix", not_an_option=1)


def test_remote_urls_open_without_io() -> None:
    store = open_store("s3://bucket/prefix", region="us-east-1", skip_signature=True)
    assert type(store).__name__ == "S3Store"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (FileNotFoundError("x"), ObjectNotFoundError),
        (AlreadyExistsError("exists"), ObjectExistsError),
        (PreconditionError("etag"), PreconditionFailedError),
        # obstore 0.12's text: Display, then the Debug form that classification reads.
        (
            GenericError(
                "Generic S3 error: Error performing GET http://h/b/x in 1ms - HTTP error: "
                'error sending request\n\nDebug source:\nGeneric {\n    store: "S3",\n'
                "    source: RetryError(\n        RetryErrorImpl {\n            inner: Http(\n"
                "                HttpError {\n                    kind: Interrupted,\n"
                "                    source: reqwest::Error {\n"
                "                        kind: Request,\n                    },\n"
                "                },\n            ),\n        },\n    ),\n}"
            ),
            TransientStoreError,
        ),
        (
            GenericError(
                "Generic S3 error: Error performing GET http://h/b/x in 1ms - Server returned "
                "non-2xx status code: 503 Service Unavailable: \n\nDebug source:\nGeneric {\n"
                '    store: "S3",\n    source: RetryError(\n        RetryErrorImpl {\n'
                "            inner: Status {\n                status: 503,\n"
                "                body: None,\n            },\n        },\n    ),\n}"
            ),
            TransientStoreError,
        ),
        (
            GenericError(
                "Generic S3 error: Error performing GET http://h/b/x in 1ms - Server returned "
                "non-2xx status code: 400 Bad Request: connection closed\n\nDebug source:\n"
                'Generic {\n    store: "S3",\n    source: RetryError(\n'
                "        RetryErrorImpl {\n            inner: Status {\n"
                "                status: 400,\n                body: Some(\n"
                '                    "connection closed",\n                ),\n'
                "            },\n        },\n    ),\n}"
            ),
            StoreError,
        ),
        (GenericError("Generic S3 error: Client error with status 403 Forbidden"), StoreError),
        (TimeoutError(), TransientStoreError),
        (NotImplementedError("no"), StoreError),
    ],
)
def test_error_translation(exc: BaseException, expected: type[Exception]) -> None:
    translated = translate_error("get", "some/path", exc)
    assert type(translated) is expected
    assert "some/path" in str(translated)


def _cas_increment(root: str, rounds: int) -> None:
    async def run() -> None:
        store = ObstoreStore(LocalStore(root))
        for _ in range(rounds):
            while True:
                blob = await store.get("counter")
                value = int(bytes(blob.data))
                try:
                    await store.put(
                        "counter", str(value + 1).encode(), mode=IfMatch(blob.info.e_tag or "")
                    )
                    break
                except PreconditionFailedError:
                    continue

    asyncio.run(run())


def test_local_compare_and_swap_holds_between_processes(tmp_path: Path) -> None:
    obstore.put(LocalStore(tmp_path), "counter", b"0")
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_cas_increment, args=(str(tmp_path), 40)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
        assert w.exitcode == 0
    assert (tmp_path / "counter").read_bytes() == b"160", "no increment was lost"


def test_file_url_without_mkdir_needs_the_directory(tmp_path: Path) -> None:
    missing = tmp_path / "not-there"
    with pytest.raises(InvalidStoreUrlError, match="not-there"):
        open_store(missing.as_uri(), mkdir=False)
    assert not missing.exists()


async def test_deleting_a_local_checkpoint_removes_staging_leftovers(tmp_path: Path) -> None:
    from cairn import CheckpointData, ObjectStoreCheckpointer

    ckpt = ObjectStoreCheckpointer(LocalStore(tmp_path))
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"x"}))
    folder = tmp_path / ckpt.paths.checkpoint_dir(manifest.checkpoint_id)
    # What a write killed mid-way leaves: a staging file no listing shows.
    (folder / "operators" / "op" / "partition-1.snap#1").write_bytes(b"half")
    assert "partition-1" not in str(await ckpt.store.list(""))
    await ckpt.delete_checkpoint(manifest.checkpoint_id)
    assert not folder.exists()
    assert await ckpt.list_checkpoints() == []


# -- a local directory keeps no lock files and no empty folders -----------------------------


def _local(root: Path) -> LocalDirectoryStore:
    root.mkdir(parents=True, exist_ok=True)
    return LocalDirectoryStore(root)


def _lock_directory(path: Path) -> int:
    """Hold an exclusive ``flock`` on directory ``path``, as another process's swap would."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_a_local_compare_and_swap_locks_the_objects_directory(tmp_path: Path) -> None:
    store = _local(tmp_path / "store")
    first = await store.put("dir/pointer", b"1")
    assert first.e_tag is not None
    holder = _lock_directory(tmp_path / "store" / "dir")
    swap = asyncio.ensure_future(store.put("dir/pointer", b"2", mode=IfMatch(first.e_tag)))
    await asyncio.sleep(0.2)
    assert not swap.done(), "the swap waits while another holds the directory's lock"
    os.close(holder)
    await asyncio.wait_for(swap, 10)
    assert os.listdir(tmp_path / "store" / "dir") == ["pointer"]  # no lock file
    assert (tmp_path / "store" / "dir" / "pointer").read_bytes() == b"2"


async def test_a_swap_whose_directory_was_made_again_locks_the_new_one(tmp_path: Path) -> None:
    # A swap that waited for the lock of a directory removed meanwhile (its object deleted,
    # the directory emptied and removed, then made again by a new put) holds a lock nobody
    # else takes: it must lock the directory there now, or two swaps would run at once.
    root = tmp_path / "store"
    store = _local(root)
    first = await store.put("dir/pointer", b"old")
    assert first.e_tag is not None
    old_directory = _lock_directory(root / "dir")
    swap = asyncio.ensure_future(store.put("dir/pointer", b"swapped", mode=IfMatch(first.e_tag)))
    await asyncio.sleep(0.1)  # the swap waits for the old directory's lock
    await store.delete_prefix("dir/")
    assert not (root / "dir").exists()
    await store.put("dir/pointer", b"made again")
    new_directory = _lock_directory(root / "dir")  # another swap, in the new directory
    os.close(old_directory)
    await asyncio.sleep(0.3)
    assert not swap.done(), "the swap went on while another held the new directory's lock"
    os.close(new_directory)
    with pytest.raises(PreconditionFailedError, match="e-tag is"):
        await asyncio.wait_for(swap, 10)
    assert (root / "dir" / "pointer").read_bytes() == b"made again"


async def test_a_lock_file_left_by_earlier_versions_breaks_nothing(tmp_path: Path) -> None:
    # Earlier versions locked a ``.{name}.lock`` sidecar next to ``_latest`` and kept it.
    # It is a file like any other: listed by the store, outside every checkpoint
    # directory (so no checkpoint, GC or verification counts it), never opened again.
    from cairn import CheckpointData, ObjectStoreCheckpointer, RetentionPolicy

    root = tmp_path / "store"
    ckpt = ObjectStoreCheckpointer(_local(root))
    await ckpt.save(CheckpointData(epoch=0, snapshots={("op", 0): b"x"}))
    leftover = root / ckpt.paths.base_prefix / "._latest.lock"
    leftover.write_bytes(b"")
    held = os.open(leftover, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # even one an old process still holds
    try:
        saved = [
            (await ckpt.save(CheckpointData(epoch=e, snapshots={("op", 0): b"y"}))).checkpoint_id
            for e in (1, 2, 3)
        ]
    finally:
        os.close(held)
    assert await ckpt.read_latest() == saved[-1]
    assert (await ckpt.load_latest()) is not None
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert len(result.deleted) == 3 and result.orphans_deleted == []
    assert await ckpt.list_checkpoints() == [saved[-1]]
    assert leftover.is_file()


async def test_a_local_delete_prefix_removes_the_folders_it_empties(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = _local(root)
    await store.put("a/b/c/one", b"1")
    await store.put("a/b/c/d/two", b"2")
    await store.put("a/kept", b"3")
    await store.delete_prefix("a/b/")
    assert sorted(os.listdir(root / "a")) == ["kept"]
    await store.delete(["a/kept"])
    assert os.listdir(root) == [], "emptied folders go, the root stays"
    await store.put("x/y/z", b"4")
    (root / "x" / "y" / "w").mkdir()  # not empty: what holds it stays, and above it
    await store.delete(["x/y/z"])
    assert (root / "x" / "y" / "w").is_dir()


def _staging_tries(monkeypatch: pytest.MonkeyPatch, before: Callable[[int], None]) -> None:
    """Call ``before(n)`` before the ``n``-th try (from 1) of a local put to stage its file."""
    real = localfs.atomic_file_at
    tries = 0

    def staging(*args: Any, **kwargs: Any) -> Any:
        nonlocal tries
        tries += 1
        before(tries)
        return real(*args, **kwargs)

    monkeypatch.setattr(_localstore, "atomic_file_at", staging)


class _RemovingRacer:
    """A thread that keeps removing the (empty) folders of an object's path, deepest first,
    as a concurrent delete that empties them does, until the put notices (its next try
    to stage its file stops the racer, so that try meets no racer)."""

    def __init__(self, root: Path, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
        parts = path.split("/")[:-1]
        self.folders = [os.path.join(root, *parts[:depth]) for depth in range(len(parts), 0, -1)]
        self.stop = threading.Event()
        self.noticed = 0

        def noticing(tries: int) -> None:
            if tries > 1:
                self.noticed += 1
                self.halt()

        _staging_tries(monkeypatch, noticing)
        self.thread = threading.Thread(target=self._remove, daemon=True)
        self.thread.start()

    def _remove(self) -> None:
        while not self.stop.is_set():
            for folder in self.folders:
                with contextlib.suppress(OSError):
                    os.rmdir(folder)

    def halt(self) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("how", ["put", "put_stream"])
async def test_a_local_put_survives_a_delete_removing_its_new_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # A put makes an object's folders one level after another, then its staging file: a
    # concurrent delete that removes a folder just made (it is still empty) makes the
    # next step fail with "No such file or directory". Whether a racing thread hits that
    # window is up to the scheduler: put until some puts lost the race, within a bound.
    # The retry itself is checked deterministically below
    # (test_a_local_put_whose_folder_vanished_...).
    root = tmp_path / "store"
    store = _local(root)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: the racer runs more often
    noticed = puts = 0
    deadline = time.monotonic() + 20
    try:
        while noticed < 3 and (puts < 20 or time.monotonic() < deadline):
            path = f"run-{puts}/operators/op/partition-0.snap"
            puts += 1
            racer = _RemovingRacer(root, path, monkeypatch)
            try:
                if how == "put":
                    await store.put(path, b"state")
                else:
                    await store.put_stream(path, lambda: _chunks([b"sta", b"te"]))
            finally:
                racer.halt()
            noticed += racer.noticed
            assert (root / path).read_bytes() == b"state"
    finally:
        sys.setswitchinterval(interval)
    if not noticed:
        pytest.skip(f"none of {puts} puts lost the race to the racing thread here")


async def _chunks(parts: Sequence[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _vanishing_folders(
    monkeypatch: pytest.MonkeyPatch, root: Path, path: str, failures: int
) -> list[int]:
    """Make the next ``failures`` tries of a put of ``path`` lose the race as a real one
    does: the put made the object's folders, a concurrent delete removed them before the
    put's staging file was in the last one, and its next step found no folder. The tries
    are returned as they happen."""
    folder = root.joinpath(*path.split("/")[:-1])
    tries: list[int] = []

    def race(n: int) -> None:
        tries.append(n)
        if n > failures:
            return
        folder.mkdir(parents=True, exist_ok=True)
        for gone in (folder, *folder.parents):
            if gone == root:
                break
            gone.rmdir()
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(folder))

    _staging_tries(monkeypatch, race)
    return tries


@pytest.mark.parametrize("mode", ["overwrite", "create"])
async def test_a_local_put_whose_folder_vanished_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: PutMode
) -> None:
    root = tmp_path / "store"
    store = _local(root)
    tries = _vanishing_folders(monkeypatch, root, "a/b/object", failures=2)
    await store.put("a/b/object", b"written", mode=mode)
    assert tries == [1, 2, 3]
    assert (root / "a" / "b" / "object").read_bytes() == b"written"
    assert os.listdir(root / "a" / "b") == ["object"], "no staging file left"


async def test_a_local_put_tries_again_only_while_its_folder_vanishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    store = _local(root)
    tries = _vanishing_folders(monkeypatch, root, "c/object", failures=10**6)
    with pytest.raises(StoreError, match="kept vanishing") as info:
        await store.put("c/object", b"written")
    assert type(info.value) is StoreError, "a put that cannot make its folder is no not-found"
    assert tries == list(range(1, LOCAL_PUT_ATTEMPTS + 1))

    monkeypatch.undo()
    (root / "d").write_bytes(b"a file where a folder would go")
    tries = _vanishing_folders(monkeypatch, root, "d/object", failures=0)
    with pytest.raises(StoreError, match="Not a directory"):
        await store.put("d/object", b"written")
    assert tries == [1], "a failure with no folder vanishing is not tried again"


# -- capabilities --------------------------------------------------------------------------


def test_obstore_stores_declare_what_their_type_does(tmp_path: Path) -> None:
    native = StoreCapabilities(native_compare_and_swap=True, user_metadata=True)
    assert ObstoreStore(MemoryStore()).capabilities == native
    s3 = open_store("s3://bucket/prefix", region="us-east-1", skip_signature=True)
    assert ObstoreStore(s3).capabilities == native
    assert ObstoreStore(LocalStore(tmp_path)).capabilities == StoreCapabilities(
        native_compare_and_swap=False, user_metadata=False, local_path=tmp_path
    )
    assert ObstoreStore(HTTPStore.from_url("https://example.com/x")).capabilities == (
        StoreCapabilities()
    )


def test_wrappers_declare_the_capabilities_of_what_they_wrap(tmp_path: Path) -> None:
    inner = ObstoreStore(LocalStore(tmp_path))
    wrapped = RetryingStore(FaultyStore(inner), RetryPolicy())
    assert capabilities_of(wrapped) == inner.capabilities
    assert capabilities_of(wrapped).local_path == tmp_path


class BareStore:
    """A third-party store written without capabilities: every method, nothing more."""

    async def get(self, path: str) -> Blob:
        raise NotImplementedError

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        raise NotImplementedError

    async def head(self, path: str) -> ObjectInfo:
        raise NotImplementedError

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        raise NotImplementedError

    async def put_stream(
        self,
        path: str,
        open_chunks: Callable[[], AsyncIterator[Buffer]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        raise NotImplementedError

    async def stat(self, path: str) -> tuple[ObjectInfo, dict[str, str]]:
        raise NotImplementedError

    async def list_dir(self, prefix: str) -> ListDirResult:
        raise NotImplementedError

    async def list(self, prefix: str) -> list[ObjectInfo]:
        raise NotImplementedError

    async def delete(self, paths: Sequence[str]) -> None:
        raise NotImplementedError

    async def delete_prefix(self, prefix: str) -> None:
        raise NotImplementedError


def test_a_store_that_declares_no_capabilities_is_assumed_to_have_none() -> None:
    bare = BareStore()
    assert isinstance(bare, Store) and as_store(bare) is bare
    assert capabilities_of(bare) == StoreCapabilities()
    assert StoreCapabilities() == StoreCapabilities(
        native_compare_and_swap=False, user_metadata=False, local_path=None
    )
    assert capabilities_of(RetryingStore(bare, RetryPolicy())) == StoreCapabilities()
    mislabelled = BareStore()
    mislabelled.capabilities = {"native_compare_and_swap": True}  # type: ignore[attr-defined]
    assert capabilities_of(mislabelled) == StoreCapabilities()


# -- the forwarding base -------------------------------------------------------------------


class RecordingStore(BareStore):
    """Records each call with its arguments, and returns a fresh sentinel for it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any], object]] = []

    def _record(self, name: str, *args: Any, **kwargs: Any) -> Any:
        result = object()
        self.calls.append((name, args, kwargs, result))
        return result

    async def get(self, path: str) -> Any:
        return self._record("get", path)

    async def get_range(self, path: str, start: int, end: int) -> Any:
        return self._record("get_range", path, start, end)

    async def head(self, path: str) -> Any:
        return self._record("head", path)

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        return self._record("put", path, data, mode=mode, metadata=metadata)

    async def put_stream(
        self,
        path: str,
        open_chunks: Callable[[], AsyncIterator[Buffer]],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        return self._record("put_stream", path, open_chunks, metadata=metadata)

    async def stat(self, path: str) -> Any:
        return self._record("stat", path)

    async def list_dir(self, prefix: str) -> Any:
        return self._record("list_dir", prefix)

    async def list(self, prefix: str) -> Any:
        return self._record("list", prefix)

    async def delete(self, paths: Sequence[str]) -> Any:
        return self._record("delete", paths)

    async def delete_prefix(self, prefix: str) -> Any:
        return self._record("delete_prefix", prefix)


class HookLog(ForwardingStore):
    """Records what the hook is told about each call."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.seen: list[tuple[StoreMethod, str, PutMode | None]] = []

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        self.seen.append((operation, path, mode))
        return await call()


async def test_the_forwarding_base_passes_every_argument_and_result_through() -> None:
    inner = RecordingStore()
    store = HookLog(inner)
    data = memoryview(bytearray(b"payload"))
    metadata = {"sha256": "ab"}
    if_match = IfMatch("etag-1", version="v1")
    paths = ["x", "y"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b"never read by the recording store"

    returned = [
        await store.get("g"),
        await store.get_range("r", 3, 9),
        await store.head("h"),
        await store.put("p", data, mode=if_match, metadata=metadata),
        await store.put("o", data),
    ]
    await store.put_stream("s", chunks, metadata=metadata)
    returned.append(await store.stat("st"))
    returned.append(await store.list_dir("d/"))
    returned.append(await store.list("l/"))
    await store.delete(paths)
    await store.delete([])
    await store.delete_prefix("dp/")
    sentinels = [result for *_, result in inner.calls]
    assert returned == [sentinels[i] for i in (0, 1, 2, 3, 4, 6, 7, 8)]
    calls = [(name, args, kwargs) for name, args, kwargs, _ in inner.calls]
    assert calls == [
        ("get", ("g",), {}),
        ("get_range", ("r", 3, 9), {}),
        ("head", ("h",), {}),
        ("put", ("p", data), {"mode": if_match, "metadata": metadata}),
        ("put", ("o", data), {"mode": "overwrite", "metadata": None}),
        ("put_stream", ("s", chunks), {"metadata": metadata}),
        ("stat", ("st",), {}),
        ("list_dir", ("d/",), {}),
        ("list", ("l/",), {}),
        ("delete", (paths,), {}),
        ("delete", ([],), {}),
        ("delete_prefix", ("dp/",), {}),
    ]
    # The very objects, not copies: the stream callable, the buffer, the metadata.
    assert inner.calls[5][1][1] is chunks
    assert inner.calls[3][1][1] is data and inner.calls[3][2]["metadata"] is metadata
    assert inner.calls[3][2]["mode"] is if_match and inner.calls[9][1][0] is paths
    assert store.seen == [
        ("get", "g", None),
        ("get_range", "r", None),
        ("head", "h", None),
        ("put", "p", if_match),
        ("put", "o", "overwrite"),
        ("put_stream", "s", "overwrite"),
        ("stat", "st", None),
        ("list_dir", "d/", None),
        ("list", "l/", None),
        ("delete", "x", None),
        ("delete", "", None),
        ("delete_prefix", "dp/", None),
    ]
    assert repr(store) == f"HookLog({inner!r})"


async def test_a_retried_stream_is_opened_again_and_lands_whole() -> None:
    inner = ObstoreStore(MemoryStore())
    lose_first = PutFault("stream.bin", steps=("lose",), kinds=frozenset({"overwrite"}))
    store = RetryingStore(
        FaultyStore(inner, FaultPlan(put_faults=[lose_first])),
        RetryPolicy(attempts=2, initial_delay=0, max_delay=0),
    )
    opened: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        attempt = len(opened)
        yield f"attempt {attempt}, ".encode()
        yield b"second chunk"

    def open_chunks() -> AsyncIterator[bytes]:
        opened.append(len(opened) + 1)
        return chunks()

    await store.put_stream("stream.bin", open_chunks)
    assert opened == [1, 2]
    assert [what for *_, what in lose_first.fired] == ["lost", "passed"]
    assert bytes((await inner.get("stream.bin")).data) == b"attempt 2, second chunk"


def test_importing_cairn_does_not_import_pytest() -> None:
    code = (
        "import sys, cairn, cairn.stores, cairn.stores.retry\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest'))\n"
        "assert not loaded, loaded\n"
        "assert 'cairn.testing' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


# -- GCS: a compare-and-swap is conditioned on the generation -------------------------------


def _gcs_without_server() -> ObstoreStore:
    """A GCS store whose endpoint nobody listens on: any request fails to connect."""
    no_retry: Any = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=5)}
    options = gcs_store_options("http://127.0.0.1:9")
    return ObstoreStore(GCSStore("bucket", **options, retry_config=no_retry))


async def test_a_gcs_compare_and_swap_without_the_generation_is_refused_before_sending() -> None:
    store = _gcs_without_server()
    # object_store's own refusal ("Version required for conditional update"), reproduced:
    with pytest.raises(GenericError, match="Version required for conditional update"):
        await obstore.put_async(store.obstore, "x", b"v", mode={"e_tag": '"abc"'})
    with pytest.raises(StoreError) as refused:
        await store.put("x", b"v", mode=IfMatch('"abc"'))
    assert type(refused.value) is StoreError and refused.value.path == "x"
    assert "GCS compares generations" in str(refused.value)
    assert "IfMatch(info.e_tag, info.version)" in str(refused.value)
    # With the generation it is sent: nothing listens, so it fails to connect.
    with pytest.raises(TransientStoreError):
        await store.put("x", b"v", mode=IfMatch('"abc"', "1700000000000000"))


class _Versioned(ForwardingStore):
    """Memory with a version on every object, as GCS has; records every put's mode."""

    def __init__(self) -> None:
        super().__init__(ObstoreStore(MemoryStore()))
        self.modes: list[PutMode] = []
        self.versions: dict[str, int] = {}

    def _stamp(self, info: ObjectInfo) -> ObjectInfo:
        return dataclasses.replace(info, version=str(self.versions.get(info.path, 0)))

    async def get(self, path: str) -> Blob:
        blob = await super().get(path)
        return Blob(blob.data, self._stamp(blob.info))

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        mode: PutMode = "overwrite",
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        self.modes.append(mode)
        written = await super().put(path, data, mode=mode, metadata=metadata)
        self.versions[path] = self.versions.get(path, 0) + 1
        return self._stamp(written)


async def test_pointer_swaps_replace_the_version_they_read() -> None:
    """``_latest`` and ``_writer`` are swapped on what the read returned, version included
    (a swap built from the e-tag alone is what GCS refused)."""
    store = _Versioned()
    ckpt = ObjectStoreCheckpointer(store)
    await ckpt.take_over()
    await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"one"}))
    await ckpt.save(CheckpointData(epoch=2, snapshots={("op", 0): b"two"}))
    swaps = [mode for mode in store.modes if isinstance(mode, IfMatch)]
    assert len(swaps) >= 3  # the fence in _writer, and _latest moved by each save
    assert all(mode.version is not None for mode in swaps), swaps
    assert {mode.version for mode in swaps} <= {"1", "2", "3"}


async def test_missing_gcs_credentials_fail_at_once_and_say_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Off Google Cloud without credentials object_store asks a metadata server that is
    not there: not worth retrying, and explained."""
    dead = "127.0.0.1:9"
    for name in (
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud default credentials
    monkeypatch.setenv("GCE_METADATA_HOST", dead)
    monkeypatch.setenv("GCE_METADATA_IP", dead)
    store = ObstoreStore(open_store("gs://bucket", base_url="http://127.0.0.1:9"))
    with pytest.raises(StoreError) as info:
        await store.list("checkpoints/")
    assert type(info.value) is StoreCredentialsError, "a token that cannot be had is not transient"
    hint = explain_store_error(info.value, "gs://bucket")
    assert hint == str(info.value) and hint.startswith(
        "no GCS credentials are configured, and the GCE metadata "
        f"server ({dead}, only on Google Cloud) gave no token: no answer (connect failed) to "
        "list 'checkpoints/'; set GOOGLE_SERVICE_ACCOUNT to the path of a service-account key"
    ), hint


def test_refused_gcs_credentials_say_so() -> None:
    debug = (
        "Generic GCS error: Error performing token request: Error performing POST "
        "https://oauth2.googleapis.com/token - 400 Bad Request\n\nDebug source:\n"
        'Generic {\n    store: "GCS",\n    source: TokenRequest {\n        source: RetryError(\n'
        "            RetryErrorImpl {\n                method: POST,\n"
        "                uri: Some(\n                    https://oauth2.googleapis.com/token,\n"
        "                ),\n                inner: Status {\n                    status: 400,\n"
        '                    body: Some(\n                        "invalid_grant",\n'
    )
    error = translate_error("list", "checkpoints/", GenericError(debug))
    assert type(error) is StoreCredentialsError and error.status == 400
    error.__cause__ = GenericError(debug)
    assert explain_store_error(error, "gs://b") == (
        "the GCS credentials were refused: the token request to "
        "oauth2.googleapis.com got HTTP 400 (list 'checkpoints/'); check the service-account "
        "key (GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY or "
        "GOOGLE_APPLICATION_CREDENTIALS)"
    )
    # The same text from another store, or outside a token request, explains nothing.
    other = debug.replace('store: "GCS"', 'store: "S3"').replace("TokenRequest", "ListRequest")
    plain = translate_error("list", "checkpoints/", GenericError(other))
    plain.__cause__ = GenericError(other)
    assert type(plain) is StoreError and explain_store_error(plain, "gs://b") is None
