"""Decompression bombs: no read decodes past what an entry records, nor holds more.

A bomb here is a real zstd frame of zeros (a few KB stored, 64 or 512 MiB decoded, its
content size declared in its header) written over an artifact saved with
``compression="zstd"``, with the manifest rewritten so that every check made before
decoding passes (see :mod:`support.bombs`). Each read path must stop one piece past the
``size_bytes`` the entry records with :class:`OversizedArtifactError` naming the artifact
(the streamed ``load_artifact_to``, which is given no size, hands the bytes on in pieces
of at most its chunk size), and stay within a bounded peak RSS while it does: measured in
a child process per path (``ru_maxrss``, which sees zstd's C allocations too), on the
memory backend. The error types are checked on every backend.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest
from obstore.store import ObjectStore
from support import bombs
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.bombs import (
    RECORDED,
    STATE,
    Discard,
    make_bomb,
    plant_bomb,
    plant_bomb_in_dcp_item,
)
from support.cli import PREFIX, Run, base_env
from support.paths import DATA

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointManifest,
    CheckpointPaths,
    IntegrityError,
    IntegrityMismatchError,
    ObjectStoreCheckpointer,
    OversizedArtifactError,
    UndecodableArtifactError,
)
from cairn.format.codecs import MAX_WINDOW_SIZE
from cairn.format.manifest import encode_manifest

if TYPE_CHECKING:
    import torch

SMALL_BOMB = 64 * 1024 * 1024
"""What the bombs of the error-type tests decode to: enough to tell, quick to build."""

MEMORY_BOUND = 64 * 1024 * 1024
"""How much a read of a 512 MiB bomb may grow the peak RSS by (unbounded: over 512 MiB)."""

CHILD = Path(bombs.__file__)

needs_proc = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="a process's peak RSS is read from /proc"
)


def compressed(raw_store: ObjectStore) -> ObjectStoreCheckpointer:
    return make_checkpointer(raw_store, compression="zstd")


async def bombed(
    ckpt: ObjectStoreCheckpointer, bomb: bytes
) -> tuple[CheckpointManifest, CheckpointManifest, str]:
    """A good checkpoint (epoch 1), then one (epoch 2) whose artifact is ``bomb``."""
    good = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): STATE}))
    bad = await ckpt.save(CheckpointData(epoch=2, snapshots={("op", 0): STATE}))
    path = await plant_bomb(ckpt, bad.checkpoint_id, "op", bomb)
    return good, bad, path


def assert_bomb_error(error: BaseException, path: str, recorded: int = RECORDED) -> None:
    assert isinstance(error, OversizedArtifactError) and isinstance(error, IntegrityError)
    assert (error.path, error.codec, error.size_bytes) == (path, "zstd", recorded)
    assert f"more than the {recorded} bytes" in str(error)


# -- every backend: the error, and what it names ---------------------------------------------


async def test_load_and_load_chain_stop_past_the_recorded_size(raw_store: ObjectStore) -> None:
    ckpt = compressed(raw_store)
    _, bad, path = await bombed(ckpt, make_bomb(SMALL_BOMB))
    for verify in (True, False):
        with pytest.raises(OversizedArtifactError) as info:
            await ckpt.load(bad.checkpoint_id, verify=verify)
        assert_bomb_error(info.value, path)
    with pytest.raises(OversizedArtifactError) as info:
        await ckpt.load_chain(bad.checkpoint_id, "op", 0)
    assert_bomb_error(info.value, path)


async def test_load_latest_falls_back_past_a_bomb(
    raw_store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = compressed(raw_store)
    good, bad, path = await bombed(ckpt, make_bomb(SMALL_BOMB))
    with caplog.at_level(logging.WARNING, logger="cairn"):
        loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.manifest.checkpoint_id == good.checkpoint_id
    assert bytes(loaded.artifacts[("op", 0)]) == STATE
    [warning] = [r.getMessage() for r in caplog.records if str(bad.checkpoint_id) in r.message]
    assert path in warning and f"more than the {RECORDED} bytes" in warning


async def test_a_streamed_restore_hands_on_pieces_of_at_most_its_chunk_size(
    raw_store: ObjectStore,
) -> None:
    ckpt = compressed(raw_store)
    _, bad, path = await bombed(ckpt, make_bomb(SMALL_BOMB))
    [entry] = bad.operators["op"].partitions
    sink = Discard()
    chunk = 256 * 1024
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load_artifact_to(
            path, sink, expected_sha256=entry.sha256, chunk_size=chunk, codec="zstd"
        )
    assert info.value.path == path and info.value.expected == entry.sha256
    # Given no recorded size, it decodes the whole stream, but never more than a chunk at once.
    assert sink.total == SMALL_BOMB and 0 < sink.largest <= chunk


async def test_a_frame_that_asks_for_a_huge_window_is_refused(raw_store: ObjectStore) -> None:
    ckpt = compressed(raw_store)
    window_log = (2 * MAX_WINDOW_SIZE).bit_length() - 1
    _, bad, path = await bombed(ckpt, make_bomb(SMALL_BOMB, window_log=window_log))
    with pytest.raises(UndecodableArtifactError) as info:
        await ckpt.load(bad.checkpoint_id)
    assert info.value.path == path and info.value.codec == "zstd"
    [entry] = bad.operators["op"].partitions
    sink = Discard()
    with pytest.raises(UndecodableArtifactError):
        await ckpt.load_artifact_to(path, sink, expected_sha256=entry.sha256, codec="zstd")
    assert sink.total == 0


async def test_stored_bytes_are_read_no_further_than_their_recorded_size(
    raw_store: ObjectStore,
) -> None:
    """A valid frame followed by more bytes than the entry records: refused on the size,
    where a whole read would have decoded the frame and ignored the rest."""
    ckpt = compressed(raw_store)
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): STATE}))
    [entry] = saved.operators["op"].partitions
    assert entry.stored_size_bytes is not None
    path = ckpt.paths.resolve(saved.checkpoint_id, entry.path)
    frame = bytes((await ckpt.store.get(path)).data)
    await ckpt.store.put(path, frame + bytes(1024 * 1024))
    with pytest.raises(IntegrityMismatchError) as info:
        await ckpt.load(saved.checkpoint_id, verify=False)
    assert info.value.path == path
    assert (info.value.expected, info.value.actual) == (
        str(entry.stored_size_bytes),
        str(len(frame) + 1024 * 1024),
    )


async def test_an_uncompressed_artifact_is_read_no_further_than_recorded(
    raw_store: ObjectStore,
) -> None:
    """Also unverified, and also an artifact recorded as empty (no range reads it). Each
    is a checkpoint's only artifact, so it is its own object (not a range of a pack)."""
    ckpt = make_checkpointer(raw_store)
    longer = STATE + bytes(1024 * 1024)
    for state in (STATE, b""):
        saved = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): state}))
        path = artifact_path(ckpt.paths, saved, "op", 0)
        await ckpt.store.put(path, longer)
        for verify in (True, False):
            with pytest.raises(IntegrityMismatchError) as info:
                await ckpt.load(saved.checkpoint_id, verify=verify)
            assert info.value.path == path
            assert (info.value.expected, info.value.actual) == (str(len(state)), str(len(longer)))


