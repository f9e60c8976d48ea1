"""Lost replies: a conditional write lands, but its caller never hears so.

The writes whose ambiguity the protocol must resolve are the create-only manifest write
(the commit, and GC's claim of an abandoned id with a tombstone manifest) and the
compare-and-swap of ``_latest``. Here the fault store (:class:`faults.PutFault`) applies
such a write, then raises :class:`TransientStoreError` as if the reply had been lost on
the way back (sometimes after, or before, a transient failure of the same write, and
sometimes at both points of one save), so the retry machinery meets its own write.

The properties checked, against the store contents read back without faults:

* ``save`` reports success exactly when the checkpoint is committed: a returned manifest
  is the stored one, byte for byte, and the checkpoint loads with the bytes that were
  saved (every link of every chain); a save that raised left no manifest and nothing
  under its directory (``save`` documents no "maybe committed" outcome: "nothing of the
  checkpoint is visible unless this returns", FencedError aside);
* ``_latest`` never moves backwards: its ``(epoch, id)`` never decreases from one save to
  the next, and after a successful save it is at least that checkpoint;
* ``load_latest`` follows its docstring (see :func:`documented_latest`);
* a GC afterwards, with a random policy, leaves every checkpoint it did not delete
  loading and verifying, whole chains included, and ``_latest`` naming a committed one;
  an abandoned directory it claims (reply lost) ends as a lone tombstone.

Every property holds with retries to spare and when they run out: a write whose reply
was lost is resolved by reading back, and a pointer swap that fails after the commit
leaves ``_latest`` behind (a hint) but checks the fence instead of failing the save.

The randomized trials are seeded; a failure names its seed, and
``CAIRN_LOST_REPLY_SEEDS=start:stop`` runs another range of seeds in each randomized test.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from obstore.store import LocalStore, MemoryStore, ObjectStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore, PutFault, PutKind, PutStep
from support.policies import NO_RETRY
from support.samples import expected_artifacts, sample

from cairn import (
    CheckpointData,
    CheckpointId,
    FencedError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    RetryPolicy,
    SourceOffsetEntry,
    TransientStoreError,
)
from cairn.data import ArtifactKey
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest, encode_manifest
from cairn.protocol._pointer import LatestPointer, read_pointer
from cairn.stores import ObstoreStore, Store

MANIFEST = "/manifest.json"
LATEST = "_latest"
LATEST_PATH = CheckpointPaths().latest_pointer()
NO_POINTER = LatestPointer(None)
KEYS: list[ArtifactKey] = [(f"op{o}", p) for o in range(2) for p in range(3)]

# Fault scripts for the successive matching puts of one point of one save. Every retry
# reaches the fault store, so ("lose", "fail") loses the reply of the write that landed,
# then fails its first retry before it reaches the store.
SCRIPTS: list[tuple[PutStep, ...]] = [
    ("lose",),
    ("lose",),
    ("fail", "lose"),
    ("lose", "fail"),
    ("lose", "lose"),
    ("fail", "lose", "fail"),
]


class ReportedFailureButCommitted(AssertionError):
    """``save`` raised, yet its manifest is in the store: the defect the report describes."""


# -- one trial ---------------------------------------------------------------------------


@dataclass
class SaveRecord:
    """One save of a trial: what was asked, what was injected, what ``save`` reported."""

    data: CheckpointData
    chains: dict[ArtifactKey, list[bytes]]
    faults: list[PutFault]
    attempts: int
    manifest: CheckpointManifest | None = None
    error: BaseException | None = None
    pointer_after: LatestPointer | None = None

    def describe(self) -> str:
        """One line for a failure message."""
        kind = "incremental" if self.data.parent_id else "full"
        fired = [(f.path_contains, [what for *_, what in f.fired]) for f in self.faults]
        result = "ok" if self.error is None else f"raised {self.error!r}"
        return (
            f"{self.data.id} epoch={self.data.epoch} {kind} attempts={self.attempts} "
            f"faults={fired} -> {result}"
        )


@dataclass
class Trial:
    """A seeded sequence of saves under lost replies, then a GC, on one store.

    Each save is full, or incremental on the last save that reported success; its epoch
    mostly rises, sometimes stays or falls. With ``spare_retries`` every write gets one
    more attempt than it has faults; otherwise 1 to 3 attempts, so retries can run out.
    """

    seed: int
    inner: Store
    spare_retries: bool
    rng: random.Random = field(init=False)
    saves: list[SaveRecord] = field(default_factory=list)
    policy: RetentionPolicy | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def describe(self) -> str:
        """The whole trial, for a failure message: enough to read what happened."""
        lines = [f"trial seed={self.seed} spare_retries={self.spare_retries}"]
        lines += [f"  save {i}: {s.describe()}" for i, s in enumerate(self.saves)]
        lines += [f"  gc policy: {self.policy}", *(f"  {note}" for note in self.notes)]
        return "\n".join(lines)

    # -- generation ----------------------------------------------------------------------

    def next_epoch(self, previous: int) -> int:
        roll = self.rng.random()
        if roll < 0.7:
            return previous + self.rng.randint(1, 3)
        if roll < 0.85:
            return previous
        return max(0, previous - self.rng.randint(1, 3))

    def next_data(self, epoch: int, parent: SaveRecord | None) -> SaveRecord:
        rng = self.rng
        offsets = {"events": SourceOffsetEntry("gen", {"0": str(epoch * 100)}, epoch)}
        if parent is not None and rng.random() < 0.6:
            carried = sorted(parent.chains)
            deltas = {k: rng.randbytes(rng.randint(1, 300)) for k in carried if rng.random() < 0.5}
            if not deltas:
                deltas = {carried[0]: rng.randbytes(17)}
            fresh = [k for k in KEYS if k not in deltas and rng.random() < 0.2]
            snapshots = {k: rng.randbytes(rng.randint(0, 600)) for k in fresh}
            data = CheckpointData(
                epoch=epoch,
                snapshots=snapshots,
                deltas=deltas,
                parent_id=parent.data.id,
                source_offsets=offsets,
            )
            chains = {
                k: [*v, *([deltas[k]] if k in deltas else [])] for k, v in parent.chains.items()
            }
            chains.update({k: [v] for k, v in snapshots.items()})
        else:
            keys = [k for k in KEYS if rng.random() < 0.6] or [KEYS[0]]
            snapshots = {k: rng.randbytes(rng.randint(0, 600)) for k in keys}
            data = CheckpointData(epoch=epoch, snapshots=snapshots, source_offsets=offsets)
            chains = {k: [v] for k, v in snapshots.items()}
        faults = self.next_faults(first=not self.saves)
        budget = max((sum(s != "pass" for s in f.steps) for f in faults), default=0)
        if self.spare_retries:
            # Never exhausted: every failure of one write gets another attempt.
            attempts = 1 + budget + rng.randint(0, 1)
        else:
            attempts = rng.choice([1, 2, 2, 3])
        return SaveRecord(data=data, chains=chains, faults=faults, attempts=attempts)

    def next_faults(self, first: bool) -> list[PutFault]:
        """Faults for one save: the first save always gets one, at a point that fires."""
        roll = self.rng.random()
        if not first and roll < 0.35:
            return []
        points = [MANIFEST, LATEST]
        if roll < 0.85:
            points = [self.rng.choice(points)]
        return [PutFault(point, steps=self.rng.choice(SCRIPTS)) for point in points]

    # -- running -------------------------------------------------------------------------

    async def run(self, n_saves: int) -> None:
        epoch = self.rng.randint(0, 5)
        parent: SaveRecord | None = None
        for _ in range(n_saves):
            epoch = self.next_epoch(epoch)
            record = self.next_data(epoch, parent)
            self.saves.append(record)
            faulty = FaultyStore(self.inner, FaultPlan(put_faults=record.faults))
            policy = RetryPolicy(attempts=record.attempts, initial_delay=0.0005, max_delay=0.002)
            writer = ObjectStoreCheckpointer(faulty, retry=policy)
            try:
                record.manifest = await writer.save(record.data)
            except Exception as exc:  # recorded and judged against the store below
                record.error = exc
            else:
                parent = record
            record.pointer_after, _, _ = await read_pointer(self.inner, LATEST_PATH)

    async def check(self) -> Counts:
        reader = make_checkpointer(self.inner)
        counts = Counts(trials=1)
        counts.lost = sum(f.lost for s in self.saves for f in s.faults)
        if self.spare_retries:  # else a first transient failure may use the only attempt
            assert counts.lost >= 1, "every trial loses at least one reply"

        # _latest never moves backwards; when no retry ran out it is at least every
        # checkpoint saved so far (a swap that ran out of retries may leave it behind:
        # it is a hint, see load_latest).
        previous = NO_POINTER.order()
        for record in self.saves:
            pointer = record.pointer_after or NO_POINTER
            assert pointer.writer_generation == 0
            assert pointer.order() >= previous, f"_latest moved backwards after {record.data.id}"
            previous = pointer.order()
            if record.manifest is not None and self.spare_retries:
                mine = LatestPointer(record.data.id, record.data.epoch).order()
                assert pointer.order() >= mine, f"_latest is behind the saved {record.data.id}"

        # success <=> committed, and what is committed loads with the bytes saved.
        committed: dict[CheckpointId, int] = {}
        unreported: list[SaveRecord] = []
        for record in self.saves:
            cid = record.data.id
            exists = await reader.exists(cid)
            if record.manifest is not None:
                counts.succeeded += 1
                assert exists, f"save of {cid} returned, but its manifest is not in the store"
                stored = bytes((await self.inner.get(reader.paths.manifest(cid))).data)
                assert stored == encode_manifest(record.manifest), "returned != stored manifest"
                assert record.manifest.checkpoint_id == cid
                assert record.manifest.epoch == record.data.epoch
                assert record.manifest.parent_id == record.data.parent_id
            else:
                # Only transient faults were injected, at two paths: nothing else may surface.
                assert isinstance(record.error, TransientStoreError), repr(record.error)
                assert record.error.path in (reader.paths.manifest(cid), LATEST_PATH)
                if exists:
                    counts.raised_but_committed += 1
                    unreported.append(record)
                else:
                    counts.failed_cleanly += 1
                    left = await self.inner.list(reader.paths.checkpoint_dir(cid))
                    assert left == [], f"failed save of {cid} left {[i.path for i in left]}"
            if exists:
                committed[cid] = record.data.epoch
                await self.assert_loads(reader, record)
        for record in self.saves:
            named = record.pointer_after.checkpoint_id if record.pointer_after else None
            assert named is None or named in committed, f"_latest named uncommitted {named}"
        assert await reader.list_checkpoints() == sorted(committed), "no other commits appeared"
        final = self.saves[-1].pointer_after
        if final is not None:
            assert final.checkpoint_id is not None
            assert final.epoch == committed[final.checkpoint_id], "_latest records its epoch"

        # Strict: every commit's pointer swap completed (no retry ran out).
        strict = self.spare_retries
        await self.assert_load_latest(reader, committed, strict=strict)

        # GC with a random policy: what it keeps still loads, whole chains included.
        rng = self.rng
        self.policy = RetentionPolicy(
            keep_last=rng.randint(1, 3),
            keep_every_n_epochs=rng.choice([None, None, 2, 3]),
        )
        # Sometimes a crashed save left a directory that GC must claim (a create-only
        # write of a tombstone manifest) before it sweeps it: that reply is lost too.
        gc_store: Store = self.inner
        claim: PutFault | None = None
        abandoned = CheckpointId.now()
        if rng.random() < 0.5:
            await self.inner.put(reader.paths.snapshot(abandoned, "op0", 0), b"abandoned")
            claim = PutFault(MANIFEST, steps=rng.choice(SCRIPTS), kinds=frozenset({"create"}))
            gc_store = FaultyStore(self.inner, FaultPlan(put_faults=[claim]))
            self.notes.append(f"gc claims abandoned {abandoned} with faults {claim.steps}")
        gc_policy = RetryPolicy(attempts=1 + len(claim.steps) if claim else 1)
        gc_writer = ObjectStoreCheckpointer(gc_store, retry=gc_policy)
        result = await gc_writer.gc(self.policy, min_age=dt.timedelta(0))
        assert result.failures == []
        if claim is not None:
            assert claim.lost == 1 and outcomes(claim)[-1] == "refused: ObjectExistsError"
            left = await self.inner.list(reader.paths.checkpoint_dir(abandoned))
            tombstone = reader.paths.manifest(abandoned)
            assert [(i.path, i.size) for i in left] == [(tombstone, 0)], "claimed and swept"
            assert not await reader.exists(abandoned)
            counts.claims_lost += 1
        after = await reader.list_checkpoints()
        assert set(after) <= set(committed)
        assert set(result.deleted) == set(committed) - set(after)
        ranked = sorted(committed, key=lambda c: (committed[c], c))
        kept = set(ranked[-(self.policy.keep_last or 0) :])
        if final is not None and final.checkpoint_id is not None:
            kept.add(final.checkpoint_id)
        every = self.policy.keep_every_n_epochs
        kept |= {c for c, e in committed.items() if every and e % every == 0}
        assert kept <= set(after), f"gc deleted kept checkpoints {sorted(kept - set(after))}"
        by_id = {record.data.id: record for record in self.saves}
        for cid in after:
            await self.assert_loads(reader, by_id[cid])
        after_gc, _, _ = await read_pointer(self.inner, LATEST_PATH)
        assert after_gc == final, "gc does not move _latest"
        assert after_gc is None or after_gc.checkpoint_id in after, "_latest survives gc"
        kept_epochs = {c: committed[c] for c in after}
        await self.assert_load_latest(reader, kept_epochs, strict=strict)
        counts.gc_deleted = len(result.deleted)
        counts.unreported = [f"seed {self.seed}: {record.describe()}" for record in unreported]
        return counts

    async def assert_loads(self, reader: ObjectStoreCheckpointer, record: SaveRecord) -> None:
        loaded = await reader.load(record.data.id)
        chains = {k: [bytes(link.data) for link in links] for k, links in loaded.chains.items()}
        assert chains == record.chains, f"{record.data.id} does not load the bytes saved"
        assert loaded.source_offsets == record.data.source_offsets

    async def assert_load_latest(
        self, reader: ObjectStoreCheckpointer, committed: dict[CheckpointId, int], strict: bool
    ) -> None:
        pointer, _, _ = await read_pointer(self.inner, LATEST_PATH)
        expected = documented_latest(pointer, committed)
        loaded = await reader.load_latest()
        assert (loaded.checkpoint_id if loaded else None) == expected, "load_latest"
        if strict and committed:
            # Every commit's swap completed: then the documented rule is the plain one.
            assert expected == max(committed, key=lambda c: (committed[c], c))


def documented_latest(
    pointer: LatestPointer | None, committed: dict[CheckpointId, int]
) -> CheckpointId | None:
    """What ``load_latest`` returns, per its docstring, when every commit loads.

    It "follows ``_latest`` when it names a valid checkpoint and no checkpoint with a
    newer id is committed"; otherwise it falls back to the committed checkpoints "newest
    first (by writer generation, then epoch, then id)" (every generation is 0 here). So
    a checkpoint with an older id but a higher epoch, committed by a save whose pointer
    swap never happened, is returned only through the fallback.
    """
    if not committed:
        return None
    named = pointer.checkpoint_id if pointer is not None else None
    if named is not None and named in committed and not any(c > named for c in committed):
        return named
    return max(committed, key=lambda c: (committed[c], c))


@dataclass
class Counts:
    """What a set of trials exercised (printed, and checked to be non-trivial)."""

    trials: int = 0
    lost: int = 0
    succeeded: int = 0
    failed_cleanly: int = 0
    raised_but_committed: int = 0
    gc_deleted: int = 0
    claims_lost: int = 0
    unreported: list[str] = field(default_factory=list, repr=False)

    def add(self, other: Counts) -> None:
        """Add ``other``'s counts to these."""
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


