"""A large ranged read as pieces read at once, into one buffer.

One connection to an object store carries a bounded rate, so :class:`~cairn.stores.ObstoreStore`
reads a range of more than two :data:`READ_PIECE` in pieces of that size, as many at once as
its download :class:`~cairn.stores._parts.PartsController` allows, each timed and reported to it.

Invariants: the result is the range's bytes, in order, in one buffer allocated once (each piece
is copied into place as it arrives and then dropped, so besides the result at most ``limit``
pieces are held); a piece that fails fails the read, after the pieces in flight have ended (none
is left running); a :class:`~cairn.errors.TransientStoreError` also tells the controller to shrink.
A piece shorter than asked (the object ends inside the range) ends the result there. The
adapter learns the object's size and e-tag from the first piece's reply head before it starts
the others, clamps the range to that size, and reads every other piece only if the e-tag still
matches: the bytes are of one version of the object, or the read fails.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from cairn.errors import TransientStoreError
from cairn.format._buffer import Buffer
from cairn.stores._parts import PartsController

__all__ = ["READ_PIECE", "read_in_pieces", "split_range"]

READ_PIECE = 4 * 1024 * 1024
"""Bytes of one piece of a large ranged read: half the upload part size, as reads have no
minimum part size and a piece's time on a capped connection is what one read waits for."""

GetPiece = Callable[[int, int], Awaitable[Buffer]]
"""Reads bytes ``start`` to ``end`` of the object: one request."""


def split_range(start: int, end: int, piece: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into consecutive pieces of ``piece`` bytes (the last shorter)."""
    return [(s, min(s + piece, end)) for s in range(start, end, piece)]


async def read_in_pieces(
    get_piece: GetPiece,
    start: int,
    end: int,
    controller: PartsController,
    piece: int = READ_PIECE,
) -> bytearray:
    """Bytes ``start`` to ``end`` of an object, read as pieces of ``piece`` bytes, at most
    ``controller.limit`` (as it is when each piece starts) in flight at once.

    Args:
        get_piece: Reads one piece, one request.
        start: The first byte.
        end: The byte after the last; an object that ends sooner gives fewer bytes.
        controller: Decides the pieces in flight; told how each piece went.
        piece: The size of a piece.

    Returns:
        The bytes.
    """
    pieces = split_range(start, end, piece)
    result = bytearray(end - start)
    filled = [0] * len(pieces)
    pending = iter(enumerate(pieces))
    running: set[asyncio.Task[None]] = set()

    async def one(index: int, first: int, last: int) -> None:
        began = time.monotonic()
        try:
            data = memoryview(await get_piece(first, last)).cast("B")
        except TransientStoreError:
            controller.failed()
            raise
        controller.completed(data.nbytes, time.monotonic() - began)
        result[first - start : first - start + data.nbytes] = data
        filled[index] = data.nbytes

    try:
        while True:
            while len(running) < controller.limit:
                nxt = next(pending, None)
                if nxt is None:
                    break
                index, (first, last) = nxt
                running.add(asyncio.ensure_future(one(index, first, last)))
            if not running:
                break
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    for index, (first, last) in enumerate(pieces):
        if filled[index] < last - first:  # the object ends here
            del result[first - start + filled[index] :]
            break
    return result
