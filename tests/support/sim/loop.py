"""An asyncio event loop with virtual time, for deterministic simulation.

:class:`SimLoop` is a selector event loop whose clock is a number only the simulation
moves, and whose selector never waits: when every task is blocked (the loop would sleep
in ``select``), it hands control to ``on_idle(timeout)``, the scheduler's one decision
point. There the scheduler either completes one pending store call (which makes its
caller runnable) or moves the clock to the next timer (``timeout`` seconds on), so
``asyncio.sleep``, ``wait_for`` and a lease's renewal period all run on virtual time,
in an order that depends on nothing but the scheduler's choices.

Work sent to a thread (``asyncio.to_thread``, ``run_in_executor``) runs inline: a real
thread would finish at a moment no seed controls.
"""

from __future__ import annotations

import asyncio
import selectors
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Deadlock", "SimLoop"]


class Deadlock(RuntimeError):
    """Every task is blocked and nothing can unblock one: no store call pending, no
    timer set."""


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else int(fileobj.fileno())


class _IdleSelector(selectors.BaseSelector):
    """Keeps the registrations the loop makes (its self-pipe), never waits on them."""

    def __init__(self, on_idle: Callable[[float | None], None]) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}
        self._on_idle = on_idle

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._keys[key.fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(_fd(fileobj))

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout > 0:
            self._on_idle(timeout)
        return []

    def close(self) -> None:
        self._keys.clear()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return types.MappingProxyType(self._keys)


class SimLoop(asyncio.SelectorEventLoop):
    """The loop of one simulated run (see the module docstring)."""

    def __init__(self, on_idle: Callable[[float | None], None]) -> None:
        self.now = 0.0
        super().__init__(_IdleSelector(on_idle))

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the virtual clock ``seconds`` forwards."""
        self.now += max(0.0, seconds)

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future