async def run_trials(
    seeds: Sequence[int], make_store: Callable[[int], ObjectStore], spare_retries: bool
) -> Counts:
    """Run one trial per seed; every property but "raised => not committed" is asserted
    here, that one is returned (``unreported``) for the caller to judge."""
    totals = Counts()
    started = time.perf_counter()
    for seed in seeds:
        trial = Trial(seed, ObstoreStore(make_store(seed)), spare_retries)
        try:
            await trial.run(n_saves=trial.rng.randint(3, 6))
            totals.add(await trial.check())
        except Exception as exc:  # any failure, with the seed and the trial that found it
            raise AssertionError(f"{exc!r}\n{trial.describe()}") from exc
    print(
        f"{totals.trials} trials (seeds {seeds[0]}..{seeds[-1]}) in "
        f"{time.perf_counter() - started:.1f}s: {totals}"
    )
    return totals


def seed_range(default: range) -> range:
    """``default``, or the range ``CAIRN_LOST_REPLY_SEEDS=start:stop`` asks for."""
    asked = os.environ.get("CAIRN_LOST_REPLY_SEEDS")
    if not asked:
        return default
    start, stop = asked.split(":")
    return range(int(start), int(stop))


def memory(_: int) -> ObjectStore:
    return MemoryStore()


def local_under(root: Path) -> Callable[[int], ObjectStore]:
    def make(seed: int) -> ObjectStore:
        directory = root / f"trial-{seed}"
        directory.mkdir()
        return LocalStore(directory)

    return make


