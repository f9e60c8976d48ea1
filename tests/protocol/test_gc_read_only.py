"""GC on a store it may only read: nothing to delete means nothing written.

GC reads the store's own time by writing ``{base}_clock``
(:func:`cairn.protocol.retention.store_now`) only when it may delete or claim something;
a run with nothing to do writes nothing, so it succeeds on a read-only store. A run that
must write there fails before it changes anything, with a :class:`StoreError` that names
``_clock`` and says the store is read-only. The read-only store here refuses writes with
the very errors the store boundary makes of a backend's refusal (obstore's permission
error, as S3, GCS and Azure give it, and the OS's, as a local directory gives it).
"""

from __future__ import annotations

import datetime as dt
import errno
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from obstore.exceptions import PermissionDeniedError
from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.cli import Filled, cairn, store_root
from support.immutable import immutable
from support.recording import RecordingStore

from cairn import CheckpointData, CheckpointId, RetentionPolicy, StoreError
from cairn.cli.errors import ExitCode
from cairn.stores import ForwardingStore, PutMode, Store, StoreMethod, as_store
from cairn.stores._translate import translate_error

T = TypeVar("T")
ZERO = dt.timedelta(0)
WRITES = frozenset({"put", "put_stream", "delete", "delete_prefix"})

Refusal = Callable[[], BaseException]

REFUSALS: dict[str, Refusal] = {
    "permission denied (cloud)": lambda: PermissionDeniedError("the caller may not write"),
    "permission denied (local)": lambda: PermissionError(errno.EACCES, "Permission denied"),
    "read-only file system": lambda: OSError(errno.EROFS, "Read-only file system"),
}


class ReadOnlyStore(ForwardingStore):
    """Reads go through; every write fails as the store boundary reports ``refusal``."""

    def __init__(self, inner: Store, refusal: Refusal) -> None:
        super().__init__(inner)
        self.refusal = refusal
        self.refused: list[str] = []

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if operation in WRITES:
            self.refused.append(path)
            cause = self.refusal()
            raise translate_error(operation, path, cause) from cause
        return await call()


async def saved(store: Store, epochs: int) -> list[CheckpointId]:
    ckpt = make_checkpointer(store)
    return [
        (await ckpt.save(CheckpointData(epoch=e, snapshots={("op", 0): b"%d" % e}))).checkpoint_id
        for e in range(epochs)
    ]


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def contents(store: Store) -> dict[str, bytes]:
    return {info.path: bytes((await store.get(info.path)).data) for info in await store.list("")}


@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS.keys())
async def test_gc_with_nothing_to_delete_succeeds_on_a_read_only_store(refusal: Refusal) -> None:
    store = as_store(MemoryStore())
    ids = await saved(store, 3)
    before = await contents(store)
    read_only = ReadOnlyStore(store, refusal)
    ckpt = make_checkpointer(read_only)
    for policy in (RetentionPolicy(keep_last=3), RetentionPolicy(keep_every_n_epochs=1)):
        result = await ckpt.gc(policy, min_age=ZERO)
        assert (result.deleted, result.retained, result.failures) == ([], ids, [])
        assert result.objects_deleted == 0 and result.bytes_reclaimed == 0
    assert read_only.refused == []
    assert await contents(store) == before


async def test_gc_with_nothing_to_delete_writes_not_even_its_clock() -> None:
    store = as_store(MemoryStore())
    ids = await saved(store, 2)
    recording = RecordingStore(store)
    ckpt = make_checkpointer(recording)
    result = await ckpt.gc(RetentionPolicy(keep_last=5), min_age=ZERO)
    assert result.retained == ids
    assert [op for op, _ in recording.log if op in ("put", "delete")] == []
    assert ckpt.paths.clock() not in {info.path for info in await store.list("")}
    # With something to delete, it reads the store's time as before.
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO)
    assert result.deleted == ids[:1]
    assert ("put", ckpt.paths.clock()) in recording.log


@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS.keys())
async def test_gc_that_must_write_on_a_read_only_store_says_so_and_changes_nothing(
    refusal: Refusal,
) -> None:
    store = as_store(MemoryStore())
    ids = await saved(store, 3)
    before = await contents(store)
    read_only = ReadOnlyStore(store, refusal)
    ckpt = make_checkpointer(read_only)
    planned = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO, dry_run=True)
    assert planned.deleted == ids[:2]  # a dry run needs no write

    with pytest.raises(StoreError) as raised:
        await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO)

    clock = ckpt.paths.clock()
    assert type(raised.value) is StoreError
    assert raised.value.path == clock and raised.value.operation == "put"
    message = str(raised.value)
    assert "the store is read-only to gc" in message
    assert f"gc writes {clock!r} to read the store's own time" in message
    assert read_only.refused == [clock]
    assert await contents(store) == before


async def test_a_write_that_fails_for_another_reason_is_not_called_read_only() -> None:
    store = as_store(MemoryStore())
    await saved(store, 3)
    full = ReadOnlyStore(store, lambda: OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(StoreError) as raised:
        await make_checkpointer(full).gc(RetentionPolicy(keep_last=1), min_age=ZERO)
    assert "No space left on device" in str(raised.value)
    assert "read-only" not in str(raised.value)


def test_cairn_gc_on_a_local_directory_it_may_not_write(local: Filled) -> None:
    root = store_root(local)
    before = files_under(root)
    store = ("--store", local.url, "--min-age", "0s", "--json")
    with immutable(root):  # no entry may be made in it, not even by root
        nothing = cairn("gc", "--keep-last", "3", *store)
        something = cairn("gc", "--keep-last", "1", *store)
    assert nothing.code == ExitCode.OK, nothing.explain()
    assert nothing.json()["deleted"] == [] and nothing.json()["retained"] == local.ids
    assert something.code == ExitCode.STORE, something.explain()
    error = something.error_line()
    assert "the store is read-only to gc" in error and "gc writes '_clock'" in error
    assert files_under(root) == before
