"""The store contract: the rules every :class:`~cairn.stores.Store` keeps, as pytest tests.

cairn's own backends (memory, local directory, S3, GCS, Azure) and wrappers (retrying,
fault-injecting) all run it; run it against yours by subclassing :class:`StoreContract`
with a ``store`` fixture that returns a new, empty store::

    import pytest
    from cairn.testing import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self) -> MyStore:
            return MyStore(...)

        # Only if the store does not wrap an obstore store (see read_raw / write_raw):
        async def write_raw(self, store, path, data): ...
        async def read_raw(self, store, path): ...

pytest collects the rules as tests of the subclass. They are coroutines marked for
pytest-asyncio (``pip install 'cairn-checkpoint[test]'``). What a rule checks, it checks on the
bytes and objects left in the store and on the type and message of the error raised.

The rules, in the order below: reads return exactly what is stored and name a missing
object as not found; a ranged read returns exactly its range; ``head`` and ``stat``
describe the current version; an overwrite replaces the object; a create-only put and a
compare-and-swap put (of the version ``get``, ``head`` or ``put`` reported: its e-tag and
its ``version``, which GCS compares) change nothing when they fail and let exactly one of
concurrent racers win; user metadata is kept exactly where the store declares it
(:class:`~cairn.stores.StoreCapabilities`); a streamed put writes one whole object;
``list`` reports every object under a prefix and ``list_dir`` one level of it;
``delete`` ignores missing objects and ``delete_prefix`` removes everything below the
prefix; and, for a store on a local directory (``local_path``), its objects are the
files there and symbolic links are never followed.
"""

# ruff: noqa: E402 (the imports after the check of the extra need it)
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, ClassVar

from cairn.errors import MissingExtraError

MissingExtraError.require("cairn.testing", "test", ("pytest", "pytest_asyncio"))

import obstore
import pytest
from obstore.store import ObjectStore

from cairn.errors import (
    CheckpointNotFoundError,
    InvalidInputError,
    ObjectExistsError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
)
from cairn.stores import (
    ForwardingStore,
    IfMatch,
    ObstoreStore,
    PutMode,
    Store,
    StoreCapabilities,
    capabilities_of,
)

__all__ = ["StoreContract"]

PATHS = ["object", "a/b/c.bin", "with space/ünïcødé%20.bin"]
"""Object paths every read and write rule is run with: a bare name, a nested one, and
one that needs escaping in a URL (and must still come back exactly as written)."""