# -- randomized trials -------------------------------------------------------------------


def all_saves(counts: Counts) -> int:
    return counts.succeeded + counts.failed_cleanly + counts.raised_but_committed


async def test_lost_replies_with_retries_to_spare() -> None:
    """120 trials on memory; each failing write gets another attempt, so every lost
    reply is absorbed: every save succeeds, and every property holds."""
    seeds = seed_range(range(0, 120))
    counts = await run_trials(seeds, memory, spare_retries=True)
    assert counts.succeeded == all_saves(counts), "a lost reply that a retry covers is invisible"
    assert counts.lost >= len(seeds) and counts.gc_deleted > 0 and counts.claims_lost > 0


async def test_lost_replies_with_retries_to_spare_on_local(tmp_path: Path) -> None:
    """The same on local directories, whose compare-and-swap is a locked read-and-rename."""
    seeds = seed_range(range(1000, 1020))
    counts = await run_trials(seeds, local_under(tmp_path), spare_retries=True)
    assert counts.succeeded == all_saves(counts)
    assert counts.lost >= len(seeds) and counts.gc_deleted > 0


async def test_lost_replies_when_retries_run_out() -> None:
    """60 trials on memory with 1 to 3 attempts per write, so some saves run out of
    retries. Every property but one is asserted in every trial; the last assertion is
    "a save that raised left no manifest", which fails today."""
    seeds = seed_range(range(5000, 5060))
    counts = await run_trials(seeds, memory, spare_retries=False)
    assert counts.failed_cleanly > 0 and counts.succeeded > 0 and counts.lost >= len(seeds)
    if counts.unreported:
        raise ReportedFailureButCommitted("\n".join(counts.unreported))


