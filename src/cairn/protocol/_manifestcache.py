"""Committed manifests a checkpointer has read, kept to spare reading them again.

A committed manifest never changes in place: the only writes its path sees after the
commit replace it with a tombstone or delete it (:mod:`cairn.protocol._lease`). So a
manifest read once is the manifest for as long as a listing shows the same object at its
path: the same size and e-tag. :class:`ManifestCache` keeps decoded manifests under
that key; GC, which reads every listed manifest on every run, takes from it what the
listing shows unchanged (a retention GC after every commit would otherwise read every
kept checkpoint's manifest each time).

Invariant: an entry is used only for a listed object of the same path, size and e-tag
as the one it was decoded from; an object without an e-tag is never cached.
"""

from __future__ import annotations

import collections

from cairn.format.manifest import CheckpointManifest
from cairn.stores import ObjectInfo

__all__ = ["MANIFESTS_KEPT", "ManifestCache"]

MANIFESTS_KEPT = 4096
"""Manifests a cache holds at most; the least recently used go first."""

_Key = tuple[str, int, str]


class ManifestCache:
    """Decoded manifests by the listed object they came from (see the module docstring)."""

    def __init__(self, limit: int = MANIFESTS_KEPT) -> None:
        self._limit = limit
        self._entries: collections.OrderedDict[_Key, CheckpointManifest] = collections.OrderedDict()

    @staticmethod
    def _key(info: ObjectInfo) -> _Key | None:
        return (info.path, info.size, info.e_tag) if info.e_tag else None

    def get(self, info: ObjectInfo) -> CheckpointManifest | None:
        """The manifest decoded from the object ``info`` lists, if kept."""
        key = self._key(info)
        if key is None or key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, info: ObjectInfo, manifest: CheckpointManifest) -> None:
        """Keep ``manifest``, decoded from the object ``info`` lists."""
        key = self._key(info)
        if key is None:
            return
        self._entries[key] = manifest
        self._entries.move_to_end(key)
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
