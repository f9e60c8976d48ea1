"""Errors about how cairn was called: arguments it cannot accept, or a call made where it
cannot run (inside an event loop; before a checkpointer's paths are resolved).

Invariant: each is raised before anything is written, and names the offending value;
an argument error is also a :class:`ValueError`, a call made in the wrong place a
:class:`RuntimeError`.
"""

from __future__ import annotations

from cairn.errors._root import CheckpointerError

__all__ = [
    "AmbiguousCheckpointIdError",
    "CheckpointLocationError",
    "IncompleteCheckpointError",
    "InvalidCheckpointDataError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidStoreUrlError",
    "KeyGroupError",
    "KeySpaceMismatchError",
    "PathsUnresolvedError",
    "SpecialFileError",
    "SyncInAsyncContextError",
]


class InvalidInputError(CheckpointerError, ValueError):
    """The caller passed a value cairn cannot accept; nothing was written."""


class AmbiguousCheckpointIdError(InvalidInputError):
    """A short checkpoint id (a prefix of the hyphenated form) matches more than one
    committed checkpoint.

    Attributes:
        prefix: The short id given.
        candidates: The full ids it matches, oldest first.
    """

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        self.prefix, self.candidates = prefix, candidates
        shown = ", ".join(candidates[:10]) + (", ..." if len(candidates) > 10 else "")
        super().__init__(
            f"short checkpoint id {prefix!r} is ambiguous: it matches "
            f"{len(candidates)} checkpoints ({shown}); give more characters"
        )


class InvalidNameError(InvalidInputError):
    """An operator or source name, or a partition number, is not allowed.

    Attributes:
        kind: What the value is (``"operator name"``, ``"partition"``, ...).
        value: The value given.
        reason: Why it is not allowed.
    """

    def __init__(self, kind: str, value: object, reason: str) -> None:
        self.kind, self.value, self.reason = kind, value, reason
        super().__init__(f"invalid {kind} {value!r}: {reason}")


class InvalidStoreUrlError(InvalidInputError):
    """``open_store`` cannot open ``url``.

    Attributes:
        url: The URL given.
        reason: Why it cannot be opened.
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url, self.reason = url, reason
        super().__init__(f"cannot open store URL {url!r}: {reason}")


class CheckpointLocationError(InvalidInputError):
    """A DCP ``checkpoint_id`` is a location (a URL, an absolute path) outside the store
    being written or read, or one it cannot be compared with: nothing is written or read
    anywhere but where it names (how a ``checkpoint_id`` is read: :mod:`cairn.torch`).

    Attributes:
        checkpoint_id: The ``checkpoint_id`` given.
        store: The store being written or read, in words.
        reason: Why the location is refused.
    """

    def __init__(self, checkpoint_id: str, store: str, reason: str) -> None:
        self.checkpoint_id, self.store, self.reason = checkpoint_id, store, reason
        super().__init__(
            f"checkpoint_id {checkpoint_id!r} {reason} (the store is {store}): cairn "
            "saves into and loads from its own store only; give a name such as "
            "'step-100', or a location inside the store"
        )


class InvalidCheckpointDataError(InvalidInputError):
    """The checkpoint asked for is inconsistent (see the message for the offending value)."""


class SpecialFileError(InvalidCheckpointDataError):
    """A directory partition holds something other than regular files and directories:
    a symbolic link (never followed), a socket, a FIFO, a device.

    Attributes:
        path: The local path of the special file.
        kind: What it is (``"symbolic link"``, ``"socket"``, ...).
    """

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind = path, kind
        super().__init__(f"{path!r} is a {kind}: a directory partition holds regular files only")


class IncompleteCheckpointError(InvalidInputError):
    """Worker reports do not cover the expected partitions exactly once; nothing committed."""


class KeyGroupError(InvalidInputError):
    """A key-group count, key group, worker index or worker count is out of its range
    (see :class:`cairn.KeyGroups`), or a key is not bytes.

    Attributes:
        what: What the value is (``"key-group count"``, ``"key group"``, ...).
        value: The value given.
        allowed: The values allowed, in words (``"0..127"``).
    """

    def __init__(self, what: str, value: object, allowed: str) -> None:
        self.what, self.value, self.allowed = what, value, allowed
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(f"{what} {shown} is out of range: expected {allowed}")


class KeySpaceMismatchError(InvalidInputError):
    """Keyed partitions of one operator do not make one key space: they overlap in key
    groups, disagree on the key-group count (with each other, with the parent's, or with
    the count a reader expects), or mix keyed and other state. Nothing was committed.

    Attributes:
        operator: The operator whose partitions disagree.
        reason: What disagrees, naming the partitions and groups.
    """

    def __init__(self, operator: str, reason: str) -> None:
        self.operator, self.reason = operator, reason
        super().__init__(f"operator {operator!r}: {reason}")


class SyncInAsyncContextError(CheckpointerError, RuntimeError):
    """A blocking cairn call (:class:`~cairn.SyncCheckpointer`) was made inside a running
    event loop, which it would deadlock: await the async API there instead."""


class PathsUnresolvedError(CheckpointerError, RuntimeError):
    """``ObjectStoreCheckpointer.paths`` was read before the checkpointer, given no
    ``paths``, chose its base prefix from what its store holds: await
    ``resolve_paths()`` (any of its coroutines does) first, or pass ``paths``."""