async def test_lost_replies_when_retries_run_out_on_local(tmp_path: Path) -> None:
    """The same, 12 trials on local directories."""
    seeds = seed_range(range(6000, 6012))
    counts = await run_trials(seeds, local_under(tmp_path), spare_retries=False)
    assert counts.failed_cleanly + counts.raised_but_committed > 0
    if counts.unreported:
        raise ReportedFailureButCommitted("\n".join(counts.unreported))


# -- each lost-reply point, exactly ------------------------------------------------------

# What the fault store records for a script on one conditional write, ending with the
# store's answer to the retry that meets the write which did land.
EXACT: list[tuple[tuple[PutStep, ...], list[str]]] = [
    (("lose",), ["lost"]),
    (("fail", "lose"), ["failed", "lost"]),
    (("lose", "fail"), ["lost", "failed"]),
]


def outcomes(fault: PutFault) -> list[str]:
    return [what for *_, what in fault.fired]


def puts_to(store: FaultyStore, path: str) -> int:
    return sum(1 for op, p in store.log if op == "put" and p == path)


async def assert_saved_exactly(
    reader: ObjectStoreCheckpointer, manifest: CheckpointManifest, epoch: int
) -> None:
    """``manifest`` is committed as returned, loads the bytes of ``sample(epoch)``, and
    its directory holds exactly its artifacts and its manifest."""
    cid = manifest.checkpoint_id
    paths = await reader.resolve_paths()
    stored = bytes((await reader.store.get(paths.manifest(cid))).data)
    assert stored == encode_manifest(manifest)
    loaded = await reader.load(cid)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == expected_artifacts(epoch)
    listed = {info.path for info in await reader.store.list(paths.checkpoint_dir(cid))}
    wanted = {artifact_path(paths, manifest, op, p) for op, p in expected_artifacts(epoch)}
    assert listed == wanted | {paths.manifest(cid)}


