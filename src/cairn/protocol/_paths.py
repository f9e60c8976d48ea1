"""Which layout a checkpointer uses: the paths it was given, or one chosen from its store.

Invariant: a checkpointer given no paths chooses once, on first use, from what its store
holds (:func:`cairn.protocol.discover.default_paths`: one listing), however many of its
coroutines ask at once; the choice holds for its life, and until it is made no layout
is named (:class:`~cairn.errors.PathsUnresolvedError`), rather than one it may not use.
"""

from __future__ import annotations

import asyncio
import logging

from cairn.errors import InvalidInputError, PathsUnresolvedError
from cairn.format.layout import CheckpointPaths
from cairn.protocol.discover import default_paths_listed
from cairn.stores import ListDirResult, Store

__all__ = ["ChosenPaths"]

log = logging.getLogger("cairn")


class ChosenPaths:
    """The layout of a store: ``given``, or the one chosen on the first :meth:`resolve`."""

    def __init__(self, given: CheckpointPaths | None) -> None:
        if given is not None and not isinstance(given, CheckpointPaths):
            raise InvalidInputError(f"paths must be a CheckpointPaths, got {given!r}")
        self._paths = given
        self._resolving = asyncio.Lock()
        self._root_listing: ListDirResult | None = None

    @property
    def chosen(self) -> CheckpointPaths | None:
        """The layout, None until it is chosen."""
        return self._paths

    @property
    def paths(self) -> CheckpointPaths:
        """The layout; :class:`PathsUnresolvedError` until it is chosen."""
        if self._paths is None:
            raise PathsUnresolvedError(
                "this checkpointer was given no paths and has not yet chosen its base "
                "prefix from what its store holds: await ckpt.resolve_paths() first"
            )
        return self._paths

    async def resolve(self, store: Store) -> CheckpointPaths:
        """The layout of ``store``, chosen now if it was not (see the module docstring); a
        store that holds checkpoints under cairn 0.1's default prefix alone keeps it,
        with a warning."""
        if self._paths is None:
            async with self._resolving:
                if self._paths is None:
                    chosen, self._root_listing = await default_paths_listed(store)
                    if chosen.base_prefix:
                        log.warning(
                            "%r holds checkpoints under %r, cairn 0.1's default prefix, and "
                            "none at its root (the default now): using %r. Pass "
                            "paths=CheckpointPaths(%r) (with the cairn command line: "
                            "--prefix %s) to keep it so explicitly",
                            store,
                            chosen.base_prefix,
                            chosen.base_prefix,
                            chosen.base_prefix,
                            chosen.base_prefix,
                        )
                    self._paths = chosen
        return self._paths

    def take_root_listing(self) -> ListDirResult | None:
        """The listing of the root that chose it as the layout, once (then None): for
        the call that made the choice, which would list the root next."""
        listing, self._root_listing = self._root_listing, None
        return listing
