"""DCP checkpoints as tests make and inspect them: saves and loads in one process with
no process group, bit-exact comparison of states, item records, the ranged reads of a
load, and saves of many ranks in one process (each rank's shard a real slice of a global
tensor, so loads are bit-exact)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import WriteResult

from cairn.format.ids import CheckpointId
from cairn.stores import ForwardingStore, Store
from cairn.torch import CairnReader, CairnWriter, SafeLoadPlanner
from cairn.torch._format import ItemRecord
from cairn.torch._reader import load_records
from cairn.torch._runtime import run

PREFIX = "dcp/"
"""Where the helpers below save and load."""


def save(store: Any, state: Any, epoch: int = 1, **options: Any) -> CheckpointId:
    """One ``dcp.save`` of ``state`` into ``store`` by this process alone, through a
    ``CairnWriter`` with ``options``; the checkpoint's id."""
    writer = CairnWriter(store, epoch=epoch, prefix=PREFIX, **options)
    dcp_save(state, storage_writer=writer, no_dist=True)
    assert writer.checkpoint_id is not None
    return writer.checkpoint_id


def load(store: Any, state: Any, checkpoint_id: CheckpointId | None = None) -> CairnReader:
    """One ``dcp.load`` into ``state`` by this process alone (the latest checkpoint, or
    ``checkpoint_id``); the reader, which knows what it loaded."""
    reader = CairnReader(store, checkpoint_id=checkpoint_id, prefix=PREFIX)
    dcp_load(state, storage_reader=reader, no_dist=True)
    return reader


def raw(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so that equality is bit-exact (NaNs, -0.0, bfloat16 alike)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_same(loaded: Any, saved: Any, where: str = "") -> None:
    """Bit-exact equality of two states (dtype, shape and bytes of every tensor)."""
    if isinstance(saved, dict):
        assert loaded.keys() == saved.keys(), where
        for key in saved:
            assert_same(loaded[key], saved[key], f"{where}.{key}")
    elif isinstance(saved, torch.Tensor):
        assert loaded.dtype == saved.dtype and loaded.shape == saved.shape, where
        assert torch.equal(raw(loaded), raw(saved)), where
    else:
        assert loaded == saved, where


def item_records(reader: CairnReader) -> dict[MetadataIndex, ItemRecord]:
    """Every item record of the checkpoint ``reader`` opened (``read_metadata`` is called
    first if it was not), every block of them read and checked."""
    if reader._opened is None:
        reader.read_metadata()
    opened = reader._opened
    assert opened is not None
    run(load_records(reader.checkpointer, opened, None), "item_records")
    return dict(opened.records)


class RankRangeStore(ForwardingStore):
    """Records the ``(start, end)`` of every ranged read of rank 0's objects."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.ranges: list[tuple[int, int]] = []

    async def get_range(self, path: str, start: int, end: int) -> Any:
        if "/rank-0/" in path:
            self.ranges.append((start, end))
        return await super().get_range(path, start, end)


class Shard:
    """Rows ``start`` to ``start + rows`` of a global tensor, as DCP's save and load see
    a sharded value (DCP's ``_Checkpointable`` protocol, as DTensor implements it)."""

    def __init__(self, whole: torch.Tensor, start: int, rows: int) -> None:
        self.global_size = whole.size()
        self.offsets = torch.Size([start, *([0] * (whole.dim() - 1))])
        self.local = whole[start : start + rows].clone()

    def size(self) -> torch.Size:
        return self.global_size

    def chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=self.offsets, sizes=self.local.size())

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        data = TensorWriteData(
            chunk=self.chunk(),
            properties=TensorProperties.create_from_tensor(self.local),
            size=self.global_size,
        )
        index = MetadataIndex(fqn, self.offsets)
        return [WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=data)]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self.chunk()]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self.local