@pytest.mark.parametrize(("steps", "fired"), EXACT)
async def test_lost_reply_of_the_manifest_create(
    raw_store: ObjectStore, steps: tuple[PutStep, ...], fired: list[str]
) -> None:
    """The commit landed, its reply was lost: the retry meets "already exists", reads the
    manifest back, finds its own bytes, and the save succeeds and advances _latest."""
    inner = ObstoreStore(raw_store)
    fault = PutFault(MANIFEST, steps=steps, kinds=frozenset({"create"}))
    faulty = FaultyStore(inner, FaultPlan(put_faults=[fault]))
    data = sample(1)
    manifest = await make_checkpointer(faulty).save(data)
    reader = make_checkpointer(inner)
    assert manifest.checkpoint_id == data.id and manifest.epoch == 1
    assert outcomes(fault) == [*fired, "refused: ObjectExistsError"]
    assert puts_to(faulty, (await reader.resolve_paths()).manifest(data.id)) == len(fired) + 1
    await assert_saved_exactly(reader, manifest, 1)
    pointer, _, _ = await read_pointer(inner, LATEST_PATH)
    assert pointer == LatestPointer(data.id, 1, 0)
    assert await reader.list_checkpoints() == [data.id]


@pytest.mark.parametrize(("steps", "fired"), EXACT)
@pytest.mark.parametrize("swap", ["create", "if_match"])
async def test_lost_reply_of_the_latest_swap(
    raw_store: ObjectStore, steps: tuple[PutStep, ...], fired: list[str], swap: str
) -> None:
    """The swap of _latest landed, its reply was lost: the retry is refused (the pointer
    is no longer what it compared against), the re-read finds our own pointer, and the
    save succeeds without another write. ``create`` is the first save's pointer,
    ``if_match`` a later one's."""
    inner = ObstoreStore(raw_store)
    reader = make_checkpointer(inner)
    earlier = await reader.save(sample(1)) if swap == "if_match" else None
    kind: frozenset[PutKind] = frozenset({"create" if swap == "create" else "if_match"})
    fault = PutFault(LATEST, steps=steps, kinds=kind)
    faulty = FaultyStore(inner, FaultPlan(put_faults=[fault]))
    data = sample(2)
    manifest = await make_checkpointer(faulty).save(data)
    refusal = "ObjectExistsError" if swap == "create" else "PreconditionFailedError"
    assert outcomes(fault) == [*fired, f"refused: {refusal}"]
    assert puts_to(faulty, LATEST_PATH) == len(fired) + 1, "no swap after the re-read"
    await assert_saved_exactly(reader, manifest, 2)
    pointer, _, _ = await read_pointer(inner, LATEST_PATH)
    assert pointer == LatestPointer(data.id, 2, 0)
    if earlier is not None:
        await assert_saved_exactly(reader, earlier, 1)
    assert await reader.list_checkpoints() == sorted(
        [data.id, *([earlier.checkpoint_id] if earlier else [])]
    )


