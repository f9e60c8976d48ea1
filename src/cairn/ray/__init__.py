"""Streaming on Ray: keyed partition actors, one coordinator, state checkpointed to an
object store, exactly-once through crashes and rescaling (the ``ray`` extra:
``pip install '.[ray]'`` from a clone).

The user writes a :class:`PartitionActor` (``key_of``, ``process``, ``snapshot``,
``restore``) and a replayable :class:`Source`; a :class:`StreamJob` runs them: a
coordinator actor that holds the store's writer generation, runs rounds and epochs, and
commits each epoch with :func:`~cairn.commit_distributed`; partition actors that each
hold the key groups ``KeyGroups.groups_of(i, workers)`` gives them, upload them at a
barrier (:func:`~cairn.upload_partitions`) and, on every start or restart, restore them
from the latest checkpoint with ``load_key_groups``, reading only their groups. The
guide, "Streaming on Ray", gives the rounds, barriers, epochs, failures and fencing, and
the coordinator's and the runner's modules keep them as invariants.
:func:`train_upload_fn` and :func:`train_storage` (in :mod:`cairn.ray.train`, which
needs Ray Train) checkpoint a Ray Train run through cairn.
"""

from typing import Any

from cairn.ray._spec import ActorTimeoutError, JobEvent, JobFailedError, JobStatus
from cairn.ray.actor import PartitionActor, Source
from cairn.ray.job import StreamJob

__all__ = [
    "ActorTimeoutError",
    "JobEvent",
    "JobFailedError",
    "JobStatus",
    "PartitionActor",
    "Source",
    "StreamJob",
    "train_storage",
    "train_upload_fn",
]


def __getattr__(name: str) -> Any:
    # Ray Train's hook needs pyarrow (ray[train]); imported only when asked for.
    if name in ("train_storage", "train_upload_fn"):
        from cairn.ray import train

        return getattr(train, name)
    raise AttributeError(f"module 'cairn.ray' has no attribute {name!r}")
