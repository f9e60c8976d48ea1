"""Retry policies the tests share.

``FAST_RETRY`` is the suite's default: three attempts with millisecond backoff, so a
test that injects a transient fault sees it retried without waiting. ``NO_RETRY`` makes
a single attempt, for tests where the first failure must reach the caller.
"""

from __future__ import annotations

from cairn import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.01)
NO_RETRY = RetryPolicy(attempts=1)
