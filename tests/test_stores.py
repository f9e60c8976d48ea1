"""open_store, error translation at the store boundary, and the local compare-and-swap."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, GenericError, PreconditionError
from obstore.store import LocalStore, MemoryStore

from cairn import (
    CheckpointNotFoundError,
    InvalidStoreUrlError,
    ObjectExistsError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
    open_store,
)
from cairn.stores import IfMatch, ObstoreStore, translate_error


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
        ("nonsense", "unknown scheme"),
        ("file://relative/dir", "not host"),
        ("file:", "absolute path"),
        ("s3://", "missing bucket"),
        ("memory://x", "no path"),
        ("", "unknown scheme"),
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
        (FileNotFoundError("x"), CheckpointNotFoundError),
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


async def test_no_raw_obstore_error_escapes(tmp_path: Path) -> None:
    store = ObstoreStore(LocalStore(tmp_path))
    with pytest.raises(CheckpointNotFoundError):
        await store.get("missing")
    with pytest.raises(CheckpointNotFoundError):
        await store.head("missing")
    await store.delete(["missing", "also/missing"])
    await store.put("a", b"1", mode="create")
    with pytest.raises(ObjectExistsError):
        await store.put("a", b"2", mode="create")


async def test_local_compare_and_swap(tmp_path: Path) -> None:
    store = ObstoreStore(LocalStore(tmp_path))
    first = await store.put("ptr", b"one")
    current = await store.head("ptr")
    assert first.e_tag is not None
    swapped = await store.put("ptr", b"two", mode=IfMatch(current.e_tag or ""))
    assert bytes((await store.get("ptr")).data) == b"two"
    with pytest.raises(PreconditionFailedError):
        await store.put("ptr", b"three", mode=IfMatch(current.e_tag or ""))
    assert bytes((await store.get("ptr")).data) == b"two"
    assert swapped.e_tag == (await store.head("ptr")).e_tag
    with pytest.raises(PreconditionFailedError):
        await store.put("gone", b"x", mode=IfMatch(current.e_tag or ""))


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
