"""GC and ``delete_checkpoint`` delete only what cairn wrote.

The default base prefix is the store's root, so a bucket shared with other data is a
normal deployment: another application's objects may sit under a prefix named like a
checkpoint id (a UUIDv7), even inside a real checkpoint's directory. Neither GC nor
``delete_checkpoint`` deletes them, GC claims no directory that holds only such objects,
and GC reports them (:attr:`GcResult.foreign_objects`). Whatever cairn writes inside a
checkpoint directory is a name :func:`cairn.format.layout.is_cairn_name` accepts (checked here
against what every writer puts, and against the stored layouts under ``tests/data``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore, ObjectStore
from support.backends import make_checkpointer
from support.paths import DATA
from support.recording import RecordingStore

from cairn import (
    CheckpointData,
    CheckpointId,
    RetentionPolicy,
)
from cairn.format import manifest as manifest_module
from cairn.format.layout import CheckpointPaths, is_cairn_name, is_intent
from cairn.stores import Store, as_store

ZERO = dt.timedelta(0)
FOREIGN = b"another application's data\n"
ATTEMPT = "0123456789ab"


def state(epoch: int) -> CheckpointData:
    """A small full checkpoint."""
    return CheckpointData(epoch=epoch, snapshots={("op", 0): b"state %d" % epoch})


async def paths_under(store: Store, prefix: str = "") -> set[str]:
    return {info.path for info in await store.list(prefix)}


async def read_all(store: Store, paths: list[str]) -> dict[str, bytes]:
    return {path: bytes((await store.get(path)).data) for path in paths}


# -- on every backend ------------------------------------------------------------------------


async def test_gc_deletes_only_what_cairn_wrote_and_reports_the_rest(
    raw_store: ObjectStore,
) -> None:
    ckpt = make_checkpointer(raw_store)
    old = (await ckpt.save(state(1))).checkpoint_id
    new = (await ckpt.save(state(2))).checkpoint_id
    store, paths = ckpt.store, ckpt.paths
    lookalike = CheckpointId.now()  # a prefix named like an id that cairn never wrote to
    stopped = CheckpointId.now()  # a save that stopped before its commit, its lease gone
    foreign = [
        f"{lookalike}/orders.parquet",
        f"{lookalike}/year=2024/orders.parquet",
        f"{old}/notes.txt",  # beside a checkpoint GC deletes
        f"{old}/manifest.json.bak",  # named almost like what cairn writes
        f"{old}/packs/x",
        f"{new}/notes.txt",  # beside one GC keeps
        f"{stopped}/upload.csv",  # beside a stopped save's upload
    ]
    for path in foreign:
        await store.put(path, FOREIGN)
    stray = paths.snapshot(stopped, "op", 0)
    await store.put(stray, b"uploaded by a save that never committed")
    old_own = await paths_under(store, paths.checkpoint_dir(old)) - set(foreign)

    planned = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO, dry_run=True)
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO)

    for run in (planned, result):
        assert run.deleted == [old] and run.retained == [new]
        assert sorted(run.foreign_objects) == sorted(foreign)
        assert run.orphans_deleted == [stray] and run.failures == []
    assert await read_all(store, foreign) == dict.fromkeys(foreign, FOREIGN)
    left = await paths_under(store)
    assert not old_own & left and stray not in left
    assert paths.manifest(lookalike) not in left, "a prefix cairn never wrote is never claimed"
    assert paths.manifest(stopped) in left  # the stopped save's id is claimed: it never commits
    assert not await ckpt.exists(stopped)
    assert result.objects_deleted == len(old_own) + 1
    assert await ckpt.list_checkpoints() == [new]
    assert (await ckpt.load(new)).epoch == 2


async def test_delete_checkpoint_deletes_only_what_cairn_wrote(raw_store: ObjectStore) -> None:
    ckpt = make_checkpointer(raw_store)
    cid = (await ckpt.save(state(1))).checkpoint_id
    kept = (await ckpt.save(state(2))).checkpoint_id
    directory = ckpt.paths.checkpoint_dir(cid)
    foreign = [f"{directory}notes.txt", f"{directory}operators/op/README", f"{directory}x/y.bin"]
    for path in foreign:
        await ckpt.store.put(path, FOREIGN)
    own = await paths_under(ckpt.store, directory) - set(foreign)
    assert ckpt.paths.manifest(cid) in own and len(own) > 1

    await ckpt.delete_checkpoint(cid)

    assert await paths_under(ckpt.store, directory) == set(foreign)
    assert await read_all(ckpt.store, foreign) == dict.fromkeys(foreign, FOREIGN)
    assert await ckpt.list_checkpoints() == [kept]


# -- names that look almost like cairn's -------------------------------------------------------

CAIRN_NAMES = [
    "manifest.json",
    "intent.json",
    f"operators/op/partition-0.{ATTEMPT}.snap",
    f"operators/op/partition-17.{ATTEMPT}.delta",
    f"operators/op/partition-3.{ATTEMPT}.file-12",
    f"packs/pack-0.{ATTEMPT}.pack",
    f"parts/part-{'ab' * 32}.json",
    "operators/op/partition-0.snap",
    "operators/op/partition-2.delta",
    "offsets/events.json",
]
"""One of every kind of name cairn writes in a checkpoint directory."""

NEAR_MISSES = [
    "manifest.json.bak",
    "manifest.json~",
    ".manifest.json",
    "Manifest.json",
    "x/manifest.json",
    "intent.json.tmp",
    "packs/x",
    "packs/pack-0.pack",
    f"packs/pack-01.{ATTEMPT}.pack",
    f"packs/pack-0.{ATTEMPT.upper()}.pack",
    f"packs/pack-0.{ATTEMPT}.pack/x",
    "parts/part-abc.json",
    f"parts/part-{'AB' * 32}.json",
    "operators/op/partition-0.snap.tmp",
    "operators/op/partition-00.snap",
    "operators/op/partition-4294967296.snap",
    "operators/op/partition-0.json",
    "operators/op/sub/partition-0.snap",
    f"operators/op/partition-0.{ATTEMPT}.file-",
    f"operators/op/partition-0.{ATTEMPT[:-1]}.snap",
    "operators/partition-0.snap",
    "offsets/events.txt",
    "offsets/a/b.json",
    "orders.parquet",
]


@pytest.mark.parametrize("name", CAIRN_NAMES)
def test_every_kind_of_name_cairn_writes_is_a_cairn_name(name: str) -> None:
    assert is_cairn_name(name)


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_names_that_look_almost_like_cairns_are_not(name: str) -> None:
    assert not is_cairn_name(name)


@st.composite
def altered_names(draw: st.DrawFn) -> str:
    """A name cairn writes, altered a little: a character replaced, dropped or added, or
    something put before or after it."""
    name = draw(st.sampled_from(CAIRN_NAMES))
    how = draw(st.sampled_from(["replace", "drop", "insert", "append", "prepend"]))
    where = draw(st.integers(0, len(name) - 1))
    char = draw(st.sampled_from("az09._-/~#A"))
    if how == "replace":
        assume(name[where] != char)
        altered = name[:where] + char + name[where + 1 :]
    elif how == "drop":
        altered = name[:where] + name[where + 1 :]
    elif how == "insert":
        altered = name[:where] + char + name[where:]
    elif how == "append":
        altered = name + draw(st.sampled_from([".bak", "~", ".tmp", "/x", ".json", "#1"]))
    else:
        altered = draw(st.sampled_from(["x/", "old/", ".", "_"])) + name
    assume(all(segment not in ("", ".", "..") for segment in altered.split("/")))
    return altered


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(names=st.lists(altered_names(), min_size=1, max_size=6, unique=True))
def test_gc_deletes_an_altered_name_exactly_when_cairn_writes_such_names(
    names: list[str],
) -> None:
    async def run() -> None:
        ckpt = make_checkpointer(MemoryStore())
        old = (await ckpt.save(state(1))).checkpoint_id
        new = (await ckpt.save(state(2))).checkpoint_id
        directory = ckpt.paths.checkpoint_dir(old)
        # Clear of the names the save itself wrote there, which GC deletes anyway.
        placed = [name for name in names if directory + name not in await paths_under(ckpt.store)]
        for name in placed:
            await ckpt.store.put(directory + name, FOREIGN)
        result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO)
        # Names cairn writes that the manifest does not (another attempt's, an intent)
        # outlive it by one run: the next claims the directory, then sweeps them.
        await ckpt.gc(RetentionPolicy(keep_last=1), min_age=ZERO)
        foreign = {directory + name for name in placed if not is_cairn_name(name)}
        assert result.deleted == [old]
        assert set(result.foreign_objects) == foreign
        manifest = ckpt.paths.manifest(old)
        left = await paths_under(ckpt.store, directory)
        assert left - {manifest} == foreign
        if manifest in left:  # what is left of the checkpoint is a claim, a tombstone
            assert bytes((await ckpt.store.get(manifest)).data) == b""
        assert (await ckpt.load(new)).epoch == 2

    asyncio.run(run())


# -- every name cairn writes -------------------------------------------------------------------


def checkpoint_objects(paths: CheckpointPaths, written: set[str]) -> dict[str, str]:
    """Each of ``written`` that lies in a checkpoint directory, with its relative name."""
    return {
        path: path.removeprefix(paths.checkpoint_dir(cid))
        for path in written
        if (cid := paths.checkpoint_of(path)) is not None
    }


def puts(store: RecordingStore) -> set[str]:
    return {path for op, path in store.log if op == "put"}


async def test_every_object_a_save_writes_in_a_checkpoint_is_a_cairn_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest_module, "PART_ENTRIES", 16)  # parts from a few dozen entries
    recording = RecordingStore(as_store(MemoryStore()))
    ckpt = make_checkpointer(recording, CheckpointPaths("jobs/a/"), lease=dt.timedelta(seconds=1))
    folder = tmp_path / "dir"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_bytes(b"a")
    (folder / "sub" / "b.bin").write_bytes(b"b" * 100)
    small = {("agg", p): b"small %d" % p for p in range(40)}
    base = await ckpt.save(
        CheckpointData(epoch=1, snapshots={**small, ("big", 0): b"x" * (1 << 20)})
    )
    await ckpt.save(
        CheckpointData(
            epoch=2,
            deltas={("agg", 0): b"delta"},
            directories={("files", 0): folder},
            parent_id=base.checkpoint_id,
        )
    )
    reference = CheckpointId.now()
    await ckpt.save_snapshot(reference, "ref", 0, b"snapshot")
    await ckpt.save_delta(reference, "ref", 1, b"delta")
    stopped = CheckpointId.now()
    await ckpt.save_snapshot(stopped, "ref", 0, b"never committed")
    await asyncio.sleep(2.1)  # its lease lapses (stamps may be whole seconds)
    result = await ckpt.gc(RetentionPolicy(keep_last=5), min_age=ZERO)  # claims the stopped ones

    written = checkpoint_objects(ckpt.paths, puts(recording))
    kinds = {"intent" if is_intent(name) else name.split("/")[0] for name in written.values()}
    assert kinds == {"manifest.json", "intent", "operators", "packs", "parts"}
    # A save that commits writes an intent of its own; parts of a save share intent.json.
    assert "intent.json" in written.values()
    assert any(name != "intent.json" and is_intent(name) for name in written.values())
    assert any(name.endswith(".file-0") for name in written.values())
    assert [name for name in written.values() if not is_cairn_name(name)] == []
    assert result.foreign_objects == [] and ckpt.paths.manifest(stopped) in puts(recording)


@pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)
def test_every_object_a_dcp_save_writes_in_a_checkpoint_is_a_cairn_name() -> None:
    torch = pytest.importorskip("torch")
    from support import dcp

    recording = RecordingStore(as_store(MemoryStore()))
    model = {"w": torch.arange(4096, dtype=torch.float32), "step": 3}
    first = dcp.save(recording, model, epoch=1)
    model["w"] = model["w"] + 0  # unchanged: carried by the incremental save
    model["b"] = torch.ones(8)
    dcp.save(recording, model, epoch=2, incremental=True, compression="zstd")

    paths = CheckpointPaths(dcp.PREFIX)
    written = checkpoint_objects(paths, puts(recording))
    assert {paths.checkpoint_of(p) for p in written} >= {first}
    assert [name for name in written.values() if not is_cairn_name(name)] == []


@pytest.mark.parametrize(
    "store", sorted(p.name for p in DATA.iterdir() if p.is_dir()), ids=lambda name: name
)
def test_every_object_of_an_older_release_is_a_cairn_name(store: str) -> None:
    root = DATA / store
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    prefixes = {path.split("/")[0] + "/" for path in files if "/" in path} | {""}
    found = {
        path: name
        for prefix in prefixes
        for path, name in checkpoint_objects(CheckpointPaths(prefix), files).items()
    }
    assert found, "the store holds checkpoints"
    assert [name for name in found.values() if not is_cairn_name(name)] == []
