"""Checkpoint identifiers: UUIDv7 (RFC 9562), ordered by time.

Invariant: ids made by :meth:`CheckpointId.now` in one process are strictly increasing,
even within one millisecond or when the wall clock steps back, because the generator
falls back to incrementing the last id's 74 random bits (RFC 9562 section 6.2, method 2).
The hyphenated text of a UUIDv7 sorts like its integer, so the lexical order of
checkpoint directories in a store is their time order. See docs/format.md, section
"Checkpoint directories".
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
import uuid
import uuid as uuid_module

from cairn.errors import InvalidInputError

__all__ = ["CheckpointId"]

_RAND_BITS = 74  # 12 bits of rand_a + 62 bits of rand_b
_RAND_MASK = (1 << _RAND_BITS) - 1
_MS_MASK = (1 << 48) - 1


def _pack(unix_ms: int, rand: int) -> int:
    rand_a = rand >> 62
    rand_b = rand & ((1 << 62) - 1)
    return (unix_ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b


def _unpack(value: int) -> tuple[int, int]:
    unix_ms = value >> 80
    rand_a = (value >> 64) & 0xFFF
    rand_b = value & ((1 << 62) - 1)
    return unix_ms, (rand_a << 62) | rand_b


class _MonotonicV7:
    """Thread-safe source of strictly increasing UUIDv7 integers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def next(self) -> int:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            if now_ms > self._last_ms:
                ms, rand = now_ms, secrets.randbits(_RAND_BITS)
            else:
                # Same millisecond (or the clock went back): count up from the last id.
                # Adding a random step keeps ids hard to guess while staying ordered.
                ms, rand = self._last_ms, self._last_rand + 1 + secrets.randbits(16)
                if rand > _RAND_MASK:
                    ms, rand = ms + 1, secrets.randbits(_RAND_BITS - 1)
            self._last_ms, self._last_rand = ms, rand
            return _pack(ms & _MS_MASK, rand)


_generator = _MonotonicV7()


def _parse_uuid(text: object) -> uuid.UUID:
    """The UUID of the 36-character hyphenated ``text`` (any case); InvalidInputError if
    it is not that form."""
    if not isinstance(text, str) or len(text) != 36:
        raise InvalidInputError(f"not a checkpoint id (36-char UUIDv7): {text!r}")
    try:
        value = uuid.UUID(text)
    except ValueError:
        raise InvalidInputError(f"not a checkpoint id (36-char UUIDv7): {text!r}") from None
    if str(value) != text.lower():
        raise InvalidInputError(f"not a checkpoint id (36-char UUIDv7): {text!r}")
    return value


@functools.total_ordering
class CheckpointId:
    """The id of one checkpoint: a UUIDv7 whose order is chronological.

    Immutable and hashable. ``str(id)`` is the 36-character hyphenated form used in
    object paths and manifests; ``CheckpointId(text)`` parses that form back (as
    :meth:`parse` does), ``CheckpointId(uuid)`` wraps a :class:`uuid.UUID`.

    Args:
        value: A UUIDv7, or its 36-character hyphenated text.

    Raises:
        InvalidInputError: ``value`` is not a UUIDv7 nor the text of one.
    """

    __slots__ = ("_uuid",)
    _uuid: uuid.UUID

    def __init__(self, value: uuid.UUID | str) -> None:
        if isinstance(value, str):
            value = _parse_uuid(value)
        if not isinstance(value, uuid.UUID):
            raise InvalidInputError(
                f"checkpoint id must be a uuid.UUID or its 36-character text, got {value!r}"
            )
        if value.version != 7 or value.variant != uuid.RFC_4122:
            raise InvalidInputError(f"checkpoint id must be a UUIDv7, got {value}")
        object.__setattr__(self, "_uuid", value)

    @classmethod
    def now(cls) -> CheckpointId:
        """A new id for the current time, greater than every id made before in this process.

        Returns:
            The new id.
        """
        return cls(uuid.UUID(int=_generator.next()))

    @classmethod
    def from_uuid(cls, value: uuid.UUID) -> CheckpointId:
        """Wrap an existing UUIDv7.

        Args:
            value: The UUID.

        Returns:
            The id holding it.

        Raises:
            InvalidInputError: ``value`` is not a UUIDv7.
        """
        return cls(value)

    @classmethod
    def parse(cls, text: str) -> CheckpointId:
        """Parse the hyphenated form.

        Args:
            text: The 36-character hyphenated text of a UUIDv7.

        Returns:
            The id it spells.

        Raises:
            InvalidInputError: ``text`` is not the text of a UUIDv7 (the message names it).
        """
        return cls(_parse_uuid(text))

    @classmethod
    def is_valid(cls, text: str) -> bool:
        """Whether ``text`` parses as a checkpoint id.

        Args:
            text: Any text.

        Returns:
            True when :meth:`parse` accepts it.
        """
        try:
            cls.parse(text)
        except InvalidInputError:
            return False
        return True

    @property
    def uuid(self) -> uuid.UUID:
        """The underlying :class:`uuid.UUID`."""
        return self._uuid

    @property
    def timestamp_ms(self) -> int:
        """Milliseconds since the Unix epoch encoded in the id."""
        return _unpack(self._uuid.int)[0]

    def to_string_id(self) -> str:
        """The hyphenated text form, as used in paths (same as ``str(id)``).

        Returns:
            The 36-character text.
        """
        return str(self._uuid)

    def __str__(self) -> str:
        return str(self._uuid)

    def __repr__(self) -> str:
        return f"CheckpointId('{self._uuid}')"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CheckpointId):
            return NotImplemented
        return self._uuid == other._uuid

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, CheckpointId):
            return NotImplemented
        return self._uuid.int < other._uuid.int

    def __hash__(self) -> int:
        return hash(self._uuid)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CheckpointId is immutable")

    def __reduce__(self) -> tuple[type[CheckpointId], tuple[uuid_module.UUID]]:
        return (CheckpointId, (self._uuid,))
