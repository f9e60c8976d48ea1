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
The whole mapping is in :mod:`cairn.torch._target`.

In and out of DCP's own format: :func:`export_dcp` writes a DCP checkpoint as a
directory that ``FileSystemReader`` and ``dcp_to_torch_save`` read, every byte verified;
:func:`import_dcp` commits a directory ``FileSystemWriter`` wrote as one checkpoint,
checked on the way in (see :mod:`cairn.torch._dcpdir` for what can and cannot be
checked). ``cairn export-dcp`` and ``cairn import-dcp`` are the same on the command line.

Incremental saves: ``CairnWriter(..., incremental=True)`` builds on the latest DCP
checkpoint (or ``parent=``) and carries by reference every item whose bytes (SHA-256),
dtype and shape equal the parent's item of the same key, instead of uploading it; the
manifest names the parent and lists the parent's artifacts it carries with their
``owner`` and the bytes of them it uses, so GC (which reports what a partly carried
object keeps), ``dependents`` and copies see them. Each rank reads the parent's
records of its own items, the coordinator only the parent's manifest and chunk table
(see :mod:`cairn.torch._carry`).

Pass ``signing_key=`` to the writer and the reader (or ``load_latest``) for signed
checkpoints (see :mod:`cairn.format.signing`): a reader with the key refuses, or passes over
when choosing the latest, a checkpoint that someone without the key wrote.

``dcp.async_save`` works with either executor: in process mode the writer is pickled
into DCP's background process (its configuration travels; the store connection is made
again there, so the store must not be a memory store). In thread mode the save's
collectives run beside the training's: give checkpoints a process group of their own
(``process_group=dist.new_group(backend="gloo")``), as DCP advises, or a DDP step and a
save can wait on each other forever.

How a save maps onto cairn. One ``dcp.save`` is one cairn checkpoint (one id, one
manifest), so ``cairn list/show/verify/restore/copy/gc``, retention, fencing and
``load_latest`` work on it unchanged:

1. **Planning** (``prepare_global_plan``, on DCP's coordinator): makes the checkpoint id
   (a UUIDv7, or the ``checkpoint_id`` given to ``dcp.save`` when it is one) and sends it,
   with the checkpoint's name if it has one, to every rank inside its plan, so all ranks
   agree without another collective. It refuses the save
   before anything is uploaded if a newer writer generation has taken over
   (:class:`~cairn.FencedError`) or the id is already committed.
2. **Uploads** (``write_data``, every rank, as a worker of :mod:`cairn.integrations.distributed`):
   rank ``r`` stores its items as artifacts ``operators/rank-{r}/partition-{n}.snap``
   with :meth:`~cairn.ObjectStoreCheckpointer.save_partitions_concurrent`, which holds
   the checkpoint's lease (GC leaves a save in progress alone). A rank's items are one
   object of ranges (:mod:`cairn.format.ranges`, :mod:`cairn.torch._rankobject`):
   ``partition-{n}``, one multipart upload of the items' bytes end to end followed by
   their index, and one more object per 16 GiB beyond the first. Each item is resolved
   as the upload reaches it and hashed once; a contiguous CPU tensor is sent from its
   own memory, small items are coalesced into 8 MiB chunks. A checkpoint then has one
   data object per rank, plus the metadata and the manifest, however many tensors it
   holds. With ``compression=`` the layout is the same, each item compressed on its
   own as one zstd frame (hashed before it is compressed), so that it is still read
   alone. Each item's record (artifact, byte range, SHA-256, dtype, shape, and the
   frame's length when compressed) goes back to the coordinator: the rank encodes all
   of its records as one *block*, and its chunks' offsets and sizes as packed rows
   (:mod:`cairn.torch._itemtable`).
3. **Commit** (``finish``, on the coordinator): uploads DCP's metadata as the artifact
   ``operators/dcp-metadata/partition-0.snap``, an object of ranges: range 0 is DCP's
   ``Metadata`` with each tensor's chunk list replaced by one *chunk table* (every
   chunk's offsets, sizes and the block of its record, one packed array,
   zstd-compressed), then one range per rank's block (compressed by its rank); the
   coordinator's work grows with ranks and tensors, not items. (An import, and
   checkpoints of earlier versions, keep the ``Metadata`` pickled whole with every
   record in its ``storage_data``, as DCP's own writers store theirs; earlier
   compressed saves kept an object per tensor of 1 MiB or more and bundles, each
   compressed whole. Both still load.) Then it commits one manifest
   naming every rank's artifacts and the metadata, with their sizes and SHA-256, through
   :meth:`~cairn.ObjectStoreCheckpointer.commit`: every artifact is checked present,
   the manifest is written create-only (the commit point), the lease ends and
   ``_latest`` advances (or the commit is rolled back if the writer was fenced).

How a load reads. ``read_metadata`` loads the manifest (checked), reads the metadata
(with a chunk table: the index and range 0 only), checks its SHA-256 against the manifest
and only then unpickles it, allowing only the globals DCP's metadata is made of. Each
tensor's chunks are then a sequence over its rows of the table: DCP's own planner sees
its usual chunk objects, and :class:`~cairn.torch.SafeLoadPlanner` first narrows them to
those the rank's chunks overlap, in one vectorized pass, so a rank's planning takes time
in its own items (at 1,024 ranks of a 70B model, 2.2 million saved chunks, a fraction of
a second). ``read_data`` first reads the blocks holding the records of the items it
needs (a rank loading what it saved reads its own block), then groups the items a rank needs
by artifact and into spans of nearby items of at most 16 MiB, reads one byte range
per span (an artifact compressed whole, once), decodes each compressed item alone in
memory bounded by its recorded length, checks each item's SHA-256 against its record,
and only then copies it
into the state dict (a tensor of the right shape and dtype is filled straight from the
store's buffer). Resharding is DCP's: a rank reads whichever saved chunks overlap its own.

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
  (:class:`~cairn.torch.SafeLoadPlanner`, see :mod:`cairn.torch._planner`);
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

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cairn.torch needs PyTorch and numpy: pip install 'cairn-checkpoint[torch]' "
        "(or pip install 'torch>=2.9,<2.16' numpy)"
    ) from exc

from cairn.torch._dcpdir import (
    ExportedDcp,
    ImportedDcp,
    export_dcp,
    export_dcp_async,
    import_dcp,
    import_dcp_async,
)
from cairn.torch._format import METADATA_OPERATOR, rank_operator
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
    "ImportedDcp",
    "SafeLoadPlanner",
    "export_dcp",
    "export_dcp_async",
    "import_dcp",
    "import_dcp_async",
    "interpret_checkpoint_id",
    "load_latest",
    "rank_operator",
]