# -- the defect: retries that run out after the commit point -----------------------------


@pytest.mark.parametrize(
    ("point", "steps"),
    [(MANIFEST, ("lose",)), (LATEST, ("lose",)), (LATEST, ("fail",))],
    ids=["manifest-reply-lost", "latest-reply-lost", "latest-not-reached"],
)
async def test_exhausted_retries_after_the_commit_point(
    point: str, steps: tuple[PutStep, ...]
) -> None:
    """Minimal reproduction: one attempt per write, one fault at or after the commit.

    ``manifest-reply-lost``: the manifest landed; ``commit`` sees it exists, so it does
    not clean up, but re-raises. ``latest-*``: the manifest landed and the pointer swap
    raised (after landing, or before reaching the store); ``commit`` lets it through.
    Either way ``save`` raises, yet the checkpoint is committed and loads (and in
    ``latest-reply-lost`` even ``_latest`` names it). Passes once ``save`` reports
    success exactly when it committed, whichever way the fix goes.
    """
    inner = ObstoreStore(MemoryStore())
    fault = PutFault(point, steps=steps)
    faulty = FaultyStore(inner, FaultPlan(put_faults=[fault]))
    writer = make_checkpointer(faulty, retry=NO_RETRY)
    data = sample(1)
    try:
        await writer.save(data)
    except TransientStoreError as exc:
        error: TransientStoreError | None = exc
    else:
        error = None
    assert outcomes(fault) == ["lost" if steps == ("lose",) else "failed"]
    reader = make_checkpointer(inner)
    committed = await reader.exists(data.id)
    pointer, _, _ = await read_pointer(inner, LATEST_PATH)
    if committed:
        loaded = await reader.load(data.id)  # what is committed loads, either way
        assert {k: bytes(v) for k, v in loaded.artifacts.items()} == expected_artifacts(1)
    if error is not None and committed:
        named = pointer is not None and pointer.checkpoint_id == data.id
        raise ReportedFailureButCommitted(
            f"save raised {error!r}, yet {data.id} is committed"
            + (" and _latest names it" if named else "")
        )
    if error is not None:
        assert pointer is None, "_latest names a failed save"
        assert await inner.list(reader.paths.checkpoint_dir(data.id)) == []
    else:
        assert committed, "save returned, so its checkpoint is committed"


