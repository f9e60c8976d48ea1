"""``SafeLoadPlanner``: DCP's default load planner, without unpickling arbitrary objects.

DCP saves every value of a state dict that is not a tensor (a step count, a learning
rate schedule, a dict of settings) as a *byte item*: ``torch.save`` of the value. On
load, ``DefaultLoadPlanner.load_bytes`` turns it back with
``torch.load(value, weights_only=False)``: a full unpickle, which runs whatever code
the bytes name. Whoever can write the store can therefore run code in every process
that loads the checkpoint. Digests do not help (they are as writable as the bytes);
signed checkpoints (:mod:`cairn.format.signing`) do, for readers given the key.

Invariants:

* :class:`SafeLoadPlanner` unpickles a byte item only with ``weights_only=True``:
  tensors, primitive values, lists, tuples, dicts and the globals allowlisted with
  ``torch.serialization.add_safe_globals``; anything else is refused with
  ``pickle.UnpicklingError`` naming the item, before any of its code runs;
* :class:`~cairn.torch.CairnReader` hands a byte item to any other planner only after
  it passed the same weights-only load (:func:`check_byte_item`), so no planner loading
  through cairn unpickles arbitrary objects;
* against a chunk table (:mod:`cairn.torch._tableread`), its plan has the read items
  DCP's default planner makes (storage positions included; their order within a tensor
  may differ when DCP's sweep would choose another dimension): it only hands DCP's
  planner, for each tensor, the saved chunks that overlap this rank's.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import re
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

# DCP's own way to list a value's local chunks (tensor, DTensor, ShardedTensor, or an
# object with ``__create_chunk_list__``); private, so a torch change shows in the tests.
from torch.distributed.checkpoint.planner_helpers import _create_chunk_list

from cairn.torch._tableread import ChunkList, has_table, overlapping

__all__ = ["SafeLoadPlanner", "check_byte_item", "load_byte_item", "unpickles_safely"]


def load_byte_item(read_item: ReadItem, value: io.BytesIO) -> Any:
    """The value of a byte item, unpickled with ``weights_only=True``.

    Raises ``pickle.UnpicklingError`` naming the item for anything the weights-only
    unpickler refuses (a global that is not allowlisted): nothing of it runs.
    """
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message is pages long, and advises weights_only=False: keep its reason.
        found = re.search(r"WeightsUnpickler error: ([^\n]*)", str(exc))
        reason = found.group(1) if found else str(exc).strip().split("\n")[0]
        raise pickle.UnpicklingError(
            f"refused to unpickle DCP byte item {read_item.dest_index.fqn!r}: it is not "
            "made of tensors and plain values only, and unpickling it could run any code "
            f"its writer chose ({reason})"
        ) from None


def check_byte_item(read_item: ReadItem, data: bytes) -> None:
    """Raise ``pickle.UnpicklingError`` unless ``data`` loads with ``weights_only=True``."""
    load_byte_item(read_item, io.BytesIO(data))


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose byte items are unpickled with ``weights_only=True``.

    Use it with every ``dcp.load`` of a checkpoint you did not write yourself::

        dcp.load(state, storage_reader=CairnReader(store), planner=SafeLoadPlanner())

    Its arguments are ``DefaultLoadPlanner``'s. Tensors load as with the default planner;
    a byte item holding anything but tensors and plain values (or the classes allowlisted
    with ``torch.serialization.add_safe_globals``) raises ``pickle.UnpicklingError``
    naming the item, and none of its code runs. :func:`cairn.torch.load_latest` uses it
    unless given another planner.

    Against a checkpoint whose metadata is a chunk table (every uncompressed save
    through :class:`~cairn.torch.CairnWriter`), it also plans faster than DCP's default
    planner, with the same result: each tensor's saved chunks are first narrowed to
    those this rank's chunks overlap (:meth:`create_local_plan`).
    """

    def create_local_plan(self) -> LoadPlan:
        """DCP's default local plan. Against metadata stored as a chunk table
        (docs/format.md, "DCP checkpoints"), each tensor's chunks are first narrowed to those
        this rank's chunks overlap, all tensors in one vectorized pass, so planning
        takes time in proportion to this rank's items, not to every rank's."""
        metadata = self.metadata
        if metadata is None:
            return super().create_local_plan()
        narrowed = _narrowed(metadata, self.state_dict)
        if narrowed is None:
            return super().create_local_plan()
        view, positions = narrowed
        self.metadata = view
        try:
            plan = super().create_local_plan()
        finally:
            self.metadata = metadata
        return dataclasses.replace(plan, items=[_renumbered(i, positions) for i in plan.items])

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Unpickle the byte item with ``weights_only=True`` into the state dict."""
        loaded = load_byte_item(read_item, value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _narrowed(
    metadata: Metadata, state_dict: dict[str, Any]
) -> tuple[Metadata, dict[str, list[int]]] | None:
    """``metadata`` with each tensor of ``state_dict`` given only the saved chunks its
    local chunks overlap, and those chunks' positions in the full list, per tensor; None
    when ``metadata`` has no chunk table."""
    if not has_table(metadata):
        return None
    described = dict(metadata.state_dict_metadata)
    queries: list[tuple[str, ChunkList, ChunkStorageMetadata]] = []
    for fqn, value in state_dict.items():
        md = described.get(fqn)
        if not isinstance(md, TensorStorageMetadata) or not isinstance(md.chunks, ChunkList):
            continue
        try:
            local = _create_chunk_list(value)
        except ValueError:
            continue  # not a tensor: DCP's planner says what is wrong with it
        queries += [(fqn, md.chunks, chunk) for chunk in local]
    found: dict[str, set[int]] = {}
    matches = overlapping([(saved, chunk) for _, saved, chunk in queries])
    for (fqn, _, _), positions_of in zip(queries, matches, strict=True):
        found.setdefault(fqn, set()).update(positions_of)
    positions: dict[str, list[int]] = {}
    for fqn, hits in found.items():
        md = described[fqn]
        assert isinstance(md, TensorStorageMetadata)
        assert isinstance(md.chunks, ChunkList)
        positions[fqn] = sorted(hits)
        chunks = [md.chunks.chunk(n) for n in positions[fqn]]
        described[fqn] = TensorStorageMetadata(md.properties, md.size, chunks)
    return dataclasses.replace(metadata, state_dict_metadata=described), positions


def _renumbered(item: ReadItem, positions: dict[str, list[int]]) -> ReadItem:
    """``item`` planned against narrowed chunks, its storage index naming the chunk's
    position in the full list."""
    index = item.storage_index
    found = positions.get(index.fqn)
    if found is None or index.index is None:
        return item
    full = MetadataIndex(index.fqn, index.offset, found[index.index])
    return ReadItem(
        item.type, item.dest_index, item.dest_offsets, full, item.storage_offsets, item.lengths
    )


def unpickles_safely(planner: LoadPlanner) -> bool:
    """True when ``planner`` loads byte items with :class:`SafeLoadPlanner`'s own method."""
    return getattr(type(planner), "load_bytes", None) is SafeLoadPlanner.load_bytes
