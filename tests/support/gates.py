"""A store wrapper that holds one chosen call until the test lets it go.

For races that need "the worst moment": a save stalled between two steps while
another writer, or a GC, acts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cairn.stores import ForwardingStore, PutMode, Store, StoreMethod

T = TypeVar("T")

Match = Callable[[StoreMethod, str, PutMode | None], bool]


class GatedStore(ForwardingStore):
    """Holds the first call that ``match`` accepts (every one, with ``every``) until
    :meth:`release`.

    ``reached`` is set when the first such call arrives (before it reaches ``inner``);
    every other call goes straight through.
    """

    def __init__(self, inner: Store, match: Match, *, every: bool = False) -> None:
        super().__init__(inner)
        self._match = match
        self._every = every
        self._armed = True
        self.reached = asyncio.Event()
        self._open = asyncio.Event()

    def release(self) -> None:
        """Let the held call go on."""
        self._open.set()

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if self._armed and self._match(operation, path, mode):
            self._armed = self._every
            self.reached.set()
            await self._open.wait()
        return await call()
