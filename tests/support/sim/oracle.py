"""The oracle: what must hold after every step, judged from what each actor was told.

The oracle sees every change before the store makes it (:meth:`Oracle.before_write`,
:meth:`Oracle.before_delete`), every listing, every crash, and what actors report
(saves started and their outcomes, what readers loaded). From that it keeps, per store,
the manifests that exist and the objects each names, and it flags:

* **a manifest that names a missing artifact**, the moment it is written or the moment
  one of its objects is deleted; and an object a manifest names replaced by other bytes
  (committed means immutable). The only exemption is a forced ``delete_checkpoint``,
  whose documented effect is to break what builds on it;
* **a checkpoint reported committed that goes away**: its manifest deleted by anyone
  but a ``delete_checkpoint`` of it or a GC whose policy did not keep it (judged from
  the listing that GC planned from);
* **a load that is not what was saved**: what a reader gets must verify (cairn checks
  the digests) and equal, chain by chain and byte for byte, the data of the save that
  was told it committed (or, when no save was told, of one that tried that id);
* **two saves told they committed one id** with different data;
* **a fenced writer's commit returned by** ``load_latest`` that started after the
  takeover completed: a checkpoint of an older generation whose manifest was written
  after the takeover claimed ``_latest``;
* **GC deleting what a live save names**: an object of an uncommitted, unclaimed
  directory whose save runs, or an artifact of the parent that save carries, deleted by
  anyone but that save's own processes;
* **``load_latest`` returning None** while a checkpoint it admits existed throughout.

A violation is a line of text; the run fails with the seed and the trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cairn import CheckpointId, CheckpointPaths, LoadedCheckpoint, RetentionPolicy
from cairn.errors import CorruptManifestError, IntegrityError
from cairn.format.manifest import CheckpointManifest, SourceOffsetEntry, decode_root
from cairn.protocol._pointer import WriterRecord, decode_pointer, decode_writer

from .scheduler import ACTOR

if TYPE_CHECKING:
    from .scheduler import Actor, Scheduler
    from .store import SimObject, SimStore

__all__ = ["Expected", "Oracle"]

Chains = Mapping[tuple[str, int], tuple[bytes, ...]]


@dataclass(frozen=True)
class Expected:
    """What loading a checkpoint must give: each partition's chain, base first, and the
    source offsets."""

    chains: Chains
    offsets: Mapping[str, SourceOffsetEntry] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{op}/{p}:{len(c)} link(s)" for (op, p), c in sorted(self.chains.items()))


@dataclass(eq=False)
class Attempt:
    """One save of one checkpoint id: by whom, what it holds, how it ended."""

    actors: frozenset[str]
    store: SimStore
    cid: CheckpointId
    expected: Expected
    parent: CheckpointId | None
    parent_named: frozenset[str]
    started: int
    outcome: str = "running"
    written: set[str] = field(default_factory=set)
    """What its processes wrote in its directory while it ran."""
    leased: bool = False
    """Whether its intent was written (the lease that protects it began)."""
    parent_writer: str = "?"
    """The actor that committed its parent (which may roll that commit back, fenced:
    a save is never admitted to build on such a parent)."""
    created: bool = False
    """Whether one of its processes wrote its manifest (from then on the rules of a
    committed checkpoint apply)."""
    abandoning: bool = False
    """Whether one of its processes began removing what it uploaded, or its intent before
    its manifest (a save that fails cleans up: it will not commit, and protects nothing
    any more)."""

    @property
    def live(self) -> bool:
        return self.outcome == "running"


@dataclass(eq=False)
class _Manifest:
    cid: CheckpointId
    named: dict[str, int]
    """Each object it names, with the least size it must have."""
    generation: int
    epoch: int
    created: int
    writer: str = "?"
    """The actor that wrote it."""


@dataclass(eq=False)
class _GcRun:
    policy: RetentionPolicy
    deleting: bool = False
    planned: list[tuple[int, CheckpointId]] | None = None
    """The committed checkpoints (epoch, id) of the listing it planned from."""


@dataclass
class _Takeover:
    generation: int
    claimed: int
    completed: int | None = None


class Oracle:
    """See the module docstring."""

    def __init__(self, paths: CheckpointPaths) -> None:
        self.paths = paths
        self.violations: list[str] = []
        self.events: Counter[str] = Counter()
        """What happened, by kind: saves committed, deletions, loads, takeovers..."""
        self.step = 0
        self.acting = "?"
        """The actor whose call is being applied."""
        self._manifests: dict[tuple[int, str], _Manifest] = {}
        self._naming: dict[tuple[int, str], set[str]] = {}
        self._attempts: dict[tuple[int, CheckpointId], list[Attempt]] = {}
        self._reported: dict[tuple[int, CheckpointId], Attempt] = {}
        self._deleting: dict[str, tuple[CheckpointId, bool]] = {}
        self._gc: dict[str, _GcRun] = {}
        self._takeovers: dict[tuple[int, int], _Takeover] = {}
        self._writer: dict[int, WriterRecord] = {}
        self._broken_by_force: set[tuple[int, str]] = set()
        self._gone_by_force: set[tuple[int, str]] = set()
        """Objects a forced delete removed: what is built on them later is broken too."""
        self._removed: dict[tuple[int, CheckpointId], tuple[str, bool]] = {}
        """Committed manifests deleted: by whom, and whether rightfully."""

    # -- helpers -----------------------------------------------------------------------

    def _flag(self, what: str) -> None:
        self.violations.append(f"step {self.step} ({self._actor()}): {what}")

    def _actor(self) -> str:
        actor = ACTOR.get()
        return actor.name if actor is not None else self.acting

    def _is_manifest(self, path: str) -> CheckpointId | None:
        cid = self.paths.checkpoint_of(path)
        if cid is not None and path == self.paths.manifest(cid):
            return cid
        return None

    # -- what the store reports --------------------------------------------------------

    def after_step(self, scheduler: Scheduler) -> None:
        self.step = scheduler.step

    def before_write(
        self, store: SimStore, path: str, old: SimObject | None, new: SimObject
    ) -> None:
        key = (id(store), path)
        self._note_written(store, path)
        cid = self._is_manifest(path)
        if cid is not None:
            if old is not None and old.data and not new.data:
                # A committed checkpoint retired: deleted, its id kept claimed by a tombstone.
                self._manifest_deleted(store, path, cid, self._actor())
            elif old is not None:
                self._flag(f"{store.name}:{path} was written over (a manifest is write-once)")
            if new.data:
                self._manifest_written(store, path, cid, new.data)
            return
        if key in self._naming and old is not None and old.data != new.data:
            named_by = sorted(self._naming[key])
            self._flag(f"{store.name}:{path}, named by committed {named_by}, was replaced")
        if path == self.paths.latest_pointer():
            self._pointer_written(store, old, new)
        elif path == self.paths.writer_record():
            try:
                self._writer[id(store)] = decode_writer(path, new.data)
            except CorruptManifestError:
                self._flag(f"{store.name}:_writer written undecodable")

    def _note_written(self, store: SimStore, path: str) -> None:
        owner = self.paths.checkpoint_of(path)
        if owner is None or path == self.paths.manifest(owner):
            return
        actor = self._actor()
        for attempt in self._attempts.get((id(store), owner), []):
            if not attempt.live or actor not in attempt.actors:
                continue
            if not self.paths.is_intent_path(path):
                attempt.written.add(path)
            elif not attempt.leased:
                # From its intent on, a save's parent is protected: it reads the parent's
                # manifest after writing the intent (and fails if it is gone by then).
                attempt.leased = True
                attempt.parent_named = self.parent_objects(store, attempt.parent)
                attempt.parent_writer = self._writer_of(store, attempt.parent)

    def _manifest_written(self, store: SimStore, path: str, cid: CheckpointId, data: bytes) -> None:
        try:
            manifest = decode_root(path, data)
        except IntegrityError as exc:
            self._flag(f"{store.name}:{path} written undecodable: {exc}")
            return
        named: dict[str, int] = {}
        for owner, relative, size in manifest.stored_objects():
            named[self.paths.resolve(owner or cid, relative)] = size
        for part in manifest.parts:
            named[self.paths.resolve(cid, part.path)] = part.size_bytes
        actor = self._actor()
        for attempt in self._attempts.get((id(store), cid), []):
            if attempt.live and actor in attempt.actors:
                attempt.created = True
        generation = manifest.writer_generation or 0
        record = _Manifest(cid, named, generation, manifest.epoch, self.step, actor)
        self._manifests[(id(store), path)] = record
        for object_path, size in named.items():
            self._naming.setdefault((id(store), object_path), set()).add(path)
            found = store.objects.get(object_path)
            if found is None and (id(store), object_path) in self._gone_by_force:
                # Built on a checkpoint a forced delete broke: its documented effect.
                self._broken_by_force.add((id(store), path))
                continue
            if found is None or len(found.data) < size:
                state = "missing" if found is None else f"{len(found.data)} bytes"
                self._flag(
                    f"{store.name}:{path} committed naming {object_path} ({state}, "
                    f"needs {size} bytes)"
                )

    def _pointer_written(self, store: SimStore, old: SimObject | None, new: SimObject) -> None:
        path = self.paths.latest_pointer()
        try:
            after = decode_pointer(path, new.data)
            before = decode_pointer(path, old.data) if old is not None else None
        except CorruptManifestError:
            self._flag(f"{store.name}:_latest written undecodable")
            return
        if before is None or after.writer_generation > before.writer_generation:
            self._takeovers.setdefault(
                (id(store), after.writer_generation), _Takeover(after.writer_generation, self.step)
            )

    def before_delete(self, store: SimStore, path: str, old: SimObject) -> None:
        actor = self._actor()
        run = self._gc.get(actor)
        if run is not None:
            run.deleting = True
        cid = self._is_manifest(path)
        if cid is not None and old.data:
            self._manifest_deleted(store, path, cid, actor)
            return
        key = (id(store), path)
        named_by = self._naming.get(key)
        forced = self._deleting.get(actor)
        if forced is not None and forced[1]:
            self._gone_by_force.add(key)
        if named_by:
            deleting = self._deleting.get(actor)
            if deleting is not None and deleting[1]:
                self._broken_by_force.update((id(store), m) for m in named_by)
            elif not all((id(store), m) in self._broken_by_force for m in named_by):
                self._flag(f"{store.name}:{path}, named by committed {sorted(named_by)}, deleted")
        self._check_live_saves(store, path, actor)

    def _manifest_deleted(self, store: SimStore, path: str, cid: CheckpointId, actor: str) -> None:
        record = self._manifests.pop((id(store), path), None)
        if record is not None:
            for object_path in record.named:
                names = self._naming.get((id(store), object_path))
                if names is not None:
                    names.discard(path)
                    if not names:
                        del self._naming[(id(store), object_path)]
        rightful = self._may_delete(actor, cid)
        self.events[f"checkpoint deleted by {actor.rstrip('0123456789')}"] += 1
        self._removed[(id(store), cid)] = (actor, rightful)
        reported = self._reported.get((id(store), cid))
        if reported is None:
            return
        if rightful:  # the id is free again: a later save may commit it anew
            del self._reported[(id(store), cid)]
            return
        if actor in reported.actors:
            self._flag(f"committed {cid}, reported to {actor}, rolled back by its own writer")
            return
        self._flag(f"committed {cid} deleted by {actor}, which had no right to")

    def _may_delete(self, actor: str, cid: CheckpointId) -> bool:
        """Whether ``actor`` may delete committed ``cid``: a delete of it, or a GC whose
        policy did not keep it."""
        deleting = self._deleting.get(actor)
        if deleting is not None and deleting[0] == cid:
            return True
        run = self._gc.get(actor)
        return run is not None and run.planned is not None and not _kept(run, cid)

    def _check_live_saves(self, store: SimStore, path: str, actor: str) -> None:
        deleting = self._deleting.get(actor)
        if deleting is not None and deleting[1]:
            return  # a forced delete breaks what builds on it: its documented effect
        owner = self.paths.checkpoint_of(path)
        ends = owner is not None and self.paths.is_intent_path(path)
        for attempt in self._attempts.get((id(store), owner), []) if owner else []:
            if attempt.live and actor in attempt.actors and (ends or path in attempt.written):
                # Removing its uploads, or its intent before its manifest: the save ended.
                attempt.abandoning = True
        for attempts in self._attempts.values():
            for attempt in attempts:
                if (
                    not attempt.live
                    or attempt.created
                    or attempt.abandoning
                    or attempt.store is not store
                    or actor in attempt.actors
                ):
                    continue
                claimed = store.objects.get(self.paths.manifest(attempt.cid))
                if claimed is not None:
                    continue  # committed by a twin, or claimed by GC: its create will fail
                if owner == attempt.cid and path in attempt.written:
                    self._flag(f"{path} of the live save of {attempt.cid} deleted")
                elif path in attempt.parent_named and actor != attempt.parent_writer:
                    self._flag(
                        f"{path} of parent {attempt.parent}, which the live save of "
                        f"{attempt.cid} carries, deleted"
                    )

    def on_list(self, store: SimStore, prefix: str) -> None:
        run = self._gc.get(self._actor())
        if run is None or run.deleting or prefix != self.paths.base_prefix:
            return  # GC plans from its last listing before its first delete
        run.planned = sorted(
            (m.epoch, m.cid)
            for (store_id, _), m in self._manifests.items()
            if store_id == id(store)
        )

    def on_crash(self, actor: Actor) -> None:
        for attempts in self._attempts.values():
            for attempt in attempts:
                if attempt.live and actor.name in attempt.actors:
                    attempt.outcome = f"unknown: {actor.name} crashed"

    # -- what actors report ------------------------------------------------------------

    def _writer_of(self, store: SimStore, cid: CheckpointId | None) -> str:
        record = None if cid is None else self._manifests.get((id(store), self.paths.manifest(cid)))
        return record.writer if record is not None else "?"

    def parent_objects(self, store: SimStore, parent: CheckpointId | None) -> frozenset[str]:
        """The objects a save building on ``parent`` will name (its manifest's, now)."""
        if parent is None:
            return frozenset()
        record = self._manifests.get((id(store), self.paths.manifest(parent)))
        return frozenset(record.named) if record is not None else frozenset()

    def save_started(
        self,
        actors: Iterable[str],
        store: SimStore,
        cid: CheckpointId,
        expected: Expected,
        parent: CheckpointId | None = None,
    ) -> Attempt:
        attempt = Attempt(frozenset(actors), store, cid, expected, parent, frozenset(), self.step)
        self._attempts.setdefault((id(store), cid), []).append(attempt)
        return attempt

    def save_ended(
        self, attempt: Attempt, manifest: CheckpointManifest | None, error: str = ""
    ) -> None:
        if not attempt.live:
            return  # its actor died: nothing it says counts
        if manifest is None:
            attempt.outcome = f"failed: {error}"
            self.events["save failed"] += 1
            return
        attempt.outcome = "committed"
        self.events["save committed"] += 1
        key = (id(attempt.store), attempt.cid)
        earlier = self._reported.get(key)
        if earlier is not None and earlier.expected != attempt.expected:
            self._flag(
                f"{attempt.cid} reported committed to {sorted(earlier.actors)} and to "
                f"{sorted(attempt.actors)}, with different data"
            )
        stored = attempt.store.objects.get(self.paths.manifest(attempt.cid))
        if stored is not None and stored.data:
            self._reported[key] = attempt
            return
        remover, rightful = self._removed.get(key, ("nobody", False))
        if not rightful or remover in attempt.actors:
            self._flag(
                f"{attempt.cid} reported committed, but its manifest is gone (deleted by {remover})"
            )

    def expected_of(self, store: SimStore, cid: CheckpointId) -> Expected | None:
        """What a save this oracle was told committed holds; None if none was."""
        reported = self._reported.get((id(store), cid))
        return reported.expected if reported is not None else None

    def gc_started(self, actor: str, policy: RetentionPolicy) -> None:
        self._gc[actor] = _GcRun(policy)

    def gc_ended(self, actor: str) -> None:
        self._gc.pop(actor, None)

    def delete_started(self, actor: str, cid: CheckpointId, force: bool) -> None:
        self._deleting[actor] = (cid, force)

    def delete_ended(self, actor: str) -> None:
        self._deleting.pop(actor, None)

    def takeover_ended(self, store: SimStore, generation: int) -> None:
        takeover = self._takeovers.get((id(store), generation))
        if takeover is None:
            self._flag(f"take_over returned generation {generation}, never claimed in _latest")
        elif takeover.completed is None:
            takeover.completed = self.step
            self.events["takeover"] += 1

    def loaded(
        self, store: SimStore, loaded: LoadedCheckpoint, started: int, *, latest: bool
    ) -> None:
        """Check what a reader got (see the module docstring)."""
        cid = loaded.checkpoint_id
        self.events["load_latest returned a checkpoint" if latest else "load"] += 1
        got = Expected(
            {
                key: tuple(bytes(link.data) for link in links)
                for key, links in loaded.chains.items()
            },
            dict(loaded.source_offsets),
        )
        reported = self._reported.get((id(store), cid))
        attempts = self._attempts.get((id(store), cid), [])
        if reported is not None and reported.expected != got:
            self._flag(
                f"loaded {cid} = {got.describe()}, but {sorted(reported.actors)} saved "
                f"{reported.expected.describe()}"
            )
        elif reported is None and not any(a.expected == got for a in attempts):
            self._flag(f"loaded {cid} = {got.describe()}, which no save of it holds")
        if latest:
            self._check_not_fenced(store, loaded.manifest, started)

    def _check_not_fenced(
        self, store: SimStore, manifest: CheckpointManifest, started: int
    ) -> None:
        record = self._manifests.get((id(store), self.paths.manifest(manifest.checkpoint_id)))
        created = record.created if record is not None else None
        generation = manifest.writer_generation or 0
        for (store_id, _), takeover in self._takeovers.items():
            if (
                store_id == id(store)
                and takeover.completed is not None
                and takeover.completed < started
                and generation < takeover.generation
                and created is not None
                and created > takeover.claimed
            ):
                self._flag(
                    f"load_latest returned {manifest.checkpoint_id} of generation {generation}, "
                    f"committed at step {created}, after generation {takeover.generation} "
                    f"took over (claimed at step {takeover.claimed})"
                )

    def loaded_none(self, store: SimStore, started: int) -> None:
        """``load_latest`` found nothing: nothing it admits may have existed throughout."""
        self.events["load_latest returned None"] += 1
        record = self._writer.get(id(store), WriterRecord(0))
        for (store_id, path), manifest in self._manifests.items():
            if store_id != id(store) or manifest.created >= started:
                continue
            if (store_id, path) in self._broken_by_force:
                continue
            order = (manifest.epoch, manifest.cid.uuid.int)
            if record.admits(manifest.generation, order):
                self._flag(
                    f"load_latest returned None, but {manifest.cid} was committed throughout"
                )
                return

    def copying(self, source: SimStore, target: SimStore, cid: CheckpointId) -> None:
        """``cairn copy`` of ``cid`` begins: the target's copy may hold what any save of it
        in the source held."""
        for attempt in self._attempts.get((id(source), cid), []):
            copy = Attempt(
                frozenset({"copier"}),
                target,
                cid,
                attempt.expected,
                None,
                frozenset(),
                self.step,
                outcome="copied",
            )
            self._attempts.setdefault((id(target), cid), []).append(copy)

    def broken_by_force(self, store: SimStore, cid: CheckpointId) -> bool:
        """Whether a forced delete broke ``cid`` (it then need not load)."""
        return (id(store), self.paths.manifest(cid)) in self._broken_by_force

    def committed_ids(self, store: SimStore) -> list[CheckpointId]:
        return sorted(m.cid for (s, _), m in self._manifests.items() if s == id(store))

    def reported_ids(self, store: SimStore) -> list[CheckpointId]:
        return sorted(cid for (s, cid) in self._reported if s == id(store))


def _kept(run: _GcRun, cid: CheckpointId) -> bool:
    """Whether ``run``'s policy keeps ``cid`` among the checkpoints it planned from (only
    ``keep_last`` and ``pinned`` are drawn by the simulation)."""
    assert run.planned is not None
    if cid in run.policy.pinned:
        return True
    if run.policy.keeps_everything:
        return True
    if run.policy.keep_last is None:
        return False
    newest = [c for _, c in run.planned[-run.policy.keep_last :]]
    return cid in newest
