"""Argument checks shared by every module that takes numbers from callers. Pure."""

from __future__ import annotations

from typing import TypeGuard

from cairn.errors import InvalidInputError

__all__ = ["is_int", "positive_int"]


def is_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool`` (``True`` is an int to Python, not to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 1; :class:`InvalidInputError` naming ``name`` if not."""
    if not is_int(value) or value < 1:
        raise InvalidInputError(f"{name} must be an int >= 1, got {value!r}")
    return value