RACERS = 8
"""How many concurrent conditional puts race for one object."""


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` deterministic bytes that differ with ``seed`` (never all alike)."""
    block = hashlib.sha256(seed.to_bytes(8, "big")).digest()
    return (block * (size // len(block) + 1))[:size]


class StoreContract:
    """The rules of a :class:`~cairn.stores.Store`; subclass with a ``store`` fixture.

    Each rule gets a new, empty store from the ``store`` fixture. Rules that check a
    method against the stored state read and write that state with :meth:`read_raw`
    and :meth:`write_raw`, which bypass the store under test; their defaults reach the
    files of a store that declares a ``local_path``, or else the obstore store inside an
    :class:`~cairn.stores.ObstoreStore` (through any :class:`~cairn.stores.ForwardingStore`
    wrappers). A store that wraps something else overrides both.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    @pytest.fixture
    def store(self) -> Store:
        """A new, empty store to check. Every subclass overrides this fixture."""
        raise NotImplementedError(f"{type(self).__name__} must define the `store` fixture")

    # -- access that bypasses the store under test --------------------------------------

    async def write_raw(self, store: Store, path: str, data: bytes) -> None:
        """Store bytes without calling the methods under test.

        Args:
            store: The store under test.
            path: The object's store path.
            data: The bytes to store there.

        Raises:
            NotImplementedError: The store neither is a local directory nor wraps an
                obstore store: override this method.
        """
        root = capabilities_of(store).local_path
        if root is None:
            await obstore.put_async(self._obstore_of(store), path, data)
            return
        file = root.joinpath(*path.strip("/").split("/"))
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data)

    async def read_raw(self, store: Store, path: str) -> bytes | None:
        """The bytes stored at a path, read without the methods under test.

        Args:
            store: The store under test.
            path: The object's store path.

        Returns:
            The bytes, or None if nothing is stored there.

        Raises:
            NotImplementedError: The store neither is a local directory nor wraps an
                obstore store: override this method.
        """
        root = capabilities_of(store).local_path
        try:
            if root is not None:
                return root.joinpath(*path.strip("/").split("/")).read_bytes()
            result = await obstore.get_async(self._obstore_of(store), path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return bytes(await result.bytes_async())

    def _obstore_of(self, store: Store) -> ObjectStore:
        inner: object = store
        while isinstance(inner, ForwardingStore):
            inner = inner.inner
        if isinstance(inner, ObstoreStore):
            return inner.obstore
        raise NotImplementedError(
            f"{type(self).__name__}: {type(inner).__name__} wraps no obstore store; "
            "override write_raw and read_raw to reach its objects directly"
        )

    async def listed(self, store: Store, prefix: str = "") -> list[str]:
        """The paths a listing reports.

        Args:
            store: The store under test.
            prefix: The prefix listed (``store.list(prefix)``); empty for all.

        Returns:
            The paths, sorted.
        """
        return sorted(info.path for info in await store.list(prefix))

    # -- reads ------------------------------------------------------------------------

    @pytest.mark.parametrize("path", PATHS)
    async def test_get_returns_the_bytes_and_their_version(self, store: Store, path: str) -> None:
        data = payload(3000, seed=1)
        await self.write_raw(store, path, data)
        blob = await store.get(path)
        assert bytes(blob.data) == data
        head = await store.head(path)
        assert (blob.info.path, blob.info.size) == (path, len(data))
        assert blob.info.e_tag is not None
        assert (blob.info.e_tag, blob.info.version) == (head.e_tag, head.version)

    async def test_get_of_an_empty_object(self, store: Store) -> None:
        await self.write_raw(store, "empty", b"")
        blob = await store.get("empty")
        assert bytes(blob.data) == b""
        assert blob.info.size == 0

    @pytest.mark.parametrize("operation", ["get", "get_range", "head", "stat"])
    async def test_reading_a_missing_object_is_not_found(
        self, store: Store, operation: str
    ) -> None:
        await self.write_raw(store, "dir/present", b"x")
        reads: dict[str, Callable[[str], Coroutine[Any, Any, object]]] = {
            "get": store.get,
            "get_range": lambda path: store.get_range(path, 0, 1),
            "head": store.head,
            "stat": store.stat,
        }
        for path in ("dir/missing", "missing/dir/object"):
            with pytest.raises(CheckpointNotFoundError) as info:
                await reads[operation](path)
            assert isinstance(info.value, FileNotFoundError)
            assert info.value.path == path
            assert repr(path) in str(info.value)

    @pytest.mark.parametrize("path", PATHS)
    async def test_get_range_returns_exactly_the_range(self, store: Store, path: str) -> None:
        data = payload(10_000, seed=2)
        await self.write_raw(store, path, data)
        for start, end in [(0, 1), (0, 10_000), (1234, 5678), (9_999, 10_000)]:
            assert bytes(await store.get_range(path, start, end)) == data[start:end]
        # An end past the object's end reads to the end; an empty range reads nothing.
        assert bytes(await store.get_range(path, 9_990, 20_000)) == data[9_990:]
        assert bytes(await store.get_range(path, 500, 500)) == b""

    async def test_get_range_starting_past_the_end_fails_for_good(self, store: Store) -> None:
        await self.write_raw(store, "ten", payload(10))
        with pytest.raises(StoreError) as info:
            await store.get_range("ten", 10, 20)
        assert not isinstance(info.value, TransientStoreError | CheckpointNotFoundError)
        assert "'ten'" in str(info.value)

    async def test_get_range_needs_start_at_most_end(self, store: Store) -> None:
        await self.write_raw(store, "ten", payload(10))
        for start, end in [(5, 4), (-1, 3)]:
            with pytest.raises(InvalidInputError) as info:
                await store.get_range("ten", start, end)
            assert f"start={start}, end={end}" in str(info.value)
            assert "'ten'" in str(info.value)
        with pytest.raises(CheckpointNotFoundError):
            await store.get_range("missing", 3, 3)

    async def test_head_and_stat_describe_the_current_version(self, store: Store) -> None:
        before = dt.datetime.now(dt.UTC)
        await self.write_raw(store, "obj", payload(100, seed=1))
        first = await store.head("obj")
        assert (first.path, first.size) == ("obj", 100)
        assert first.e_tag is not None
        # Loose bounds: servers keep whole seconds and their clock is not ours.
        assert first.last_modified.tzinfo is not None
        assert abs(first.last_modified - before) < dt.timedelta(minutes=5)
        info, _ = await store.stat("obj")
        assert (info.path, info.size, info.e_tag) == ("obj", 100, first.e_tag)
        assert info.version == first.version
        await self.write_raw(store, "obj", payload(50, seed=2))
        second = await store.head("obj")
        assert second.size == 50
        assert second.e_tag not in (None, first.e_tag)

    # -- writes -----------------------------------------------------------------------

    @pytest.mark.parametrize("path", PATHS)
    async def test_put_overwrites_with_any_buffer(self, store: Store, path: str) -> None:
        written = await store.put(path, b"first version")
        assert (written.path, written.size) == (path, len(b"first version"))
        assert await self.read_raw(store, path) == b"first version"
        data = payload(5000, seed=3)
        written = await store.put(path, memoryview(bytearray(data)))
        assert await self.read_raw(store, path) == data
        assert (written.path, written.size) == (path, 5000)
        assert written.e_tag is None or written.e_tag == (await store.head(path)).e_tag
        assert written.version is None or written.version == (await store.head(path)).version
        await store.put(path, b"")
        assert await self.read_raw(store, path) == b""

    async def test_create_only_put_never_replaces(self, store: Store) -> None:
        written = await store.put("once", b"first", mode="create")
        assert written.size == 5
        assert await self.read_raw(store, "once") == b"first"
        with pytest.raises(ObjectExistsError) as info:
            await store.put("once", b"second", mode="create")
        assert info.value.path == "once"
        assert "'once'" in str(info.value)
        assert await self.read_raw(store, "once") == b"first"

    async def test_compare_and_swap_replaces_only_the_expected_version(self, store: Store) -> None:
        await self.write_raw(store, "pointer", b"v1")
        v1 = await store.head("pointer")
        assert v1.e_tag is not None
        swapped = await store.put("pointer", b"v2", mode=IfMatch(v1.e_tag, v1.version))
        assert await self.read_raw(store, "pointer") == b"v2"
        v2 = await store.head("pointer")
        assert (swapped.e_tag, swapped.version) == (v2.e_tag, v2.version)
        assert v2.e_tag != v1.e_tag
        with pytest.raises(PreconditionFailedError) as info:
            await store.put("pointer", b"v3", mode=IfMatch(v1.e_tag, v1.version))
        assert info.value.path == "pointer"
        assert "'pointer'" in str(info.value)
        assert await self.read_raw(store, "pointer") == b"v2"
        assert (await store.head("pointer")).e_tag == v2.e_tag
        # What a swap returned is the version the next swap replaces.
        assert swapped.e_tag is not None
        await store.put("pointer", b"v3", mode=IfMatch(swapped.e_tag, swapped.version))
        assert await self.read_raw(store, "pointer") == b"v3"

    async def _swap_a_missing_object(self, store: Store) -> PreconditionFailedError:
        await self.write_raw(store, "other", b"x")
        other = await store.head("other")
        assert other.e_tag is not None
        with pytest.raises(PreconditionFailedError) as info:
            await store.put("dir/gone", b"new", mode=IfMatch(other.e_tag, other.version))
        return info.value

    async def test_compare_and_swap_of_a_missing_object_fails(self, store: Store) -> None:
        error = await self._swap_a_missing_object(store)
        assert error.path == "dir/gone"
        assert "'dir/gone'" in str(error)
        assert await self.read_raw(store, "dir/gone") is None

    async def test_a_failed_compare_and_swap_leaves_no_object(self, store: Store) -> None:
        await self._swap_a_missing_object(store)
        assert await self.listed(store) == ["other"]

    @pytest.mark.parametrize("kind", ["create", "compare_and_swap"])
    async def test_one_of_concurrent_conditional_puts_wins(self, store: Store, kind: str) -> None:
        mode: PutMode = "create"
        if kind == "compare_and_swap":
            await self.write_raw(store, "race", b"start")
            start = await store.head("race")
            assert start.e_tag is not None
            mode = IfMatch(start.e_tag, start.version)
        bodies = [f"racer {i}".encode() for i in range(RACERS)]
        outcomes = await asyncio.gather(
            *(store.put("race", body, mode=mode) for body in bodies), return_exceptions=True
        )
        winners = [
            body
            for body, out in zip(bodies, outcomes, strict=True)
            if not isinstance(out, BaseException)
        ]
        losers = [out for out in outcomes if isinstance(out, BaseException)]
        expected = ObjectExistsError if kind == "create" else PreconditionFailedError
        assert len(winners) == 1, outcomes
        assert all(type(out) is expected for out in losers), losers
        assert await self.read_raw(store, "race") == winners[0]

    async def test_metadata_is_kept_where_the_store_declares_it(self, store: Store) -> None:
        digest = hashlib.sha256(b"with metadata").hexdigest()
        await store.put("put.bin", b"with metadata", metadata={"sha256": digest})

        async def chunks() -> AsyncIterator[bytes]:
            yield b"with metadata"

        await store.put_stream("streamed.bin", chunks, metadata={"sha256": digest})
        kept = capabilities_of(store).user_metadata
        for path in ("put.bin", "streamed.bin"):
            assert await self.read_raw(store, path) == b"with metadata"
            info, metadata = await store.stat(path)
            assert info.size == len(b"with metadata")
            if kept:
                assert metadata.get("sha256") == digest, metadata
            else:
                assert "sha256" not in metadata, metadata

    @pytest.mark.parametrize("sizes", [[], [1], [3000, 0, 7], [6 * 2**20, 3 * 2**20, 5]])
    async def test_put_stream_writes_the_chunks_as_one_object(
        self, store: Store, sizes: Sequence[int]
    ) -> None:
        parts = [payload(size, seed=i) for i, size in enumerate(sizes)]
        opened = 0

        def open_chunks() -> AsyncIterator[bytes]:
            nonlocal opened
            opened += 1
            return _aiter(parts)

        await store.put_stream("big/stream.bin", open_chunks)
        assert opened >= 1
        assert await self.read_raw(store, "big/stream.bin") == b"".join(parts)
        assert (await store.head("big/stream.bin")).size == sum(sizes)

    # -- listing ----------------------------------------------------------------------

    LAYOUT: ClassVar[dict[str, bytes]] = {
        "p/a": b"1",
        "p/b/c": b"22",
        "p/b/d/e": b"333",
        "p/with space/ünï%20": b"4444",
        "pq/x": b"55555",
        "q": b"666666",
    }

    async def _write_layout(self, store: Store) -> None:
        for path, data in self.LAYOUT.items():
            await self.write_raw(store, path, data)

    async def test_list_reports_every_object_under_the_prefix(self, store: Store) -> None:
        await self._write_layout(store)
        everything = await store.list("")
        assert {info.path: info.size for info in everything} == {
            path: len(data) for path, data in self.LAYOUT.items()
        }
        assert len(everything) == len(self.LAYOUT)
        under_p = ["p/a", "p/b/c", "p/b/d/e", "p/with space/ünï%20"]
        assert await self.listed(store, "p/") == under_p
        assert await self.listed(store, "p/b/") == ["p/b/c", "p/b/d/e"]
        assert await self.listed(store, "missing/") == []
        for info in everything:
            assert info.e_tag == (await store.head(info.path)).e_tag, info.path

    async def test_list_dir_gives_one_level(self, store: Store) -> None:
        await self._write_layout(store)
        top = await store.list_dir("")
        assert sorted(top.prefixes) == ["p/", "pq/"]
        assert [info.path for info in top.objects] == ["q"]
        level = await store.list_dir("p/")
        assert sorted(level.prefixes) == ["p/b/", "p/with space/"]
        assert [(info.path, info.size) for info in level.objects] == [("p/a", 1)]
        assert level.objects[0].e_tag == (await store.head("p/a")).e_tag
        deep = await store.list_dir("p/b/d/")
        assert deep.prefixes == []
        assert [info.path for info in deep.objects] == ["p/b/d/e"]
        missing = await store.list_dir("missing/")
        assert missing.prefixes == []
        assert missing.objects == []

    # -- deleting ---------------------------------------------------------------------

    async def test_delete_removes_the_objects_and_ignores_missing_ones(self, store: Store) -> None:
        await self._write_layout(store)
        await store.delete(["p/a", "p/missing", "p/b/c", "never/was/there"])
        assert await self.read_raw(store, "p/a") is None
        assert await self.read_raw(store, "p/b/c") is None
        assert await self.listed(store) == sorted(set(self.LAYOUT) - {"p/a", "p/b/c"})
        await store.delete([])
        await store.delete(["p/a"])  # again: already gone
        assert await self.read_raw(store, "q") == self.LAYOUT["q"]

    async def test_delete_prefix_removes_everything_below_it(self, store: Store) -> None:
        await self._write_layout(store)
        await store.delete_prefix("p/")
        assert await self.listed(store) == ["pq/x", "q"]
        assert await self.read_raw(store, "p/b/d/e") is None
        assert await self.read_raw(store, "pq/x") == self.LAYOUT["pq/x"]
        await store.delete_prefix("p/")
        await store.delete_prefix("missing/")
        assert await self.listed(store) == ["pq/x", "q"]

    # -- capabilities -----------------------------------------------------------------

    async def test_capabilities_are_a_store_capabilities(self, store: Store) -> None:
        assert isinstance(store, Store)
        assert isinstance(capabilities_of(store), StoreCapabilities)

    async def test_objects_are_the_files_of_the_local_path(self, store: Store) -> None:
        root = _local_path(store)
        await store.put("dir/file.bin", b"on disk")
        assert (root / "dir" / "file.bin").read_bytes() == b"on disk"
        (root / "dir" / "planted.bin").write_bytes(b"planted")
        assert bytes((await store.get("dir/planted.bin")).data) == b"planted"

    async def test_symbolic_links_are_never_followed(
        self, store: Store, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        root = _local_path(store)
        outside = tmp_path_factory.mktemp("outside-the-store")
        (outside / "secret.txt").write_bytes(b"outside secret")
        before = _tree(outside)
        await store.put("real/object.bin", b"real")
        (root / "real" / "dir-link").symlink_to(outside, target_is_directory=True)
        (root / "real" / "file-link").symlink_to(outside / "secret.txt")

        for path in ("real/dir-link/secret.txt", "real/file-link"):
            with pytest.raises(CheckpointNotFoundError):
                await store.get(path)
            with pytest.raises(CheckpointNotFoundError):
                await store.get_range(path, 0, 3)
            with pytest.raises(CheckpointNotFoundError):
                await store.head(path)
            with pytest.raises(CheckpointNotFoundError):
                await store.stat(path)
            with pytest.raises(StoreError, match="symbolic link"):
                await store.put(path, b"written through a link")
        with pytest.raises(StoreError, match="symbolic link"):
            await store.put("real/dir-link/new.bin", b"new")
        assert await self.listed(store) == ["real/object.bin"]
        level = await store.list_dir("real/")
        assert level.prefixes == []
        assert [i.path for i in level.objects] == ["real/object.bin"]
        assert _tree(outside) == before

        await store.delete(["real/dir-link/secret.txt"])
        await store.delete_prefix("real/dir-link/")
        assert _tree(outside) == before
        await store.delete_prefix("real/")
        assert not _lexists(root / "real")
        assert _tree(outside) == before


def _local_path(store: Store) -> Path:
    root = capabilities_of(store).local_path
    if root is None:
        pytest.skip("the store declares no local_path")
    return root


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


async def _aiter(parts: Sequence[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
