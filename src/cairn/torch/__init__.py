"""PyTorch Distributed Checkpoint (DCP) on cairn: atomic, verified, collectable saves.

Install with ``pip install 'cairn-checkpoint[torch]'`` (torch and numpy). Then::

    import torch.distributed.checkpoint as dcp
    from cairn.torch import CairnReader, CairnWriter, SafeLoadPlanner, load_latest

    dcp.save(state_dict, storage_writer=CairnWriter("s3://bucket/run", epoch=step))
    dcp.load(
        state_dict,
        storage_reader=CairnReader("s3://bucket/run"),
        planner=SafeLoadPlanner(),  # byte items: weights_only=True, never arbitrary code
    )
    load_latest(state_dict, "s3://bucket/run")  # the same, falling back past damage

``checkpoint_id`` as torchtitan and torchtune pass it (``dcp.save(state,
checkpoint_id=f"{folder}/step-{n}", storage_writer=writer)``): a checkpoint id is that
checkpoint; anything else is a *name* (``step-100``, or a path or URL inside the writer's
store, which keeps the part below the store's root), recorded in the manifest of a new
checkpoint (a fresh id), and a load by that name loads the newest committed checkpoint
with it. A path or URL outside the store is refused (:class:`~cairn.CheckpointLocationError`).
The whole mapping is in docs/pytorch.md.

In and out of DCP's own format: :func:`export_dcp` writes a DCP checkpoint as a
directory that ``FileSystemReader`` and ``dcp_to_torch_save`` read, every byte verified;
:func:`import_dcp` commits a directory ``FileSystemWriter`` wrote as one checkpoint,
checked on the way in (what can and cannot be checked: :func:`import_dcp`). ``cairn
export-dcp`` and ``cairn import-dcp`` are the same on the command line.

Hugging Face safetensors: :func:`export_hf` streams a DCP checkpoint as
``model-0000k-of-0000n.safetensors`` shards and ``model.safetensors.index.json`` into any
store, every byte verified on the way out; :func:`import_hf` commits a safetensors
directory as a DCP checkpoint that loads resharded (see the guide, "safetensors on the
object store"). ``cairn export-hf`` and ``cairn import-hf`` on the
command line.

Incremental saves: ``CairnWriter(..., incremental=True)`` builds on the latest DCP
checkpoint (or ``parent=``) and carries by reference every item whose bytes (SHA-256),
dtype and shape equal the parent's item of the same key, instead of uploading it; GC,
``dependents`` and copies see what it carries.

Pass ``signing_key=`` to the writer and the reader (or ``load_latest``) for signed
checkpoints (see :mod:`cairn.format.signing`): a reader with the key refuses, or passes over
when choosing the latest, a checkpoint that someone without the key wrote.

``dcp.async_save`` works with either executor: in process mode the writer is pickled
into DCP's background process (its configuration travels; the store connection is made
again there, so the store must not be a memory store). In thread mode the save's
collectives run beside the training's: give checkpoints a process group of their own
(``process_group=dist.new_group(backend="gloo")``), as DCP advises, or a DDP step and a
save can wait on each other forever.

One ``dcp.save`` is one cairn checkpoint (one id, one manifest), so ``cairn
list/show/verify/restore/copy/gc``, retention, fencing and ``load_latest`` work on it
unchanged. Every rank uploads its items as objects of ranges
(:mod:`cairn.format.ranges`: a few of 16 MiB for a rank of small tensors, else one per
rank) while holding the checkpoint's lease; DCP's coordinator
stores DCP's metadata with every item's record and commits the manifest
(:class:`CairnWriter`); a load reads the metadata, verified, then only the records and
the byte ranges of the items a rank needs (:class:`CairnReader`). The layout is
specified in docs/format.md, section "DCP checkpoints".

Invariants:

* nothing of a save is visible until the coordinator's manifest write; if any rank
  fails or is killed, or the coordinator is fenced, no manifest is written, ``_latest``
  does not move, and what was uploaded is an uncommitted directory that GC sweeps once
  its lease has lapsed;
* every byte DCP receives was checked against a SHA-256 recorded at save time: the
  metadata against the manifest, each item against its record (itself inside the
  verified metadata). A mismatch raises :class:`~cairn.IntegrityMismatchError` naming
  the artifact (and the item, or the block of records); DCP reports it inside its
  ``CheckpointException``
  (except from ``read_metadata``, whose every exception DCP turns into an
  ``AssertionError`` carrying cairn's message; called directly it raises cairn's error);
* a checkpoint whose shard turns out damaged while DCP reads it fails that load
  (nothing unverified reaches the state); :func:`load_latest` then loads the next
  older checkpoint, every rank alike;
* all ranks of a load read the same checkpoint: without a ``checkpoint_id`` each rank
  chooses the latest, and a load whose ranks chose differently is refused;
* the metadata is never unpickled before it is verified, nor with any global outside
  DCP's metadata types;
* a byte item (a value that is not a tensor, which DCP stores pickled and whose default
  planner unpickles with ``weights_only=False``, running whatever code it names) reaches
  a planner only if it unpickles with ``weights_only=True``
  (:class:`~cairn.torch.SafeLoadPlanner`);
* memory during a save is bounded by the concurrency, not by the state: contiguous CPU
  tensors are sent from their own memory, small items a coalesced chunk at a time, and
  a tensor that must be copied (from a device, or to make them contiguous) is copied
  when the upload reaches it, with a bounded number resolved ahead (a compressed item
  is held as its frame from then on); a load holds at most
  ``max_concurrent_downloads`` spans.

Not supported, and refused with :class:`~cairn.InvalidInputError`: ``dcp.save`` with
``use_collectives=False`` (there would be no single commit) and planners that cache
plans across saves (each save needs its own checkpoint id in the plan).
"""

# ruff: noqa: E402 (the imports after the check of the extra need it)
from __future__ import annotations

from cairn.errors import MissingExtraError

# DCP needs numpy for its object gathers, and the item tables are zstd-compressed: without
# them a save fails deep inside every rank, so say it once, here.
MissingExtraError.require("cairn.torch", "torch", ("torch", "numpy", "zstandard"))

from cairn.torch._dcpdir import (
    ExportedDcp,
    ImportedDcp,
    export_dcp,
    export_dcp_async,
    import_dcp,
    import_dcp_async,
)
from cairn.torch._format import METADATA_OPERATOR, rank_operator
from cairn.torch._hf import export_hf, import_hf
from cairn.torch._hfexport import ExportedHf, export_hf_async, under_prefix
from cairn.torch._hfimport import ImportedHf, import_hf_async
from cairn.torch._latest import load_latest
from cairn.torch._planner import SafeLoadPlanner
from cairn.torch._reader import CairnReader
from cairn.torch._target import interpret as interpret_checkpoint_id
from cairn.torch._writer import CairnWriter

__all__ = [
    "METADATA_OPERATOR",
    "CairnReader",
    "CairnWriter",
    "ExportedDcp",
    "ExportedHf",
    "ImportedDcp",
    "ImportedHf",
    "SafeLoadPlanner",
    "export_dcp",
    "export_dcp_async",
    "export_hf",
    "export_hf_async",
    "import_dcp",
    "import_dcp_async",
    "import_hf",
    "import_hf_async",
    "interpret_checkpoint_id",
    "load_latest",
    "rank_operator",
    "under_prefix",
]
