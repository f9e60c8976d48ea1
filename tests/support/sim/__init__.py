"""A deterministic simulator of cairn's protocol code: see :mod:`support.sim.world`."""

from .scheduler import Faults
from .world import Outcome, run

__all__ = ["Faults", "Outcome", "run"]