async def test_takeover_while_the_latest_swap_fails() -> None:
    """The same defect, where it also breaks fencing: a takeover lands just before the old
    writer's pointer swap, which then fails (one attempt). The swap is where the old
    writer would have learnt it was fenced and rolled its commit back; instead ``save``
    raises TransientStoreError and the fenced commit stays committed, newest of all."""
    inner = ObstoreStore(MemoryStore())
    new = make_checkpointer(inner)
    base = await new.save(sample(0))
    fired: list[int] = []

    async def takeover_before_the_swap(op: str, path: str) -> None:
        if op == "put" and path == LATEST_PATH and not fired:
            fired.append(await new.take_over())

    fault = PutFault(LATEST, steps=("fail",))
    plan = FaultPlan(before_call=takeover_before_the_swap, put_faults=[fault])
    old = make_checkpointer(FaultyStore(inner, plan), retry=NO_RETRY)
    data = sample(7)
    try:
        await old.save(data)
    except (TransientStoreError, FencedError) as exc:
        error: Exception | None = exc
    else:
        error = None
    assert fired == [1] and outcomes(fault) == ["failed"]
    committed = await new.exists(data.id)
    if error is not None and committed:
        latest = await new.load_latest()
        raise ReportedFailureButCommitted(
            f"save raised {error!r}, yet the fenced {data.id} is committed; "
            f"load_latest returns {latest.checkpoint_id if latest else None}"
        )
    assert error is not None, "a fenced writer's save does not succeed"
    left = await inner.list(new.paths.checkpoint_dir(data.id))
    # Rolled back: the id retired (a tombstone, so nothing can commit it again), the rest gone.
    assert not committed and [(i.path, i.size) for i in left] == [(new.paths.manifest(data.id), 0)]
    assert await new.read_latest() == base.checkpoint_id
