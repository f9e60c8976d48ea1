"""Writing as a newer cairn: manifests whose ``requires`` names a feature this one lacks.

:func:`newer_cairn` makes this process, while inside it, a cairn that knows one more
format feature and uses it in every manifest (or every part) it writes: the manifests
are encoded by the format's own encoder, checksummed and signed as usual, and name the
feature in ``requires`` with ``written_by`` :data:`NEWER_VERSION`. Outside it, the same
process is today's cairn again, which does not know the feature.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import pytest

from cairn.format import _codec, _parts, features
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.stores import Store

FEATURE = "teleport"
"""The feature the newer cairn knows and today's does not."""

NEWER_VERSION = "9.1.0"
"""The version the newer cairn records as ``written_by``."""


@contextlib.contextmanager
def newer_cairn(*, in_parts: bool = False) -> Iterator[None]:
    """Write as a newer cairn: every root manifest requires :data:`FEATURE` (with
    ``in_parts``, every manifest part instead, the root as today's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(features, "KNOWN", features.KNOWN | {FEATURE})
        patch.setattr(_codec, "VERSION", NEWER_VERSION)
        patch.setattr(_parts, "VERSION", NEWER_VERSION)
        if in_parts:

            def entry_features(entries: Iterable[PartitionSnapshotEntry]) -> set[str]:
                return {*features.entry_features(entries), FEATURE}

            patch.setattr(_parts, "entry_features", entry_features)
        else:

            def features_of(manifest: CheckpointManifest) -> tuple[str, ...]:
                return tuple(sorted({*features.features_of(manifest), FEATURE}))

            patch.setattr(_parts, "features_of", features_of)
        yield


async def contents(store: Store, prefix: str = "") -> dict[str, bytes]:
    """Every object under ``prefix``: its path and its bytes."""
    return {
        info.path: bytes((await store.get(info.path)).data) for info in await store.list(prefix)
    }
