"""Hugging Face safetensors out of cairn and into it: :func:`export_hf` and :func:`import_hf`.

**Export** (:mod:`cairn.torch._hfexport`) writes a DCP checkpoint saved through cairn as
``model-{k:05d}-of-{n:05d}.safetensors`` shards and ``model.safetensors.index.json``
into any store, streamed, every byte verified on the way out.
**Import** (:mod:`cairn.torch._hfimport`) commits a directory of safetensors files as one
DCP checkpoint that :class:`~cairn.torch.CairnReader` loads resharded. This module holds
the blocking functions; the async ones are beside them.

Invariant: each blocking function runs its async twin to its end on cairn's event-loop
thread (:func:`cairn.torch._runtime.run`), with a checkpointer made from its arguments
or the one it was given, never both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import urlsplit

import torch

from cairn.errors import InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.signing import SigningKey
from cairn.stores import Store, as_store
from cairn.torch._dcpdir import Source, source_checkpointer
from cairn.torch._hfexport import DEFAULT_SHARD_BYTES, ExportedHf, FqnMap, export_hf_async
from cairn.torch._hfimport import ImportedHf, import_hf_async
from cairn.torch._runtime import StoreArg, known_paths, run
from cairn.torch._target import interpret

__all__ = ["export_hf", "import_hf", "location"]


def location(where: StoreArg | os.PathLike[str]) -> tuple[Store, str]:
    """The store a destination or source names (a URL, a path, a store), and how to show it."""
    if isinstance(where, os.PathLike):
        where = os.path.abspath(where)
    if isinstance(where, str):
        if "://" not in where:
            where = os.path.abspath(where)
        return as_store(where), where
    return as_store(where), repr(where)


def _last_segment(shown: str) -> str:
    path = urlsplit(shown).path if "://" in shown else shown
    return path.rstrip("/").rsplit("/", 1)[-1]


def export_hf(
    source: Source,
    checkpoint_id: CheckpointId | str | os.PathLike[str] | None,
    to: StoreArg | os.PathLike[str],
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    dtype: torch.dtype | None = None,
    fqn_map: FqnMap | None = None,
    prefix: str | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    max_concurrent_downloads: int = 8,
) -> ExportedHf:
    """Write a DCP checkpoint of ``source`` as Hugging Face safetensors shards into ``to``.

    ``to`` gets ``model-00001-of-0000n.safetensors`` … and ``model.safetensors.index.json``
    (written last), which ``safetensors.torch.load_file`` and ``transformers``'
    ``from_pretrained`` read. Each shard is streamed (a multipart upload on S3, GCS and
    Azure): nothing is staged on a local disk, no tensor is held whole, and every byte
    comes from an item whose SHA-256 matched before the shard's upload ends. A failed
    export deletes the shards it completed and writes no index; a destination that
    holds an index already is refused before anything is written.

    Args:
        source: A store (as :class:`~cairn.torch.CairnReader` takes it) or a
            checkpointer over one.
        checkpoint_id: An id, or a name (the newest committed checkpoint with it); None
            exports the latest DCP checkpoint. The latest, and the newest of a name, is
            the newest that exports whole: one whose items do not read back verified is
            passed over, and named in :attr:`ExportedHf.passed_over`.
        to: Where to write: a store URL (``s3://bucket/models/run-1``), a local path,
            or a store.
        max_shard_bytes: The tensor bytes of one shard at most (a larger tensor is a
            shard of its own); 5 GB by default, as ``transformers``.
        dtype: Cast floating-point tensors to this dtype (``torch.bfloat16``); None
            (the default) keeps every dtype.
        fqn_map: Each DCP FQN to its name in the files, or None to leave it out (for
            a state dict saved as ``{"model": ..., "optim": ...}``:
            :func:`~cairn.torch.under_prefix` ``("model.")``); None (the default) keeps
            every tensor under its FQN. Byte items are always left out.
        prefix: With a store ``source``: the checkpoints' prefix.
        signing_key: With a store ``source``: the key, or keys, as
            :class:`~cairn.ObjectStoreCheckpointer` takes it.
        max_concurrent_downloads: With a store ``source``: reads at once.

    Returns:
        The checkpoint exported, and the files written.

    Raises:
        CheckpointNotFoundError: No such checkpoint, or no DCP checkpoint at all.
        IntegrityError: An item is damaged: of the checkpoint asked for by id, or of
            every candidate for the latest or a name (the newest's damage). No index is
            written and the shards this export completed are deleted.
        InvalidInputError: An unusable argument or FQN map result, or a dtype
            safetensors lacks.
        ObjectExistsError: ``to`` already holds ``model.safetensors.index.json``.
    """
    ckpt, store = source_checkpointer(source, prefix, signing_key, max_concurrent_downloads)
    target = (
        None
        if checkpoint_id is None
        else interpret(
            checkpoint_id, store, known_paths(ckpt, "export_hf"), "export_hf's checkpoint_id"
        )
    )
    dest, shown = location(to)
    return run(
        export_hf_async(
            ckpt,
            target,
            dest,
            shown=shown,
            max_shard_bytes=max_shard_bytes,
            dtype=dtype,
            fqn_map=fqn_map,
            store=store,
        ),
        "export_hf",
    )


def import_hf(
    dest: Source,
    source: StoreArg | os.PathLike[str],
    *,
    name: str | None = None,
    epoch: int = 0,
    prefix: str | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    max_concurrent_uploads: int = 8,
) -> ImportedHf:
    """Commit the safetensors files of ``source`` as one DCP checkpoint of ``dest``.

    ``source`` holds ``model.safetensors``, or shards and ``model.safetensors.index.json``
    (or any ``*.safetensors`` files). The checkpoint gets a new id, holds every tensor
    under its name, and loads with ``dcp.load(state_dict,
    storage_reader=CairnReader(dest, checkpoint_id=name))`` at any sharding. Every
    header is checked before anything is uploaded; digests are computed as the bytes are
    uploaded.

    Args:
        dest: A store (as :class:`~cairn.torch.CairnReader` takes it) or a checkpointer
            over one.
        source: The directory: a local path, a store URL, or a store.
        name: The checkpoint's name; None (the default) is the directory's last path
            segment.
        epoch: The epoch the checkpoint records, >= 0.
        prefix: With a store ``dest``: the checkpoints' prefix.
        signing_key: With a store ``dest``: the key, or keys, it signs with.
        max_concurrent_uploads: With a store ``dest``: uploads at once.

    Returns:
        The checkpoint committed, and what was read.

    Raises:
        CorruptManifestError: A file is not a whole safetensors file; nothing is committed.
        InvalidInputError: No safetensors file, a tensor in two files, or an unusable
            ``name`` or ``epoch``.
    """
    if isinstance(source, os.PathLike | str) and "://" not in str(source):
        local = os.fspath(source)
        if not os.path.isdir(local):  # opening it as a store would make it
            raise InvalidInputError(f"cannot import {local}: it is not a directory")
    ckpt, _ = source_checkpointer(dest, prefix, signing_key, max_concurrent_uploads)
    store, shown = location(source)
    chosen = _last_segment(shown) if name is None else name
    return run(import_hf_async(ckpt, store, shown=shown, name=chosen, epoch=epoch), "import_hf")