def sharded(whole: dict[str, Any], ranks: int, rank: int, *, blank: bool = False) -> dict[str, Any]:
    """Rank ``rank``'s state of ``whole`` over ``ranks``: each tensor cut along dim 0 as
    ``torch.chunk`` cuts it (zeros in place of the values with ``blank``); other values
    as they are."""
    state: dict[str, Any] = {}
    for fqn, value in whole.items():
        if not isinstance(value, torch.Tensor):
            state[fqn] = value
            continue
        step = -(-value.size(0) // ranks)
        start = min(rank * step, value.size(0))
        shard = Shard(value, start, min(step, value.size(0) - start))
        if blank:
            shard.local.zero_()
        state[fqn] = shard
    return state


class ShardSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, resolving an item on its :class:`Shard`."""

    def lookup_object(self, index: MetadataIndex) -> Any:
        value = self.state_dict[index.fqn]
        return value.__get_tensor_shard__(index) if isinstance(value, Shard) else value


class _ShardLoading(DefaultLoadPlanner):
    """Resolves an item on its value's ``__get_tensor_shard__`` (a :class:`Shard`, or a
    benchmark's stand-in), and is set up without DCP's ``_init_state_dict`` (which
    turns any value that is not a tensor into None)."""

    def set_up_planner(
        self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False
    ) -> None:
        self.original_state_dict = state_dict
        self.state_dict, self.mappings = flatten_state_dict(state_dict)
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn].__get_tensor_shard__(index)  # type: ignore[no-any-return]


class ShardLoadPlanner(_ShardLoading, SafeLoadPlanner):
    """cairn's load planner over :class:`Shard` values."""


class DefaultShardLoadPlanner(_ShardLoading):
    """DCP's own default load planner over :class:`Shard` values."""


def plan_and_write(
    store: Any, states: Sequence[dict[str, Any]], **options: Any
) -> tuple[list[CairnWriter], Metadata, list[list[WriteResult]]]:
    """A ``dcp.save`` of ``states`` (rank ``r``'s state at ``r``), a ``CairnWriter`` per
    rank over ``store``, up to the commit: the writers, DCP's metadata, every rank's
    results (what the coordinator's ``finish`` takes)."""
    writers = [CairnWriter(store, epoch=1, **options) for _ in states]
    planners = [ShardSavePlanner() for _ in states]
    local = []
    for rank, (writer, planner, state) in enumerate(zip(writers, planners, states, strict=True)):
        writer.reset()
        planner.set_up_planner(state, writer.storage_meta(), rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        local.append(writer.prepare_local_plan(planner.create_local_plan()))
    plans, metadata = planners[0].create_global_plan(local)
    plans = writers[0].prepare_global_plan(plans)
    results = []
    for writer, planner, plan in zip(writers, planners, plans, strict=True):
        future = writer.write_data(planner.finish_plan(plan), planner)
        future.wait()
        results.append(future.value())
    return writers, metadata, results


def save_ranks(store: Any, states: Sequence[dict[str, Any]], **options: Any) -> CheckpointId:
    """One ``dcp.save`` of ``states``, committed (see :func:`plan_and_write`); its id."""
    writers, metadata, results = plan_and_write(store, states, **options)
    writers[0].finish(metadata, results)
    assert writers[0].checkpoint_id is not None
    return writers[0].checkpoint_id


def plan_rank(
    reader: CairnReader, state: dict[str, Any], planner: DefaultLoadPlanner | None = None
) -> tuple[Metadata, LoadPlan, DefaultLoadPlanner]:
    """One rank's load plan of ``state`` from ``reader``, as DCP makes it."""
    planner = planner if planner is not None else ShardLoadPlanner()
    metadata = reader.read_metadata()
    planner.set_up_planner(state, metadata, True)
    reader.set_up_storage_reader(metadata, True)
    plan = reader.prepare_local_plan(planner.create_local_plan())
    plan = reader.prepare_global_plan(planner.create_global_plan([plan]))[0]
    return metadata, planner.finish_plan(plan), planner


def load_rank(reader: CairnReader, state: dict[str, Any]) -> LoadPlan:
    """Load ``state`` (one rank's) from ``reader`` as DCP does; the plan it read."""
    _, plan, planner = plan_rank(reader, state)
    reader.read_data(plan, planner).wait()
    return plan
