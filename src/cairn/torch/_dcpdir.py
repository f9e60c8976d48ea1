"""In and out of DCP's own directory format: :func:`export_dcp` and :func:`import_dcp`.

The format is the one ``torch.distributed.checkpoint.FileSystemWriter`` writes and
``FileSystemReader`` reads (:mod:`cairn.torch._dcpfiles`, which also says what an import
checks and what it cannot see). **Export** (:mod:`cairn.torch._dcpexport`) writes a
cairn DCP checkpoint as such a directory, every byte verified on the way out and read
back once written; the directory appears whole or not at all. **Import**
(:mod:`cairn.torch._dcpimport`) commits such a directory as one cairn checkpoint that
:class:`~cairn.torch.CairnReader` loads bit-exactly, and nothing unless the directory is
whole. This module holds the blocking functions; the async ones are beside them.

Invariant: each blocking function runs its async twin to its end on cairn's event-loop
thread (:func:`cairn.torch._runtime.run`), with a checkpointer made from its arguments
or the one it was given, never both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.signing import SigningKey
from cairn.sync import SyncCheckpointer
from cairn.torch._dcpexport import ExportedDcp, export_dcp_async
from cairn.torch._dcpimport import ImportedDcp, import_dcp_async
from cairn.torch._runtime import StoreArg, known_paths, make_checkpointer, run
from cairn.torch._target import interpret

__all__ = [
    "ExportedDcp",
    "ImportedDcp",
    "export_dcp",
    "export_dcp_async",
    "import_dcp",
    "import_dcp_async",
    "source_checkpointer",
]


Source = StoreArg | ObjectStoreCheckpointer | SyncCheckpointer
"""A store (as :class:`~cairn.torch.CairnReader` takes it) or a checkpointer over one."""


def source_checkpointer(
    source: Source,
    prefix: str | None,
    signing_key: SigningKey | Sequence[SigningKey] | None,
    concurrency: int,
) -> tuple[ObjectStoreCheckpointer, object]:
    """The checkpointer over ``source`` (made from a store with these settings, or the
    one given, which then must come without them), and the store error messages name."""
    if isinstance(source, SyncCheckpointer):
        source = source.async_checkpointer
    if isinstance(source, ObjectStoreCheckpointer):
        if prefix is not None or signing_key is not None:
            raise InvalidInputError(
                "prefix and signing_key come with the checkpointer: give them to it instead"
            )
        return source, source.store
    ckpt = make_checkpointer(
        source,
        prefix,
        max_concurrent_uploads=concurrency,
        max_concurrent_downloads=concurrency,
        signing_key=signing_key,
    )
    return ckpt, source


def export_dcp(
    source: Source,
    checkpoint_id: CheckpointId | str | os.PathLike[str] | None,
    dest: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    max_concurrent_downloads: int = 8,
) -> ExportedDcp:
    """Write a DCP checkpoint of ``source`` as a DCP directory ``dest`` (see the module
    docstring): ``FileSystemReader`` and ``dcp_to_torch_save`` read it bit-exactly.

    Every byte is verified on the way out; ``dest`` appears whole or not at all.

    Args:
        source: A store (as :class:`~cairn.torch.CairnReader` takes it) or a
            checkpointer over one.
        checkpoint_id: Read as ``dcp.load`` reads it through a
            :class:`~cairn.torch.CairnReader`: an id, or a name (the newest committed
            checkpoint with it); None exports the latest DCP checkpoint. The latest, and
            the newest of a name, is the newest that exports whole: one whose items do
            not read back verified is passed over, and named in
            :attr:`ExportedDcp.passed_over`.
        dest: The directory to write, missing or empty.
        prefix: With a store: the checkpoints' prefix; None (the default) is the
            store's root, or ``checkpoints/`` where only that holds checkpoints.
        signing_key: With a store: the key, or keys, as
            :class:`~cairn.ObjectStoreCheckpointer` takes it.
        max_concurrent_downloads: With a store: how many artifacts are read at once.

    Returns:
        The checkpoint exported, and the files written.

    Raises:
        CheckpointNotFoundError: No such checkpoint, or no DCP checkpoint at all.
        IntegrityError: An item of the checkpoint asked for by id is damaged; nothing
            is written.
        InvalidInputError: ``dest`` is unusable, or ``prefix`` or ``signing_key`` was
            given with a checkpointer.
    """
    ckpt, store = source_checkpointer(source, prefix, signing_key, max_concurrent_downloads)
    target = (
        None
        if checkpoint_id is None
        else interpret(
            checkpoint_id, store, known_paths(ckpt, "export_dcp"), "export_dcp's checkpoint_id"
        )
    )
    where = Path(os.path.abspath(dest))
    return run(export_dcp_async(ckpt, target, where, store=store), "export_dcp")


def import_dcp(
    dest: Source,
    source: str | os.PathLike[str],
    *,
    epoch: int = 0,
    name: str | None = None,
    prefix: str | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    max_concurrent_uploads: int = 8,
) -> ImportedDcp:
    """Commit the DCP directory ``source`` (written by ``FileSystemWriter``) as one cairn
    checkpoint of ``dest``, which :class:`~cairn.torch.CairnReader` loads bit-exactly.

    The checkpoint gets a new id. What is checked on the way in, and what cannot be, is
    in the module docstring; a directory that fails a check commits nothing.

    Args:
        dest: A store (as :class:`~cairn.torch.CairnReader` takes it) or a checkpointer
            over one.
        source: The DCP directory to import.
        epoch: The epoch the checkpoint records, >= 0.
        name: The checkpoint's name; None (the default) is the directory's name, such
            as ``step-100``, so that ``CairnReader(checkpoint_id="step-100")`` loads it.
        prefix: The checkpoints' prefix in a store ``dest``, as for :func:`export_dcp`.
        signing_key: The key, or keys, a store ``dest`` is signed with, as for
            :func:`export_dcp`.
        max_concurrent_uploads: With a store: how many artifacts are uploaded at once.

    Returns:
        The checkpoint committed, and what was read.

    Raises:
        IntegrityError: A file is missing, short or damaged; nothing is committed.
        InvalidInputError: What import does not read, an unusable ``epoch`` or
            ``name``, or ``prefix`` or ``signing_key`` given with a checkpointer.
    """
    ckpt, _ = source_checkpointer(dest, prefix, signing_key, max_concurrent_uploads)
    where = Path(os.path.abspath(source))
    return run(import_dcp_async(ckpt, where, epoch=epoch, name=name), "import_dcp")
