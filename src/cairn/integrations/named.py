"""Named checkpoints for training frameworks: save under a name, find by name, retire by name.

A training framework names what it saves (Lightning: ``epoch=2-step=300.ckpt``,
``last.ckpt``; Hugging Face's ``Trainer``: ``checkpoint-500``) and expects a second save
under a name to replace the first. In cairn every save is a new checkpoint with a fresh
id, whose manifest records the name (as a DCP ``checkpoint_id`` name does, see
:mod:`cairn.torch`); a read by name reads the newest committed checkpoint with it.
This module is what :mod:`cairn.lightning` and :mod:`cairn.hf` share:

* :func:`save_named` commits one checkpoint under a name: byte artifacts, or directories
  saved file by file, optionally building on a parent whose unchanged files are carried
  by reference instead of uploaded;
* :func:`named_ids` lists the committed checkpoints of one name, newest first;
  :func:`checkpoint_names` lists every name;
* :func:`retire_named` deletes the checkpoints of one name through
  :meth:`~cairn.ObjectStoreCheckpointer.delete_checkpoint`, so a checkpoint that another
  one builds on (a later save carries its files) is kept, and reported, never broken.

Invariants: a save commits by the commit protocol of any other save (nothing is visible
before its manifest, which names every byte it needs); nothing here deletes a checkpoint
that :meth:`~cairn.ObjectStoreCheckpointer.dependents` names, nor one in ``keep``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.data import ArtifactKey, DirectoryCheck
from cairn.data.inputs import ArtifactData
from cairn.errors import CheckpointInUseError
from cairn.format.ids import CheckpointId
from cairn.format.layout import validate_checkpoint_name
from cairn.format.manifest import CheckpointManifest
from cairn.integrations._interface import (
    assemble_manifest,
    begin,
    named_candidates,
)
from cairn.integrations._interface import (
    checkpoint_names as _names,
)

__all__ = ["checkpoint_names", "named_ids", "retire_named", "save_named"]

log = logging.getLogger("cairn")


async def save_named(
    ckpt: ObjectStoreCheckpointer,
    name: str,
    *,
    epoch: int,
    snapshots: Mapping[ArtifactKey, ArtifactData] | None = None,
    directories: Mapping[ArtifactKey, str | os.PathLike[str]] | None = None,
    parent_id: CheckpointId | None = None,
    directory_check: DirectoryCheck = "hash",
) -> CheckpointManifest:
    """Commit one checkpoint named ``name``, as :meth:`~cairn.ObjectStoreCheckpointer.save`
    commits, with a fresh id.

    Args:
        ckpt: The checkpointer to save through.
        name: The checkpoint name (:func:`~cairn.format.layout.validate_checkpoint_name`).
        epoch: The epoch (training step) the manifest records, >= 0.
        snapshots: ``(operator, partition)`` to bytes-like data, each one artifact.
        directories: ``(operator, partition)`` to a local directory saved file by file.
        parent_id: A committed checkpoint to build on: a file its directory partition
            of the same key holds is carried by reference instead of uploaded. None: a
            full save.
        directory_check: How an unchanged file is told, as
            :attr:`cairn.CheckpointData.directory_check` (``"hash"``, the default here,
            reads every file: a framework writes each save's files anew, so their
            modification times always differ).

    Returns:
        The committed manifest.

    Raises:
        InvalidNameError: ``name`` is not a usable checkpoint name.
        InvalidInputError: A directory is missing, or another argument is wrong.
        FencedError: A newer writer generation took over the store.
    """
    validate_checkpoint_name(name)
    cid = CheckpointId.now()
    async with await begin(ckpt, cid, parent_id) as save:
        entries = await save.upload(
            [(op, p, False, data) for (op, p), data in (snapshots or {}).items()]
        )
        listed = await save.upload_directories(directories or {}, check=directory_check)
        manifest = assemble_manifest(
            cid,
            epoch,
            entries,
            parent_id=parent_id,
            writer_generation=ckpt.writer_generation,
            name=name,
            directories=listed,
        )
        return await save.commit(manifest)


async def named_ids(ckpt: ObjectStoreCheckpointer, name: str) -> list[CheckpointId]:
    """The committed checkpoints named ``name`` that the writer record admits, newest first.

    Args:
        ckpt: The checkpointer to read through.
        name: The checkpoint name.

    Returns:
        Their ids (empty when there is none). Reads every manifest's header once.
    """
    return [cid async for cid in named_candidates(ckpt, name)]


async def checkpoint_names(ckpt: ObjectStoreCheckpointer) -> list[str]:
    """The names the committed checkpoints carry.

    Args:
        ckpt: The checkpointer to read through.

    Returns:
        Each name once, sorted.
    """
    return await _names(ckpt)


async def retire_named(
    ckpt: ObjectStoreCheckpointer, name: str, *, keep: Collection[CheckpointId] = ()
) -> list[CheckpointId]:
    """Delete the committed checkpoints named ``name``, but those in ``keep`` and those
    that others build on.

    Each goes through :meth:`~cairn.ObjectStoreCheckpointer.delete_checkpoint` (never
    forced): one that a later checkpoint or a save in progress needs is kept, with a
    warning that names what needs it.

    Args:
        ckpt: The checkpointer to delete through.
        name: The checkpoint name.
        keep: Checkpoints never to delete (the one a run resumed from, the newest).

    Returns:
        The ids deleted.
    """
    deleted: list[CheckpointId] = []
    for cid in await named_ids(ckpt, name):
        if cid in keep:
            continue
        try:
            await ckpt.delete_checkpoint(cid)
        except CheckpointInUseError as exc:
            log.warning("kept checkpoint %s named %r: %s", cid, name, exc)
            continue
        deleted.append(cid)
    return deleted