async def test_a_hand_made_entry_without_a_stored_size_is_still_bounded(
    raw_store: ObjectStore,
) -> None:
    ckpt = compressed(raw_store)
    _, bad, path = await bombed(ckpt, make_bomb(SMALL_BOMB))
    manifest = await ckpt.load_manifest(bad.checkpoint_id)
    group = manifest.operators["op"]
    entries = tuple(msgspec.structs.replace(p, stored_size_bytes=None) for p in group.partitions)
    operators = {"op": msgspec.structs.replace(group, partitions=entries)}
    forged = msgspec.structs.replace(manifest, operators=operators)
    await ckpt.store.put(ckpt.paths.manifest(bad.checkpoint_id), encode_manifest(forged))
    with pytest.raises(OversizedArtifactError) as info:
        await ckpt.load(bad.checkpoint_id)
    assert_bomb_error(info.value, path)


# -- DCP (cairn.torch) -----------------------------------------------------------------------


def dcp_bombed(raw_store: ObjectStore) -> tuple[list[CheckpointId], str, int]:
    """Two DCP checkpoints saved compressed (each item a zstd frame of its rank's object),
    the second's one item bombed (:func:`plant_bomb_in_dcp_item`): the ids, the object's
    path and the item's recorded length."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from cairn.torch import CairnWriter

    ids: list[CheckpointId] = []
    for epoch in (1, 2):
        writer = CairnWriter(raw_store, epoch=epoch, prefix="dcp/", compression="zstd")
        dcp_save({"w": weights(epoch)}, storage_writer=writer, no_dist=True)
        assert writer.checkpoint_id is not None
        ids.append(writer.checkpoint_id)
    path, recorded = plant_bomb_in_dcp_item(raw_store, "dcp/", ids[1], make_bomb(SMALL_BOMB))
    return ids, path, recorded


def weights(epoch: int) -> torch.Tensor:
    """The tensor a DCP save of ``epoch`` holds: random, so that it barely compresses."""
    import torch

    return torch.randn(100_000, generator=torch.Generator().manual_seed(epoch))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_dcp_reads_stop_past_the_recorded_size(
    raw_store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("torch")
    ids, path, recorded = dcp_bombed(raw_store)
    import torch
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from cairn.torch import CairnReader, load_latest

    reader = CairnReader(raw_store, checkpoint_id=ids[1], prefix="dcp/")
    with pytest.raises(CheckpointException) as info:
        dcp_load({"w": torch.zeros(100_000)}, storage_reader=reader, no_dist=True)
    [(error, _)] = info.value.failures.values()
    assert_bomb_error(error, path, recorded)
    state = {"w": torch.zeros(100_000)}
    with caplog.at_level(logging.WARNING, logger="cairn"):
        assert load_latest(state, raw_store, prefix="dcp/") == ids[0]
    assert torch.equal(state["w"], weights(1))
    assert path in caplog.text and f"more than the {recorded} bytes" in caplog.text
    # cairn's own verification of the object decodes each range in the same bound.
    with pytest.raises(OversizedArtifactError) as verified:
        asyncio.run(make_checkpointer(raw_store, CheckpointPaths("dcp/")).load(ids[1]))
    assert_bomb_error(verified.value, path, recorded)


OLD_COMPRESSED_DCP = DATA / "dcp-store-per-tensor-zstd"
"""DCP saves by an earlier writer with ``compression="zstd"``: every object, the metadata
included, compressed whole (see ``tests/dcp/test_torch_old_layout.py``)."""


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_old_dcp_metadata_stops_past_the_recorded_size(raw_store: ObjectStore) -> None:
    pytest.importorskip("torch")
    from cairn.torch import METADATA_OPERATOR, CairnReader

    ckpt = make_checkpointer(raw_store, CheckpointPaths("dcp/"))
    for file in sorted(OLD_COMPRESSED_DCP.rglob("*")):
        if file.is_file():
            key = file.relative_to(OLD_COMPRESSED_DCP).as_posix()
            asyncio.run(ckpt.store.put(key, file.read_bytes()))
    latest = asyncio.run(ckpt.list_checkpoints())[-1]
    path = asyncio.run(plant_bomb(ckpt, latest, METADATA_OPERATOR, make_bomb(SMALL_BOMB)))
    [entry] = asyncio.run(ckpt.load_manifest(latest)).operators[METADATA_OPERATOR].partitions
    with pytest.raises(OversizedArtifactError) as info:
        CairnReader(raw_store, checkpoint_id=latest, prefix="dcp/").read_metadata()
    assert_bomb_error(info.value, path, entry.size_bytes)


# -- the command line (local store) -----------------------------------------------------------

_WRAPPER = """
import json, sys
from support.bombs import peak_rss
from cairn.cli import main
from support.paths import DATA
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump(peak_rss(), out)
raise SystemExit(code)
"""


def cairn_measured(tmp_path: Path, *args: str) -> tuple[Run, int]:
    """Run ``cairn ARGS`` in a new interpreter, as ``python -m cairn.cli`` does; the
    finished run and the peak RSS of that process in bytes."""
    peak_file = tmp_path / "peak.json"
    paths = [str(CHILD.parents[1]), os.environ.get("PYTHONPATH", "")]
    env = base_env({"PYTHONPATH": os.pathsep.join(p for p in paths if p)})
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(peak_file), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    peak = json.loads(peak_file.read_text())
    peak_file.unlink()
    return Run(tuple(args), done.returncode, done.stdout, done.stderr), peak


@needs_proc
def test_cli_verify_restore_and_copy_refuse_a_bomb_in_bounded_memory(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()
    ckpt = ObjectStoreCheckpointer(url, CheckpointPaths(PREFIX), compression="zstd")
    good, bad, path = asyncio.run(bombed(ckpt, make_bomb()))
    store = ["--store", url]
    healthy, healthy_peak = cairn_measured(tmp_path, "verify", str(good.checkpoint_id), *store)
    assert healthy.code == 0, healthy.explain()
    target = tmp_path / "restored"
    runs = [
        cairn_measured(tmp_path, "verify", str(bad.checkpoint_id), *store, "--json"),
        cairn_measured(tmp_path, "restore", str(bad.checkpoint_id), "--to", str(target), *store),
        cairn_measured(
            tmp_path,
            "copy",
            str(bad.checkpoint_id),
            "--to",
            (tmp_path / "copy").as_uri(),
            *store,
            "--json",
        ),
    ]
    for run, peak in runs:
        assert peak - healthy_peak < MEMORY_BOUND, (peak, healthy_peak, run.explain())
        assert run.code == 1, run.explain()
        assert path in run.stdout + run.stderr, run.explain()
        assert f"more than the {RECORDED} bytes" in run.stdout + run.stderr, run.explain()
    verified, restored, copied = (run for run, _ in runs)
    assert verified.json()["checkpoints"][0]["ok"] is False
    assert "integrity failure" in restored.error_line()
    assert not target.exists() or not any(target.rglob("*.snap"))
    assert copied.json()["checkpoints"][0]["status"] == "failed"


# -- memory (a child process per read path, memory backend) -----------------------------------


@needs_proc
@pytest.mark.parametrize(
    ("what", "window_log", "error"),
    [
        ("load", 21, "OversizedArtifactError"),
        ("load_chain", 21, "OversizedArtifactError"),
        ("load_latest", 21, None),
        ("load_artifact_to", 21, "IntegrityMismatchError"),  # decoded whole, a piece at a time
        ("load_artifact_to", 27, "UndecodableArtifactError"),  # a 128 MiB window: refused
        ("dcp", 21, "OversizedArtifactError"),
    ],
)
def test_reading_a_bomb_keeps_memory_bounded(
    what: str, window_log: int, error: str | None, tmp_path: Path
) -> None:
    if what == "dcp":
        pytest.importorskip("torch")
    bomb = tmp_path / "bomb.zst"
    bomb.write_bytes(make_bomb(window_log=window_log))
    done = subprocess.run(
        [sys.executable, str(CHILD), what, str(bomb)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["grew"] < MEMORY_BOUND, result
    if what == "load_latest":
        assert result["loaded"] == 1, result
    else:
        assert result["error"] == error, result
        assert re.search(r"/partition-0\.[0-9a-f]{12}\.snap$", result["path"]), result
