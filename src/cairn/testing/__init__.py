"""Test suites shipped with cairn, to run against your own code.

:class:`StoreContract` holds the rules every :class:`cairn.stores.Store` (a backend or a
wrapper) must keep; subclass it in a test module to check a store. This package needs
pytest and pytest-asyncio (``pip install 'cairn-checkpoint[test]'``); cairn itself never imports it.
"""

from __future__ import annotations

from cairn.testing.store import StoreContract

__all__ = ["StoreContract"]
