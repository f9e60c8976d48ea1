"""The root of cairn's error tree, and how every error in it crosses a process boundary.

Invariant: every :class:`CheckpointerError` pickles as itself: unpickled, it is an
instance of the same class with the same ``args`` and the same attributes, whatever its
constructor takes (see :meth:`CheckpointerError.__reduce__`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckpointerError",
]


class CheckpointerError(Exception):
    """Root of every error raised by cairn."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross processes (DCP sends each rank's exception to its coordinator,
        # multiprocessing a worker's to its parent). The constructors take a path, digests
        # or generations, not ``args``, so rebuild from the state instead of calling them.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[CheckpointerError], args: tuple[Any, ...], state: dict[str, Any]
) -> CheckpointerError:
    """An unpickled error: ``cls`` with ``args`` and the attributes it had, as it was."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


# Pickles name this function where the errors' public module is, ``cairn.errors``, which
# re-exports it: pickles made while it was defined there keep loading.
_rebuild.__module__ = "cairn.errors"
