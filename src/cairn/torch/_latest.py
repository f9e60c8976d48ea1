"""``load_latest``: ``dcp.load`` of the newest DCP checkpoint that loads whole, falling back.

:class:`~cairn.torch.CairnReader` without a ``checkpoint_id`` already passes over a
checkpoint whose manifest or DCP metadata is damaged. Damage in a shard is only found
while DCP reads it, after the choice: the read fails (the bytes never reach the state).
This helper then loads the next older checkpoint, as
:meth:`~cairn.ObjectStoreCheckpointer.load_latest` does for cairn's own checkpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadPlanner
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from cairn.errors import NewerFormatError
from cairn.format.ids import CheckpointId
from cairn.format.signing import SigningKey
from cairn.integrations._interface import DAMAGE
from cairn.torch._planner import SafeLoadPlanner
from cairn.torch._reader import CairnReader
from cairn.torch._runtime import StoreArg

__all__ = ["load_latest"]

log = logging.getLogger("cairn")


def load_latest(
    state_dict: dict[str, Any],
    store: StoreArg,
    *,
    prefix: str | None = None,
    max_concurrent_downloads: int = 8,
    process_group: Any = None,
    planner: LoadPlanner | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    skip_newer_format: bool = False,
) -> CheckpointId:
    """Load into ``state_dict`` the newest DCP checkpoint whose every item verifies.

    Every rank calls it, as it would call ``dcp.load``. Each attempt is one
    ``dcp.load`` with a :class:`~cairn.torch.CairnReader`; when it fails only because
    of damage (an item whose SHA-256 does not match, an artifact gone: cairn's
    :class:`~cairn.IntegrityError` or :class:`~cairn.CheckpointNotFoundError` on any
    rank, which DCP reports to every rank alike), the checkpoint is passed over and the
    next older one is loaded, with a warning. Any other failure is raised as DCP raised
    it. Items of the failed attempt that had verified may already be in ``state_dict``;
    the next attempt loads every item again.

    A checkpoint a newer cairn wrote (its manifest requires format features this cairn
    does not know) is not damage: rather than load older state past it, this raises
    :class:`~cairn.NewerFormatError`, as :meth:`~cairn.ObjectStoreCheckpointer.load_latest`
    does.

    Args:
        state_dict: The state to load into, as ``dcp.load`` takes it.
        store: The store, as :class:`~cairn.torch.CairnReader` takes it.
        prefix: The checkpoints' prefix; None (the default) is the store's root, or
            ``checkpoints/`` where only that holds checkpoints.
        max_concurrent_downloads: Reads in flight per rank at most.
        process_group: The process group, as ``dcp.load`` takes it.
        planner: The load planner; None (the default) is a
            :class:`~cairn.torch.SafeLoadPlanner`, which never unpickles anything but
            tensors and plain values.
        signing_key: The key, or keys (see :mod:`cairn.format.signing`): checkpoints
            not signed by one of them are passed over.
        skip_newer_format: Pass over, with a warning, a checkpoint a newer cairn wrote
            instead of raising.

    Returns:
        The id of the checkpoint loaded.

    Raises:
        CheckpointNotFoundError: No checkpoint is left to load.
        NewerFormatError: The newest checkpoint left was written by a newer cairn, and
            not ``skip_newer_format``.
    """
    damaged: list[CheckpointId] = []
    while True:
        reader = CairnReader(
            store,
            prefix=prefix,
            max_concurrent_downloads=max_concurrent_downloads,
            skip=damaged,
            signing_key=signing_key,
            skip_newer_format=skip_newer_format,
        )
        try:
            dcp_load(
                state_dict,
                storage_reader=reader,
                planner=planner if planner is not None else SafeLoadPlanner(),
                process_group=process_group,
            )
        except CheckpointException as exc:
            cid = reader.checkpoint_id
            if cid is None:
                # No checkpoint was opened: DCP wraps the reader's error in an
                # AssertionError. Ask the reader again, to raise cairn's own error.
                reader.read_metadata()
                raise
            errors = [error for error, _ in exc.failures.values()]
            passable = (*DAMAGE, NewerFormatError) if skip_newer_format else DAMAGE
            if not errors or not all(isinstance(e, passable) for e in errors):
                raise
            log.warning("checkpoint %s does not load (%s): trying the next one", cid, errors[0])
            damaged.append(cid)
            continue
        loaded = reader.checkpoint_id
        assert loaded is not None  # read_metadata chose it, or raised
        return loaded
