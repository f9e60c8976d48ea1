"""A DCP save records the statistics a ``save`` records: what it uploaded, carried and
stored, how long it took, and the store requests it made, every rank's summed.

Every store request of the tests below passes one recording wrapper (the ranks of a
two-rank save share it), so a manifest's ``requests`` are checked call for call against
what the store saw up to the manifest's write, and ``stored_bytes`` against the objects
left in the checkpoint's directory. The saves in several processes (gloo ranks,
``async_save`` in process mode) are checked in ``test_torch_dist.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from obstore.store import MemoryStore
from support.dcp import PREFIX, save, save_ranks, sharded
from support.recording import RecordingStore, requests_up_to_commit
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import CheckpointPaths, SyncCheckpointer
from cairn.format.ids import CheckpointId
from cairn.format.manifest import CheckpointManifest, SaveStats, StoreRequests
from cairn.stores import ObstoreStore
from cairn.torch import METADATA_OPERATOR, import_dcp

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)


def model(step: int) -> dict[str, Any]:
    """A frozen base (the same at every step) and a head that changes with ``step``."""
    generator = torch.Generator().manual_seed(7)
    return {
        "base": torch.randn(256, 64, generator=generator),
        "head": torch.full((32, 8), float(step)),
        "step": step,
    }


def stats_of(recording: RecordingStore, cid: CheckpointId) -> tuple[CheckpointManifest, SaveStats]:
    """The manifest of ``cid`` and its statistics, which must be there."""
    manifest = SyncCheckpointer(recording, CheckpointPaths(PREFIX)).load_manifest(cid)
    assert manifest.stats is not None and isinstance(manifest.stats.requests, StoreRequests)
    return manifest, manifest.stats


def check_against_store(recording: RecordingStore, cid: CheckpointId, stats: SaveStats) -> None:
    """``stats`` say what the store saw: each request up to the commit, every byte left."""
    assert stats.requests == requests_up_to_commit(recording, f"{PREFIX}{cid}/manifest.json")
    inner = recording.inner
    assert isinstance(inner, ObstoreStore)
    listed = [item for batch in inner.obstore.list(f"{PREFIX}{cid}/") for item in batch]
    assert stats.stored_bytes == sum(item["size"] for item in listed)


def test_an_incremental_dcp_save_records_what_it_uploaded_carried_and_asked() -> None:
    recording = RecordingStore(ObstoreStore(MemoryStore()))
    first = save(recording, model(1), incremental=True)  # no parent yet: a full save
    manifest, stats = stats_of(recording, first)
    check_against_store(recording, first, stats)
    own = [e for _, e in manifest.partition_entries() if e.owner is None]
    assert stats.uploaded_bytes == sum(e.size_bytes for e in own) > 256 * 64 * 4
    assert stats.uploaded_artifacts == 2  # the rank's object of ranges, the metadata
    assert (stats.carried_bytes, stats.carried_artifacts) == (0, 0)
    assert (
        isinstance(stats.requests, StoreRequests)
        and stats.requests.put >= 3
        and stats.requests.get >= 1
    )
    assert stats.duration_ms >= stats.upload_ms

    recording.log.clear()
    second = save(recording, model(2), epoch=2, incremental=True)
    manifest, stats = stats_of(recording, second)
    assert manifest.parent_id == first
    check_against_store(recording, second, stats)
    carried = [e for _, e in manifest.partition_entries() if e.owner == first]
    assert stats.carried_artifacts == len(carried) == 1
    # The base is carried (its ranges' bytes), the head uploaded again.
    assert 256 * 64 * 4 <= stats.carried_bytes < carried[0].size_bytes
    assert stats.uploaded_bytes < 256 * 64 * 4


def test_a_save_of_two_ranks_sums_both_ranks_requests() -> None:
    """The ranks' writers each make their own requests (uploads, the parent's records);
    the coordinator's manifest counts them all, as the shared store saw them."""
    recording = RecordingStore(ObstoreStore(MemoryStore()))
    whole = model(1)
    states = [sharded(whole, 2, rank) for rank in (0, 1)]
    first = save_ranks(recording, states, prefix=PREFIX, incremental=True)
    manifest, stats = stats_of(recording, first)
    check_against_store(recording, first, stats)
    assert sorted(manifest.operators) == [METADATA_OPERATOR, "rank-0", "rank-1"]
    assert stats.uploaded_artifacts == 3
    rank_puts = [p for op, p in recording.log if op == "put" and "/operators/rank-" in p]
    assert len(rank_puts) == 2

    recording.log.clear()
    whole["head"] = whole["head"] + 1
    states = [sharded(whole, 2, rank) for rank in (0, 1)]
    second = save_ranks(recording, states, prefix=PREFIX, incremental=True)
    manifest, stats = stats_of(recording, second)
    check_against_store(recording, second, stats)
    assert stats.carried_artifacts == 2 and stats.carried_bytes > 0


def test_an_import_records_its_statistics(tmp_path: Path) -> None:
    source = tmp_path / "step-5"
    dcp_save(model(5), storage_writer=FileSystemWriter(str(source)), no_dist=True)
    recording = RecordingStore(ObstoreStore(MemoryStore()))
    imported = import_dcp(recording, source, epoch=5, prefix=PREFIX)
    manifest, stats = stats_of(recording, imported.checkpoint_id)
    check_against_store(recording, imported.checkpoint_id, stats)
    own = [e.size_bytes for _, e in manifest.partition_entries()]
    assert stats.uploaded_bytes == sum(own) > 256 * 64 * 4
    assert stats.uploaded_artifacts == len(own) == 2  # the file as one object, the metadata
