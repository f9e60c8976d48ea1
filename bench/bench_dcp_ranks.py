"""DCP saves and loads through cairn at rank scale, simulated in one process.

    python bench/bench_dcp_ranks.py [--quick] [--ranks 8,64] [--stores memory,s3]
                                    [--layouts ranges,per-tensor] [--reps 3]
                                    [--scale 4096] [--no-split]
                                    [--skip-dcp-plan-check] [--incremental]
                                    [--json out.json]

One process plays every rank of a ``dcp.save`` and of one rank's ``dcp.load``, calling
the storage protocol in the order ``torch.distributed.checkpoint`` does
(``state_dict_saver._save_state_dict``, ``state_dict_loader._load_state_dict``):

* save, per rank: ``planner.set_up_planner(state_dict, writer.storage_meta(), is_coordinator)``,
  ``writer.set_up_storage_writer(is_coordinator, rank=r, use_collectives=True)`` (the form
  DCP uses for a writer whose method takes ``**kwargs``), ``planner.create_local_plan()``,
  ``writer.prepare_local_plan``; coordinator (rank 0): ``planner.create_global_plan(all)``,
  ``writer.prepare_global_plan``; per rank: ``planner.finish_plan(its plan)``,
  ``writer.write_data(plan, planner)`` (its ``WriteResult`` list); coordinator:
  ``writer.finish(metadata, every rank's results)``;
* load, one rank (rank 0, a fresh reader): ``reader.read_metadata()``,
  ``planner.set_up_planner``, ``reader.set_up_storage_reader(metadata, True, rank=0)``,
  ``create_local_plan``/``prepare_local_plan``, ``create_global_plan([plan])``/
  ``prepare_global_plan`` (the coordinator's step, over that one plan), ``finish_plan``,
  ``reader.read_data``; the values read are checked against the ones saved.

Each rank has its own ``CairnWriter`` over the one shared store, as each process would.
Only those protocol methods are called, so the script measures whatever layout the
writer and reader implement.

The state: a 70B model with Llama-3-70B's shapes (80 layers, hidden 8192, FFN 28672,
vocabulary 128,256, 64 query / 8 KV heads of 128: q/o 8192x8192, k/v 1024x8192, gate/up
28672x8192, down 8192x28672, two 8192 RMSNorm weights per layer, a final norm,
embed_tokens and lm_head 128256x8192), fp32 weights and Adam's exp_avg and exp_avg_sq:
2,169 tensors, 70.6e9 parameters, 847 GB. Every tensor is sharded along dim 0 over the
ranks as FSDP2 shards (``torch.chunk``: shards of ceil(dim0 / ranks) rows, the last ones
smaller or empty: at 4,096 ranks, k/v have one row on ranks 0-1,023 and none after).
Every rank saves one item per tensor, an empty shard included, as DTensor's
``__create_write_items__`` does; such an item has 0 bytes and nothing to read back.

What is real, what is shrunk:

* real: every item of every rank, its chunk metadata (offsets and sizes within the
  global tensor), DCP's global plan and ``Metadata`` (built by ``DefaultSavePlanner``,
  unmodified but for the lookup below), every ``WriteResult``, every record and digest
  cairn makes, every object it writes, the manifest and the metadata object, and the
  load plan of a rank (``cairn.torch.SafeLoadPlanner``, which is DCP's
  ``DefaultLoadPlanner`` handed, per tensor, the saved chunks that overlap the rank's;
  against metadata without a chunk table, such as the per-tensor layout's, it is
  DCP's planner matching the rank's chunks against every saved chunk);
* shrunk: the payload. A rank's shard of a tensor is a stand-in object
  (:class:`ShardStandIn`) that tells DCP the real chunk and resolves to a tiny fp32
  tensor of ``numel / scale`` elements (:func:`stand_in_shape`: same number of
  dimensions, none larger than the real chunk's, so DCP's narrowing leaves it whole on
  both sides). The two
  planners differ from theirs only in looking an item up on the stand-in
  (DCP's ``find_state_dict_object`` wants a ``torch.Tensor``), and the load planner's
  set-up in skipping ``_init_state_dict`` (for meta tensors; it would drop stand-ins).

Where size decides the layout: the writer cuts a rank's items into objects of ranges
(``split_into_objects``: at these sizes one per rank, one more per 16 GiB), judged by
the items' chunk metadata, which is real here, so the object count is a real save's. The earlier
layout (``--layouts per-tensor``, ``bench/per_tensor.py``) made a
tensor of >= 1 MiB an object of its own and packed smaller ones into 8 MiB bundles,
judged by the resolved bytes: for it the script divides the writer's size thresholds
by ``--scale`` while it saves (:data:`SIZE_KNOBS`, module constants of
``bench.per_tensor``), so the writer
decides on the sizes the real shards have. With ``--scale`` a power of two up to
4,096, every 2-D shard divides exactly (a row is 8,192 or 28,672 = 7 x 4,096 fp32):
its stand-in is exactly 1/scale of it, and own objects and the entries and records of
everything are exactly a real save's. A norm's shard (8,192 / ranks fp32) cannot
shrink below one element: from 8 ranks on (at the default scale) its stand-in is one
fp32, more than 1/scale of the shard, so bundles receive a little more than they
would (reported per row: the excess at real size, about 0.06% of the data at 64
ranks, 1% at 1,024), which can add a bundle per rank now and then: the per-tensor
bundle count is an upper bound, within a few percent. A knob that no longer exists is
reported (``unscaled knobs``).

Not reproduced by the shrink: S3 request counts that depend on bytes. "PUT requests"
counts the store's put calls (``RecordingStore``: a put or a streamed put is one); at real
sizes obstore splits a put of over 5 MiB into a multipart upload (create, one request
per 5 MiB part, complete), which tiny payloads never trigger. ``PUT est.`` adds that
from each data object's real size (its stored size times ``scale``). Times exclude moving
and hashing the real bytes: they are the per-item and per-object costs (planning,
records, digests of tiny buffers, requests, the manifest and metadata, which are full
size). A rank's stand-ins make their tiny tensors before its ``write_data``, as a rank's
tensors exist before it writes; while the ranks write, the objects made before (every
rank's plan) are kept out of the cycle collector's passes (``gc.freeze``), since a
rank's own process would not hold them, and back in them for ``finish``, since the
coordinator does.

Reported per rank count and store: objects in the checkpoint directory, PUT requests,
root manifest bytes, sub-manifest bytes (a column only when the store holds objects
named ``*manifest*`` besides the root manifest), DCP metadata bytes, the median over
``--reps`` saves of the coordinator's ``finish`` and of one rank's load planning
(``read_metadata`` through ``finish_plan``), and the wall time of one whole save+load.
With ``--incremental``, each save is followed by a second save of the same state with
``CairnWriter(..., incremental=True)``, which carries every item from the first: its
items uploaded (0 expected), PUT requests, the coordinator's ``prepare_global_plan``
(where it opens the parent), the slowest rank's ``write_data`` (where each rank reads
the parent's records of its own items and hashes its stand-ins against them), and
``finish``. Then the targets the layout must meet at 1,024 ranks (objects <= ranks + 4,
root manifest <= 1 MiB, finish <= 2 s, one rank's load planning <= 1 s), pass or fail.

Scale: items grow as 2,169 x ranks (2.2 million at 1,024), and so does the memory of the
coordinator's plans, results and metadata. S3 is moto's server on a loopback port
(``tests/support/servers.py``), which is slow per request: keep it to small rank counts.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import importlib
import itertools
import math
import pickle
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import obstore
import torch
from obstore.store import ObjectStore
from torch.distributed.checkpoint import default_planner
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_dcp_ranks.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers, support.recording

from bench.harness import MiB, emit_json, memory_or_moto_store, table  # noqa: E402
from bench.per_tensor import PerTensorWriter  # noqa: E402
from cairn.format.codecs import get_codec  # noqa: E402
from cairn.format.layout import CheckpointPaths  # noqa: E402
from cairn.stores import as_store  # noqa: E402
from cairn.torch import CairnReader, CairnWriter  # noqa: E402
from cairn.torch._itemtable import CODEC, RankItems, with_plain_chunks  # noqa: E402

recording: Any = importlib.import_module("support.recording")
dcp_support: Any = importlib.import_module("support.dcp")

# -- the model ------------------------------------------------------------------------

LAYERS, HIDDEN, FFN, VOCAB, KV = 80, 8192, 28672, 128_256, 8 * 128

SIZE_KNOBS: tuple[tuple[str, str], ...] = (
    ("bench.per_tensor", "OWN_ARTIFACT_BYTES"),
    ("bench.per_tensor", "BUNDLE_BYTES"),
)
"""Byte sizes by which the writer lays out objects: divided by ``--scale`` during a save."""

OBSTORE_PART = 5 * MiB
"""obstore's multipart threshold and part size for a put (its ``chunk_size`` default)."""

