"""Bounded concurrency for store calls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def bounded_gather(limit: int, jobs: Iterable[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run ``jobs`` with at most ``limit`` in flight; results keep the order of ``jobs``.

    Only ``limit`` worker tasks exist, so a 10,000-artifact save does not create 10,000
    pending tasks. On the first failure no further job starts, and the failure is raised
    once the jobs already in flight (at most ``limit - 1``) have ended: cancelling a Python
    await does not stop a request obstore has handed to its runtime, so waiting is what
    guarantees that nothing of this call still lands in the store after it raised, and
    that a clean-up after the failure sees every object written.
    """
    pending = list(jobs)
    results: list[T | None] = [None] * len(pending)
    queue = iter(enumerate(pending))
    failures: list[BaseException] = []

    async def worker() -> None:
        for index, job in queue:
            if failures:
                return
            try:
                results[index] = await job()
            except BaseException as exc:  # re-raised below, after the others settle
                failures.append(exc)
                return

    await asyncio.gather(*(worker() for _ in range(min(limit, len(pending)))))
    if failures:
        raise failures[0]
    return results  # type: ignore[return-value]
