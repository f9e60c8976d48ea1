"""A fault-injecting, call-recording :class:`cairn.stores.Store` wrapper for tests.

It wraps a real store and, per its plan, fails the k-th call, raises bursts of transient
errors, corrupts or truncates the bytes it returns, adds latency, loses the replies of
writes that did land (:class:`PutFault`), and records every call as
:class:`support.recording.RecordingStore` does (counts, order, the peak in flight).
Faults are raised as the store boundary would raise them (:class:`TransientStoreError`
for a network fault), so the code under test sees exactly what it would see from a
failing store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from cairn.errors import StoreError, TransientStoreError
from cairn.format._buffer import Buffer
from cairn.stores import Blob, IfMatch, PutMode, Store, StoreMethod

from .recording import OP_NAMES, RecordingStore

T = TypeVar("T")

PutKind = Literal["overwrite", "create", "if_match"]
"""A put's mode, as :class:`PutFault` matches it (``put_stream`` is an overwrite)."""

PutStep = Literal["pass", "fail", "lose"]
"""What a :class:`PutFault` does to one matching put: nothing; a transient failure
before the put reaches the store; or apply the put, then lose its reply."""

CONDITIONAL_PUTS: frozenset[PutKind] = frozenset({"create", "if_match"})


def put_kind(mode: PutMode) -> PutKind:
    """The :data:`PutKind` of a put ``mode``."""
    return "if_match" if isinstance(mode, IfMatch) else mode


@dataclass
class PutFault:
    """A script of faults for the puts whose path contains ``path_contains`` and whose
    mode is one of ``kinds``: the i-th such call (from 1, retries included, since every
    attempt reaches the wrapper) suffers ``steps[i - 1]``; calls past the script pass.

    ``fired`` records, per matching call, ``(call number, path, kind, what happened)``:
    ``"lost"`` (the put landed, its reply was replaced by a TransientStoreError),
    ``"failed"`` (it never reached the store), ``"passed"``, or ``"refused: <error
    type>"`` when the store refused the put (for a ``"lose"`` step there was then no
    reply to lose, so that error goes through unchanged).
    """

    path_contains: str
    steps: Sequence[PutStep] = ("lose",)
    kinds: frozenset[PutKind] = CONDITIONAL_PUTS
    fired: list[tuple[int, str, PutKind, str]] = field(default_factory=list)

    def matches(self, path: str, kind: PutKind) -> bool:
        """Whether a put of ``kind`` to ``path`` is one this script counts."""
        return self.path_contains in path and kind in self.kinds

    def next_step(self) -> PutStep:
        """The step for the next matching call (and count it)."""
        index = len(self.fired)
        return self.steps[index] if index < len(self.steps) else "pass"

    @property
    def lost(self) -> int:
        """How many replies of puts that landed this script has lost."""
        return sum(1 for *_, what in self.fired if what == "lost")


class InjectedCrash(BaseException):
    """Raised by a ``crash_at`` fault: derives from BaseException like a kill would stop code."""


@dataclass
class FaultPlan:
    """What to break. Call numbers count every store call from 1, across all operations."""

    fail_calls: dict[int, Exception] = field(default_factory=dict)
    crash_at: int | None = None
    transient_burst: int = 0
    transient_ops: frozenset[str] = frozenset()
    corrupt_reads: set[str] = field(default_factory=set)
    truncate_reads: set[str] = field(default_factory=set)
    latency: float = 0.0
    fail_puts_matching: str | None = None
    lose_put_responses_matching: str | None = None
    put_faults: list[PutFault] = field(default_factory=list)
    before_call: Callable[[str, str], Awaitable[None]] | None = None


class FaultyStore(RecordingStore):
    """A :class:`Store` that forwards to ``inner``, records every call as a
    :class:`~support.recording.RecordingStore` does, and injects the faults of ``plan``."""

    def __init__(self, inner: Store, plan: FaultPlan | None = None) -> None:
        super().__init__(inner)
        self.plan = plan if plan is not None else FaultPlan()

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        kind = put_kind(mode) if mode is not None else None
        number = self.record(operation, path)
        op = OP_NAMES.get(operation, operation)
        plan = self.plan
        if plan.crash_at is not None and number >= plan.crash_at:
            raise InjectedCrash(f"crash injected at call {number} ({op} {path})")
        if number in plan.fail_calls:
            raise plan.fail_calls[number]
        if plan.transient_burst > 0 and (not plan.transient_ops or op in plan.transient_ops):
            plan.transient_burst -= 1
            raise TransientStoreError(op, path, "injected transient fault")
        if plan.fail_puts_matching is not None and op == "put" and plan.fail_puts_matching in path:
            raise StoreError(op, path, "injected permanent fault")
        if plan.before_call is not None:
            await plan.before_call(op, path)
        scripted = [
            (fault, fault.next_step())
            for fault in plan.put_faults
            if kind is not None and fault.matches(path, kind)
        ]
        steps = {step for _, step in scripted}

        def record(outcome: Callable[[PutStep], str]) -> None:
            for fault, step in scripted:
                fault.fired.append((number, path, kind or "overwrite", outcome(step)))

        if "fail" in steps:
            record(lambda _: "failed")
            raise TransientStoreError(op, path, "injected: the write did not reach the store")
        with self.flying(op):
            if plan.latency:
                await asyncio.sleep(plan.latency)
            try:
                result = await call()
            except BaseException as exc:
                refused = f"refused: {type(exc).__name__}"
                record(lambda _: refused)
                raise
            record(lambda step: "lost" if step == "lose" else "passed")
            if "lose" in steps:
                raise TransientStoreError(
                    op, path, "injected: the write landed, its reply was lost"
                )
            lose = plan.lose_put_responses_matching
            if op == "put" and lose is not None and lose in path:
                plan.lose_put_responses_matching = None  # once: the retry gets an answer
                raise TransientStoreError(
                    op, path, "injected: the write landed, its reply was lost"
                )
            return result

    def _mangle(self, path: str, data: Buffer) -> Buffer:
        raw = bytes(data)
        if path in self.plan.corrupt_reads and raw:
            raw = bytes([raw[0] ^ 0x01]) + raw[1:]
            return raw
        if path in self.plan.truncate_reads:
            return raw[: len(raw) // 2]
        return data

    async def get(self, path: str) -> Blob:
        blob = await super().get(path)
        return Blob(data=self._mangle(path, blob.data), info=blob.info)

    async def get_range(self, path: str, start: int, end: int) -> Buffer:
        return self._mangle(path, await super().get_range(path, start, end))