TIMES = ("plan_s", "write_s", "finish_s", "load_plan_s", "metadata_s", "read_s", "total_s")
"""The seconds :class:`Run` measures (reported as medians over the saves)."""

TARGET_RANKS = 1024
TARGETS = {
    "objects": "<= ranks + 4",
    "manifest": "<= 1 MiB",
    "finish": "<= 2 s",
    "load plan": "<= 1 s",
}


def parameters() -> list[tuple[str, tuple[int, ...]]]:
    """Llama-3-70B's parameters: (name, shape), in ``named_parameters`` order."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        shapes += [
            (f"{layer}.self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (f"{layer}.self_attn.k_proj.weight", (KV, HIDDEN)),
            (f"{layer}.self_attn.v_proj.weight", (KV, HIDDEN)),
            (f"{layer}.self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (f"{layer}.mlp.gate_proj.weight", (FFN, HIDDEN)),
            (f"{layer}.mlp.up_proj.weight", (FFN, HIDDEN)),
            (f"{layer}.mlp.down_proj.weight", (HIDDEN, FFN)),
            (f"{layer}.input_layernorm.weight", (HIDDEN,)),
            (f"{layer}.post_attention_layernorm.weight", (HIDDEN,)),
        ]
    shapes += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return shapes


def tensors() -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the training state: weights, then Adam's two moments of each."""
    params = parameters()
    return [
        *((f"model.{name}", shape) for name, shape in params),
        *((f"optim.state.{name}.{m}", s) for name, s in params for m in ("exp_avg", "exp_avg_sq")),
    ]


