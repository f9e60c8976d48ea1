"""What every part of one checkpointer shares: its store, its layout, its limits and its hints.

The checkpointer's parts (:mod:`cairn.protocol._catalog`, :mod:`cairn.protocol._upload`,
:mod:`cairn.protocol._download`, :mod:`cairn.protocol._chains`,
:mod:`cairn.protocol._commit`, :mod:`cairn.protocol._save`, ...) are functions whose
first argument is a :class:`Context`; :func:`context_of` builds one from a checkpointer's
settings, for the checkpointer and for the integrations' interface alike (a save in the
background keeps the one it was started with). Invariants: ``store`` is the retrying
store, so every call any part makes is retried only on transient failures, with the
checkpointer's policy; with ``keys``, every manifest written is signed by the first and
every manifest read for use is verified (see :mod:`cairn.format.signing`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Protocol

from cairn.errors import InvalidInputError
from cairn.format.codecs import Codec
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.format.signing import SigningKeys
from cairn.protocol._manifestcache import ManifestCache
from cairn.protocol._pointer import PointerHint
from cairn.stores import Store

__all__ = ["Context", "Hints", "Settings", "check_id", "context_of"]


@dataclass
class Hints:
    """What one checkpointer learned of its store that spares it a round trip later.

    Each is a guess that the protocol checks before it relies on it (a swap of
    ``_latest`` is conditioned on the version the hint holds), so a stale one costs a
    round trip, never a wrong decision.
    """

    latest: PointerHint = field(default_factory=PointerHint)
    """``_latest`` as this checkpointer last read or wrote it."""
    manifests: ManifestCache = field(default_factory=ManifestCache)
    """Committed manifests its GC read, by the listed object (used only while unchanged)."""


@dataclass(frozen=True, slots=True)
class Context:
    """A checkpointer's store (retrying), layout, concurrency limits, codec, lease,
    signing keys (None: manifests are neither signed nor verified), the writer
    generation it holds (0 until it takes over: see :mod:`cairn.protocol._pointer`) and
    its :class:`Hints`."""

    store: Store
    paths: CheckpointPaths
    max_concurrent_uploads: int
    max_concurrent_downloads: int
    codec: Codec | None
    lease: dt.timedelta
    keys: SigningKeys | None = None
    generation: int = 0
    hints: Hints = field(default_factory=Hints)


class Settings(Protocol):
    """What a checkpointer holds that its :class:`Context` is made of (its public
    attributes: see :class:`~cairn.ObjectStoreCheckpointer`)."""

    @property
    def store(self) -> Store: ...
    @property
    def max_concurrent_uploads(self) -> int: ...
    @property
    def max_concurrent_downloads(self) -> int: ...
    @property
    def codec(self) -> Codec | None: ...
    @property
    def lease(self) -> dt.timedelta: ...
    @property
    def signing_keys(self) -> SigningKeys | None: ...
    @property
    def writer_generation(self) -> int: ...


def context_of(settings: Settings, paths: CheckpointPaths, hints: Hints | None = None) -> Context:
    """The context of a checkpointer with ``settings``, as they are now, over its
    resolved layout ``paths``, sharing its ``hints`` (None: none yet, for this context
    alone)."""
    return Context(
        settings.store,
        paths,
        settings.max_concurrent_uploads,
        settings.max_concurrent_downloads,
        settings.codec,
        settings.lease,
        settings.signing_keys,
        settings.writer_generation,
        hints if hints is not None else Hints(),
    )


def check_id(checkpoint_id: object) -> CheckpointId:
    """``checkpoint_id`` if it is a :class:`CheckpointId`, the id its 36-character text
    names if it is a ``str``; :class:`InvalidInputError` if neither. No I/O: a short id
    needs the store's listing (:func:`cairn.protocol.discover.resolve_checkpoint_id`)."""
    if isinstance(checkpoint_id, CheckpointId):
        return checkpoint_id
    if isinstance(checkpoint_id, str):
        return CheckpointId.parse(checkpoint_id)
    raise InvalidInputError(f"expected a CheckpointId or its text, got {checkpoint_id!r}")
