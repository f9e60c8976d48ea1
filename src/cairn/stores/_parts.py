"""How many parts of one object a store moves at once: fixed, or adaptive. Pure.

One connection to an object store carries a bounded rate (about 50-100 MB/s to S3), so
an object moves as fast as the parts of it in flight at once allow: a multipart upload's
parts, or the pieces a large ranged read is cut into. :class:`PartsInFlight` is the
setting (a fixed number, or a range to adapt within); :class:`PartsController` is the
state that adapts it, one per direction per store adapter
(:class:`~cairn.stores.ObstoreStore`).

The controller grows the parts in flight while each part keeps its own rate, and
shrinks them when the store pushes back:

* a *round* is as many completed parts as the current limit; at its end the median
  rate per part is compared with the median of the last round at a lower limit. If it
  holds (at least :data:`HOLD` of it), the link had room: the limit doubles, up to
  ``maximum``. If it fell, the parts share a bottleneck: the limit goes back to the
  last level that held, and stays there for :data:`SETTLE_ROUNDS` rounds before it
  probes upwards again;
* a failure worth retrying (throttling, a timeout, a 5xx: a
  :class:`~cairn.errors.TransientStoreError`) halves the limit, down to ``minimum``,
  and starts a new round.

Invariants: ``minimum <= limit <= maximum`` at all times, so the bytes one object holds
in flight never exceed ``maximum`` times the part size; the controller reads no clock
(its callers time the parts), so the same sequence of completions and failures always
gives the same limits.
"""

from __future__ import annotations

import dataclasses
import statistics

from cairn.errors import InvalidInputError
from cairn.format._validate import is_int

__all__ = ["HOLD", "SETTLE_ROUNDS", "PartsController", "PartsInFlight", "parts_setting"]

HOLD = 0.8
"""A round at a higher limit "holds" when its median rate per part is at least this
fraction of the last lower level's: more parts then moved more bytes."""

SETTLE_ROUNDS = 4
"""Rounds a controller stays at a level after a probe above it failed to hold."""


@dataclasses.dataclass(frozen=True)
class PartsInFlight:
    """Parts of one object in flight at once: where to start, and the range to adapt in.

    ``PartsInFlight.fixed(n)`` (or a plain ``n`` wherever a setting is accepted) never
    adapts. The bytes one object holds in flight are at most ``maximum`` times the part
    size (8 MiB for uploads, 4 MiB for the pieces of a large ranged read).

    Args:
        initial: Parts in flight for the first transfer.
        minimum: The fewest parts in flight the controller shrinks to.
        maximum: The most parts in flight the controller grows to.

    Raises:
        InvalidInputError: A value that is not an int >= 1, or not
            ``minimum <= initial <= maximum``.
    """

    initial: int = 8
    minimum: int = 2
    maximum: int = 16

    def __post_init__(self) -> None:
        for name in ("initial", "minimum", "maximum"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InvalidInputError(f"PartsInFlight.{name} must be an int >= 1, got {value!r}")
        if not self.minimum <= self.initial <= self.maximum:
            raise InvalidInputError(
                "PartsInFlight needs minimum <= initial <= maximum, got "
                f"minimum={self.minimum}, initial={self.initial}, maximum={self.maximum}"
            )

    @classmethod
    def fixed(cls, parts: int) -> PartsInFlight:
        """Always ``parts`` in flight.

        Args:
            parts: The parts in flight, an int >= 1.

        Returns:
            The setting.

        Raises:
            InvalidInputError: ``parts`` is not an int >= 1.
        """
        if not is_int(parts) or parts < 1:
            raise InvalidInputError(f"parts_in_flight must be an int >= 1, got {parts!r}")
        return cls(parts, parts, parts)

    @property
    def adaptive(self) -> bool:
        """Whether the parts in flight may change (``minimum < maximum``)."""
        return self.minimum < self.maximum


def parts_setting(value: object) -> PartsInFlight:
    """``value`` as a :class:`PartsInFlight`: None is the default, an int a fixed number.

    Raises :class:`InvalidInputError` naming the value for anything else.
    """
    if value is None:
        return PartsInFlight()
    if isinstance(value, PartsInFlight):
        return value
    if is_int(value):
        return PartsInFlight.fixed(value)
    raise InvalidInputError(
        f"parts_in_flight must be an int >= 1, a PartsInFlight or None, got {value!r}"
    )


class PartsController:
    """The parts in flight for the next transfer, adapted to how the last ones went.

    Not thread-safe, and needs not be: it is updated from one event loop, and a lost
    update costs one sample, never a limit outside ``[minimum, maximum]``.

    Args:
        setting: Where to start and the range to adapt in.
    """

    def __init__(self, setting: PartsInFlight) -> None:
        self.setting = setting
        self._limit = setting.initial
        self._rates: list[float] = []
        # The median rate per part of the last round at each level that held.
        self._held: dict[int, float] = {}
        self._settle = 0

    @property
    def limit(self) -> int:
        """Parts to have in flight now."""
        return self._limit

    def completed(self, nbytes: int, seconds: float) -> None:
        """One part of ``nbytes`` finished, ``seconds`` after it started.

        Args:
            nbytes: Its size.
            seconds: How long it took, > 0 (a shorter time counts as a microsecond).
        """
        if not self.setting.adaptive:
            return
        self._rates.append(nbytes / max(seconds, 1e-6))
        if len(self._rates) >= self._limit:
            self._end_round(statistics.median(self._rates))

    def completed_together(self, parts: int, nbytes: int, seconds: float, in_flight: int) -> None:
        """A transfer of ``parts`` parts and ``nbytes`` bytes, at most ``in_flight`` at
        once, took ``seconds``: each part counts as having taken its share of the time
        (``seconds`` times the parts that ran at once, over ``parts``).

        Args:
            parts: The parts the transfer had, >= 1.
            nbytes: The bytes it moved.
            seconds: How long it took.
            in_flight: The most parts it had in flight at once.
        """
        if parts < 1:
            return
        at_once = max(1, min(parts, in_flight))
        for _ in range(parts):
            self.completed(nbytes // parts, seconds * at_once / parts)

    def failed(self) -> None:
        """A transfer failed in a way worth retrying (throttling, a timeout, a 5xx)."""
        if not self.setting.adaptive:
            return
        self._limit = max(self.setting.minimum, self._limit // 2)
        self._rates.clear()
        self._settle = SETTLE_ROUNDS

    def _end_round(self, rate: float) -> None:
        self._rates.clear()
        lower = max((level for level in self._held if level < self._limit), default=None)
        if lower is not None and rate < HOLD * self._held[lower]:
            # More parts moved no more bytes: back to the level that held, and stay.
            self._limit = lower
            self._settle = SETTLE_ROUNDS
            return
        self._held[self._limit] = rate
        if self._settle > 0:
            self._settle -= 1
            return
        self._limit = min(self.setting.maximum, self._limit * 2)
