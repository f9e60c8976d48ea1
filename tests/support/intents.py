"""Intents as tests look for them: each save attempt writes its own
(``{id}/intent.{attempt}.json``, see :meth:`cairn.CheckpointPaths.intent`)."""

from __future__ import annotations

from cairn import CheckpointId, CheckpointPaths
from cairn.format.layout import is_intent
from cairn.stores import Store

__all__ = ["intents_of", "is_intent_path"]


def is_intent_path(path: str) -> bool:
    """Whether store ``path`` (under any base prefix) names an intent."""
    return is_intent(path.rsplit("/", 1)[-1])


async def intents_of(store: Store, paths: CheckpointPaths, cid: CheckpointId) -> list[str]:
    """The intents in ``cid``'s directory, sorted."""
    listed = await store.list(paths.checkpoint_dir(cid))
    return sorted(info.path for info in listed if is_intent_path(info.path))