def shard_rows(dim0: int, ranks: int, rank: int) -> tuple[int, int]:
    """(first row, rows) of ``rank``'s shard, as ``torch.chunk`` (FSDP2) cuts dim 0."""
    step = -(-dim0 // ranks)
    start = min(rank * step, dim0)
    return start, min(step, dim0 - start)


def stand_in_shape(sizes: Sequence[int], scale: int) -> tuple[int, ...]:
    """A shape of ``numel / scale`` elements, no dimension larger than ``sizes``'s: the
    last dimensions are divided by what they share with ``scale``, dim 0 by the rest
    (rounded up: exact whenever that rest divides dim 0, as for every shard here)."""
    shape: list[int] = []
    rest = scale
    for n in reversed(sizes[1:]):
        common = math.gcd(n, rest) if n else 1
        shape.insert(0, n // common)
        rest //= common
    return (-(-sizes[0] // rest), *shape)


class ShardStandIn:
    """One rank's shard of a global tensor, as DCP sees it (the real chunk), holding a
    tiny tensor in place of its bytes (see the module docstring), made the first time it
    is asked for: planning needs only the chunk."""

    def __init__(
        self,
        size: tuple[int, ...],
        offsets: tuple[int, ...],
        sizes: tuple[int, ...],
        local_shape: tuple[int, ...],
        value: float,
    ) -> None:
        self.global_size = torch.Size(size)
        self.chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        self._local_shape = local_shape
        self._value = value
        self._local: torch.Tensor | None = None

    @property
    def local(self) -> torch.Tensor:
        """The tiny fp32 tensor standing in for the shard, filled with its value."""
        if self._local is None:
            self._local = torch.full(self._local_shape, self._value, dtype=torch.float32)
        return self._local

    def size(self) -> torch.Size:
        """The global tensor's size (what DCP's load planner compares with the metadata)."""
        return self.global_size

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, self.chunk.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=self.chunk,
                    properties=TensorProperties(dtype=torch.float32),
                    size=self.global_size,
                ),
            )
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self.chunk]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self.local


def rank_state(
    model: list[tuple[str, tuple[int, ...]]], ranks: int, rank: int, scale: int, fill: bool
) -> dict[str, Any]:
    """Rank ``rank``'s state dict: a stand-in per tensor, holding ``item_value`` (or 0)."""
    state: dict[str, Any] = {}
    for number, (fqn, shape) in enumerate(model):
        start, rows = shard_rows(shape[0], ranks, rank)
        sizes = (rows, *shape[1:])
        value = float(item_value(number, rank, len(model))) if fill else 0.0
        offsets = (start, *([0] * (len(shape) - 1)))
        state[fqn] = ShardStandIn(shape, offsets, sizes, stand_in_shape(sizes, scale), value)
    return state


def made(state: dict[str, Any]) -> None:
    """Make every stand-in's tensor of ``state``: a rank's tensors exist before it writes."""
    for stand_in in state.values():
        _ = stand_in.local


def rounding(model: list[tuple[str, tuple[int, ...]]], ranks: int, scale: int) -> tuple[int, int]:
    """(items whose stand-in is larger than 1/scale of its shard, the excess in real-size
    bytes: stand-in bytes times ``scale`` minus the shard's), over every rank."""
    items = excess = 0
    for _, shape in model:
        step = -(-shape[0] // ranks)
        full, last = divmod(shape[0], step)  # ranks of ``step`` rows, then one of ``last``
        rows = collections.Counter({step: full, last: int(last > 0)})
        rows[0] += ranks - full - int(last > 0)
        for count, ranks_with in rows.items():
            sizes = (count, *shape[1:])
            extra = 4 * (math.prod(stand_in_shape(sizes, scale)) * scale - math.prod(sizes))
            items += ranks_with * (extra > 0)
            excess += ranks_with * extra
    return items, excess


def item_value(number: int, rank: int, count: int) -> int:
    """A value per (tensor, rank), exact in fp32 for up to 2**24 items."""
    return (rank * count + number) % (1 << 24) + 1


class StandInSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, resolving an item on its :class:`ShardStandIn`."""

    def lookup_object(self, index: MetadataIndex) -> Any:
        return self.state_dict[index.fqn].__get_tensor_shard__(index)


LAYOUTS: dict[str, type[CairnWriter]] = {"ranges": CairnWriter, "per-tensor": PerTensorWriter}
"""``ranges``: what ``CairnWriter`` writes (one object of ranges per rank);
``per-tensor``: the earlier layout (an object per tensor of 1 MiB or more, 8 MiB
bundles, ``bench/per_tensor.py``), for comparison."""


@contextlib.contextmanager
def scaled_knobs(scale: int) -> Iterator[list[str]]:
    """Divide each of :data:`SIZE_KNOBS` by ``scale`` inside the block; yields the knobs
    that were not found (left unscaled)."""
    missing: list[str] = []
    saved: list[tuple[Any, str, int]] = []
    for module_name, name in SIZE_KNOBS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(f"{module_name}.{name}")
            continue
        value = getattr(module, name, None)
        if not isinstance(value, int):
            missing.append(f"{module_name}.{name}")
            continue
        saved.append((module, name, value))
        setattr(module, name, max(1, value // scale))
    try:
        yield missing
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


# -- one simulated save and load --------------------------------------------------------


@dataclass
class Run:
    """What one simulated save and load measured."""

    plan_s: float = 0.0
    write_s: float = 0.0
    finish_s: float = 0.0
    load_plan_s: float = 0.0
    metadata_s: float = 0.0
    read_s: float = 0.0
    total_s: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)
    load_ops: dict[str, int] = field(default_factory=dict)
    items: int = 0
    objects: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    put_estimate: int = 0
    unscaled: list[str] = field(default_factory=list)
    scale: int = 1
    metadata_split: dict[str, float] = field(default_factory=dict)
    incremental: Saved | None = None  # the second save, built on the first (--incremental)


@dataclass
class Saved:
    """What one save of every rank measured, and what the load and census need."""

    plan_s: float = 0.0  # every rank's planning and the coordinator's global plan
    prepare_global_s: float = 0.0  # of it, the writer's prepare_global_plan
    write_s: float = 0.0  # every rank's write_data, one after another
    slowest_write_s: float = 0.0  # the slowest rank's write_data
    finish_s: float = 0.0
    items: int = 0
    uploaded: int = 0  # items uploaded (not carried from a parent)
    puts: int = 0  # store puts during the save


def save_all(
    store: recording.RecordingStore,
    prefix: str,
    model: list[tuple[str, tuple[int, ...]]],
    ranks: int,
    scale: int,
    writer_class: type[CairnWriter],
    incremental: bool = False,
) -> tuple[Saved, Any]:
    """One save of every rank's state, in DCP's order of calls (see the module
    docstring); what it measured, and the id it committed."""
    out = Saved()
    puts = store.ops.get("put", 0)
    writers = [
        writer_class(store, epoch=1, prefix=prefix, incremental=incremental) for _ in range(ranks)
    ]
    start = time.perf_counter()
    local_plans: list[SavePlan] = []
    for rank, writer in enumerate(writers):
        writer.reset()
        planner = StandInSavePlanner()
        state = rank_state(model, ranks, rank, scale, True)
        planner.set_up_planner(state, writer.storage_meta(), rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        local_plans.append(writer.prepare_local_plan(planner.create_local_plan()))
        if rank == 0:
            coordinator, coordinator_state = planner, state
    plans, metadata = coordinator.create_global_plan(local_plans)
    began = time.perf_counter()
    plans = writers[0].prepare_global_plan(plans)
    out.prepare_global_s = time.perf_counter() - began
    out.items = sum(len(p.items) for p in plans)
    del local_plans
    out.plan_s = time.perf_counter() - start
    start = time.perf_counter()
    results: list[list[WriteResult]] = []
    # Each rank writes in a process of its own, whose heap holds its own state and plan,
    # not every rank's: the collector is kept off what exists before the writes.
    gc.freeze()
    for rank, writer in enumerate(writers):
        planner = coordinator if rank == 0 else StandInSavePlanner()
        state = coordinator_state if rank == 0 else rank_state(model, ranks, rank, scale, True)
        made(state)
        if rank:
            planner.set_up_planner(state, writer.storage_meta(), False)
        began = time.perf_counter()
        future = writer.write_data(planner.finish_plan(plans[rank]), planner)
        future.wait()
        out.slowest_write_s = max(out.slowest_write_s, time.perf_counter() - began)
        results.append(future.value())
    out.write_s = time.perf_counter() - start
    gc.unfreeze()  # the coordinator does hold every rank's plan and results in ``finish``
    out.uploaded = uploaded_items(results)
    start = time.perf_counter()
    writers[0].finish(metadata, results)
    out.finish_s = time.perf_counter() - start
    out.puts = store.ops.get("put", 0) - puts
    cid = writers[0].checkpoint_id
    assert cid is not None
    # What dcp.save leaves behind is garbage once it returns; freed here (the planners
    # hold every rank's plan), so that what follows does not walk the save's objects.
    del plans, results, metadata, writers, coordinator, coordinator_state, planner, state
    gc.collect()
    return out, cid


def uploaded_items(results: list[list[WriteResult]]) -> int:
    """Items of ``results`` stored in artifacts of the checkpoint being saved (the others
    were carried from its parent), from each rank's block of records; every item of a
    layout without blocks."""
    own = 0
    for rank_results in results:
        summary = rank_results[0].storage_data if rank_results else None
        if not isinstance(summary, RankItems):
            own += len(rank_results)
            continue
        fresh = {entry.path for _, entry in summary.entries if entry.owner is None}
        encoded = get_codec(CODEC).decompress(
            summary.block, path=summary.operator, size_bytes=summary.block_size
        )
        names, records = msgspec.msgpack.decode(encoded)
        own += sum(1 for record in records if names[record[2]] in fresh)
    return own


def simulate(
    raw: ObjectStore,
    prefix: str,
    ranks: int,
    scale: int,
    writer_class: type[CairnWriter] = CairnWriter,
    split: bool = True,
    incremental: bool = False,
) -> Run:
    """One save of every rank's state through ``writer_class`` and one rank's load of it,
    into ``prefix``; with ``incremental``, then a second save of the same state built on
    the first."""
    out = Run(scale=scale)
    model = tensors()
    store = recording.RecordingStore(as_store(raw))
    began = time.perf_counter()
    with scaled_knobs(scale) as out.unscaled:
        saved, cid = save_all(store, prefix, model, ranks, scale, writer_class)
    out.plan_s, out.write_s, out.finish_s = saved.plan_s, saved.write_s, saved.finish_s
    out.items = saved.items
    out.ops = dict(store.ops)
    load_store = recording.RecordingStore(as_store(raw))
    out.load_plan_s, out.metadata_s, out.read_s = load_one_rank(
        load_store, prefix, str(cid), model, ranks, scale
    )
    out.load_ops = dict(load_store.ops)
    out.total_s = time.perf_counter() - began
    census(raw, CheckpointPaths(prefix), cid, scale, out)
    if split:
        out.metadata_split = metadata_split(as_store(raw), prefix, str(cid), ranks)
    if incremental:
        with scaled_knobs(scale):
            out.incremental, _ = save_all(
                store, prefix, model, ranks, scale, writer_class, incremental=True
            )
    return out


def metadata_split(store: Any, prefix: str, cid: str, ranks: int) -> dict[str, float]:
    """The DCP metadata of ``cid`` in parts, each pickled and unpickled alone: DCP's own
    (every chunk of every tensor, as any storage writer's save has it), cairn's item
    records, and the records ``FileSystemWriter`` would keep for the same items
    (``_StorageInfo(relative_path, offset, length)``); MiB and unpickle seconds of each
    (the median of three)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    reader = CairnReader(store, prefix=prefix, checkpoint_id=cid)
    records = {index: record.stored() for index, record in dcp_support.item_records(reader).items()}
    metadata = with_plain_chunks(reader.read_metadata())  # every chunk, as DCP builds it
    metadata.storage_data = metadata.storage_meta = None
    file_records = {
        index: _StorageInfo(f"__{number % ranks}_0.distcp", record[1], record[2])
        for number, (index, record) in enumerate(records.items())
    }
    split: dict[str, float] = {}
    for name, part in (("dcp", metadata), ("cairn", records), ("fs", file_records)):
        blob = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
        times = []
        for _ in range(3):
            gc.collect()
            start = time.perf_counter()
            pickle.loads(blob)
            times.append(time.perf_counter() - start)
        split[f"{name}_s"] = statistics.median(times)
        split[f"{name}_mib"] = len(blob) / MiB
        del blob
    return split


def load_one_rank(
    store: Any,
    prefix: str,
    cid: str,
    model: list[tuple[str, tuple[int, ...]]],
    ranks: int,
    scale: int,
) -> tuple[float, float, float]:
    """Rank 0's load: seconds of planning (all), of ``read_metadata`` (part of it), and
    of ``read_data``; raises if a value read differs from the one saved."""
    state = rank_state(model, ranks, 0, scale, False)  # the state dict a load fills
    start = time.perf_counter()
    reader = CairnReader(store, prefix=prefix, checkpoint_id=cid)
    reader.reset(cid)
    metadata: Metadata = reader.read_metadata()
    metadata_s = time.perf_counter() - start
    # cairn's SafeLoadPlanner, resolving an item on its stand-in, set up without DCP's
    # _init_state_dict (which materializes meta tensors, and turns stand-ins into None).
    planner = dcp_support.ShardLoadPlanner()
    planner.set_up_planner(state, metadata, True)
    reader.set_up_storage_reader(metadata, True, rank=0, use_collectives=True)
    plan = reader.prepare_local_plan(planner.create_local_plan())
    plan = reader.prepare_global_plan(planner.create_global_plan([plan]))[0]
    plan = planner.finish_plan(plan)
    planned = time.perf_counter() - start
    start = time.perf_counter()
    reader.read_data(plan, planner).wait()
    read = time.perf_counter() - start
    for number, (fqn, _) in enumerate(model):
        local = state[fqn].local
        if local.numel() and not bool((local == item_value(number, 0, len(model))).all()):
            raise AssertionError(f"rank 0 loaded other values for {fqn}")
    return planned, metadata_s, read


def census(raw: ObjectStore, paths: CheckpointPaths, cid: Any, scale: int, out: Run) -> None:
    """Objects and bytes in the checkpoint's directory, by kind, and the PUT estimate."""
    directory = paths.checkpoint_dir(cid)
    root = paths.manifest(cid)
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    estimate = 0
    for chunk in obstore.list(raw, directory, chunk_size=1000):
        for meta in chunk:
            path, size = meta["path"], meta["size"]
            relative = path[len(directory) :]
            if path == root:
                kind = "manifest"
            elif paths.is_manifest_part(relative):
                kind = "sub-manifest"  # a part of a manifest of more than 4,096 entries
            elif relative.startswith("operators/rank-"):
                kind = "data"
                size *= scale
            else:
                kind = "other"  # DCP's metadata object, an intent
            counts[kind] = counts.get(kind, 0) + 1
            sizes[kind] = sizes.get(kind, 0) + size
            estimate += 1 if size <= OBSTORE_PART else 2 + -(-size // OBSTORE_PART)
    out.objects, out.bytes = counts, sizes
    # The requests outside the directory (_writer check, _latest) are puts as they were.
    out.put_estimate = estimate + out.ops.get("put", 0) - sum(counts.values())


# -- stores and the report ---------------------------------------------------------------


def summarize(store: str, layout: str, ranks: int, runs: list[Run]) -> dict[str, Any]:
    """The report row of ``runs`` (counts from the first, times as medians)."""
    first = runs[0]
    rounded = rounding(tensors(), ranks, first.scale)
    med = {k: statistics.median(getattr(r, k) for r in runs) for k in TIMES}
    return {
        "store": store,
        "layout": layout,
        "ranks": ranks,
        "reps": len(runs),
        "items": first.items,
        "objects": sum(first.objects.values()),
        "objects_by_kind": first.objects,
        "bytes_by_kind": first.bytes,
        "put_requests": first.ops.get("put", 0),
        "put_estimate": first.put_estimate,
        "save_requests": first.ops,
        "load_requests": first.load_ops,
        "manifest_bytes": first.bytes.get("manifest", 0),
        "sub_manifest_bytes": first.bytes.get("sub-manifest"),
        "metadata_bytes": first.bytes.get("other", 0),
        "unscaled_knobs": first.unscaled,
        "rounded_items": rounded[0],
        "rounded_excess_bytes": rounded[1],
        **{f"median_{k}": v for k, v in med.items()},
        "metadata_split": first.metadata_split,
        "finish_s": [r.finish_s for r in runs],
        "load_plan_s": [r.load_plan_s for r in runs],
        "incremental": _incremental_row(runs),
    }


def _incremental_row(runs: list[Run]) -> dict[str, Any] | None:
    """Medians of the incremental saves of ``runs`` (counts from the first); None if none."""
    saves = [r.incremental for r in runs if r.incremental is not None]
    if not saves:
        return None
    times = ("prepare_global_s", "slowest_write_s", "write_s", "finish_s")
    return {
        "items": saves[0].items,
        "uploaded": saves[0].uploaded,
        "puts": saves[0].puts,
        **{f"median_{k}": statistics.median(getattr(r, k) for r in saves) for k in times},
    }


def targets(row: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(what, target, measured, met) for the 1,024-rank targets."""
    ranks = row["ranks"]
    return [
        ("objects", TARGETS["objects"], f"{row['objects']:,}", row["objects"] <= ranks + 4),
        (
            "root manifest",
            TARGETS["manifest"],
            f"{row['manifest_bytes'] / MiB:.2f} MiB",
            row["manifest_bytes"] <= MiB,
        ),
        (
            "finish",
            TARGETS["finish"],
            f"{row['median_finish_s']:.2f} s",
            row["median_finish_s"] <= 2.0,
        ),
        (
            "load plan, one rank",
            TARGETS["load plan"],
            f"{row['median_load_plan_s']:.2f} s",
            row["median_load_plan_s"] <= 1.0,
        ),
    ]


def _split_cell(split: dict[str, float], part: str) -> str:
    return f"{split[f'{part}_s']:.2f} s, {split[f'{part}_mib']:.1f}"


def print_tables(rows: list[dict[str, Any]]) -> None:
    sub = any(r["sub_manifest_bytes"] is not None for r in rows)
    headers = [
        "store",
        "layout",
        "ranks",
        "items",
        "objects",
        "PUT requests",
        "PUT est.",
        "manifest MiB",
        *(["sub-manifests MiB"] if sub else []),
        "metadata MiB",
        "plan s",
        "write s",
        "finish s",
        "load plan s",
        "of it metadata s",
        "read s",
        "total s",
    ]
    body = [
        [
            r["store"],
            r["layout"],
            f"{r['ranks']:,}",
            f"{r['items']:,}",
            f"{r['objects']:,}",
            f"{r['put_requests']:,}",
            f"{r['put_estimate']:,}",
            f"{r['manifest_bytes'] / MiB:.2f}",
            *([f"{(r['sub_manifest_bytes'] or 0) / MiB:.2f}"] if sub else []),
            f"{r['metadata_bytes'] / MiB:.2f}",
            f"{r['median_plan_s']:.2f}",
            f"{r['median_write_s']:.2f}",
            f"{r['median_finish_s']:.2f}",
            f"{r['median_load_plan_s']:.2f}",
            f"{r['median_metadata_s']:.2f}",
            f"{r['median_read_s']:.2f}",
            f"{r['median_total_s']:.1f}",
        ]
        for r in rows
    ]
    print(table(headers, body))
    split_rows = [
        [
            r["store"],
            r["layout"],
            f"{r['ranks']:,}",
            *(_split_cell(r["metadata_split"], part) for part in ("dcp", "cairn", "fs")),
        ]
        for r in rows
        if r["metadata_split"]
    ]
    if split_rows:
        print(
            "\nThe DCP metadata as one pickle would hold it, in parts, each unpickled alone "
            "(s) and its size\n(MiB): DCP's own chunks of every tensor, cairn's item "
            "records, and FileSystemWriter's records\nof the same items."
        )
        headers = ["store", "layout", "ranks", "DCP's own", "cairn records", "FS records"]
        print(table(headers, split_rows))
    incremental = [r for r in rows if r["incremental"]]
    if incremental:
        print(
            "\nA second save of the same state, incremental=True (built on the first): the "
            "coordinator's\nprepare_global_plan (it opens the parent), the slowest rank's "
            "write_data (it reads the\nparent's records of its items and hashes them), all "
            "ranks' write_data one after another, finish."
        )
        headers = ["store", "layout", "ranks", "items", "uploaded", "PUT requests"]
        headers += ["prepare_global s", "slowest rank s", "write s", "finish s"]
        inc_rows = [
            [
                r["store"],
                r["layout"],
                f"{r['ranks']:,}",
                f"{i['items']:,}",
                f"{i['uploaded']:,}",
                f"{i['puts']:,}",
                f"{i['median_prepare_global_s']:.2f}",
                f"{i['median_slowest_write_s']:.2f}",
                f"{i['median_write_s']:.2f}",
                f"{i['median_finish_s']:.2f}",
            ]
            for r in incremental
            for i in [r["incremental"]]
        ]
        print(table(headers, inc_rows))
    at_target = [r for r in rows if r["ranks"] == TARGET_RANKS and r["layout"] == "ranges"]
    print()
    if not at_target:
        print(f"targets at {TARGET_RANKS:,} ranks: not measured (add {TARGET_RANKS} to --ranks)")
    for r in at_target:
        print(f"targets at {TARGET_RANKS:,} ranks, {r['store']}:")
        checks = [[w, t, m, "yes" if ok else "MISSED"] for w, t, m, ok in targets(r)]
        print(table(["what", "target", "measured", "ok"], checks))
    for r in rows:
        if r["rounded_items"]:
            data = r["bytes_by_kind"].get("data", 0)
            print(
                f"\n{r['store']} {r['ranks']:,}: {r['rounded_items']:,} stand-ins rounded up "
                f"to one element: +{r['rounded_excess_bytes'] / MiB:,.0f} MiB at real size "
                f"({100 * r['rounded_excess_bytes'] / max(data, 1):.2f}% of the data), "
                "which may add bundles"
            )
        if r["unscaled_knobs"]:
            print(
                f"\n{r['store']} {r['ranks']}: unscaled knobs {r['unscaled_knobs']}: object "
                "counts are those of the tiny payloads"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--ranks",
        default="8,64",
        help="rank counts, comma-separated (default 8,64; the targets are checked at 1024)",
    )
    parser.add_argument("--stores", default="memory,s3", help="memory and/or s3 (moto)")
    parser.add_argument(
        "--layouts",
        default="ranges",
        help="ranges (what the writer writes) and/or per-tensor (the earlier layout)",
    )
    parser.add_argument("--reps", type=int, default=3, help="saves per size (median times)")
    parser.add_argument(
        "--scale",
        type=int,
        default=4096,
        help="payload shrink factor (default 4096: exact object counts)",
    )
    parser.add_argument(
        "--skip-dcp-plan-check",
        action="store_true",
        help="skip DCP's own check of the global save plan (quadratic in ranks for a tensor "
        "sharded along a dimension shorter than another: hours at 4,096 ranks)",
    )
    parser.add_argument(
        "--no-split",
        action="store_true",
        help="skip the table of what the metadata would cost pickled whole (minutes of "
        "unpickling from 1,024 ranks on)",
    )
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="after each save, save the same state again with incremental=True (all carried)",
    )
    parser.add_argument("--quick", action="store_true", help="8 ranks, memory, one save")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    args = parser.parse_args()
    ranks = [8] if args.quick else [int(n) for n in args.ranks.split(",") if n.strip()]
    stores = ["memory"] if args.quick else [s.strip() for s in args.stores.split(",")]
    reps = 1 if args.quick else args.reps
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    if set(layouts) - set(LAYOUTS):
        parser.error(f"unknown layout(s) in {layouts}: choose {', '.join(LAYOUTS)}")
    if set(stores) - {"memory", "s3"}:
        parser.error(f"unknown store(s) in {stores}: choose memory, s3")
    if args.scale < 1 or any(n < 1 for n in ranks):
        parser.error("--scale and every rank count must be >= 1")
    if args.skip_dcp_plan_check:  # DCP's check, not cairn's code: what it costs is DCP's
        default_planner._validate_global_plan = lambda *_: []
    rows: list[dict[str, Any]] = []
    counter = itertools.count()
    for kind in stores:
        with memory_or_moto_store(kind, "cairn-bench-ranks") as raw:
            for n, layout in itertools.product(ranks, layouts):
                runs = []
                for rep in range(reps):
                    began = time.perf_counter()
                    prefix = f"run-{next(counter)}/"
                    writer = LAYOUTS[layout]
                    split, incremental = not args.no_split, args.incremental
                    runs.append(simulate(raw, prefix, n, args.scale, writer, split, incremental))
                    print(
                        f"{kind} {layout} {n} ranks, save {rep + 1}/{reps}: "
                        f"{time.perf_counter() - began:.1f}s",
                        file=sys.stderr,
                        flush=True,
                    )
                rows.append(summarize(kind, layout, n, runs))
    print_tables(rows)
    emit_json({"scale": args.scale, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
