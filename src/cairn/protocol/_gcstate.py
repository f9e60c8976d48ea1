"""Reading what GC plans from: the store's listing, manifests, intents and pointer, and
the store's own time.

Invariants: every manifest listed is read and decoded whole (its parts too); one that
does not decode is recorded as damaged, one a newer cairn wrote as such
(:attr:`StoreState.newer`), never dropped, so the plan can leave it alone; the pointer
is read before the listing. The time GC judges ages by is the store's stamp on an
object written now (:func:`store_now`), never this machine's clock.
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
from collections.abc import Awaitable, Callable

from cairn.errors import (
    CheckpointNotFoundError,
    IntegrityError,
    NewerFormatError,
    StoreError,
)
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import CheckpointManifest, decode_root
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._gcplan import ManifestPaths, StoreState, owners_of
from cairn.protocol._lease import (
    Intent,
    decode_intent,
    is_tombstone,
)
from cairn.protocol._manifestcache import ManifestCache
from cairn.protocol._parts import read_whole
from cairn.protocol._pointer import read_pointer, read_writer
from cairn.stores import ObjectInfo, Store

__all__ = [
    "MANIFEST_READ_CONCURRENCY",
    "read_state",
    "read_state_and_owners",
    "store_now",
]

log = logging.getLogger("cairn.gc")


MANIFEST_READ_CONCURRENCY = 16


async def store_now(store: Store, paths: CheckpointPaths) -> dt.datetime:
    """The store's own time: the ``last_modified`` it stamps on a probe written now.

    GC judges leases, tombstones and ``min_age`` by this, so that no local clock, however
    far off, makes it sweep what a save still needs (see the module docstring).

    Args:
        store: The store.
        paths: The checkpoint layout (the probe is its ``_clock``).

    Returns:
        The stamp.

    Raises:
        StoreError: The store refused the write (read-only to GC), or failed.
    """
    path = paths.clock()
    try:
        await store.put(path, b"cairn: GC reads the store's time from this object's stamp\n")
    except StoreError as exc:
        if not _refused(exc):
            raise
        raise StoreError(
            "put",
            path,
            f"the store is read-only to gc (it refused the write: {exc.reason}); gc writes "
            f"{path!r} to read the store's own time before it deletes or claims anything "
            "(a dry run writes nothing)",
            status=exc.status,
        ) from exc
    return (await store.head(path)).last_modified


_REFUSED_STATUSES = frozenset({None, 401, 403})


_REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def _refused(exc: StoreError) -> bool:
    """True when ``exc`` is a store's refusal to write: no permission, or a read-only file
    system (the kinds the store boundary leaves plain :class:`StoreError`, with a 401 or
    403, or no status); not a transient failure, a missing bucket or a full disk."""
    if type(exc) is not StoreError or exc.status not in _REFUSED_STATUSES:
        return False
    cause = exc.__cause__
    return not isinstance(cause, OSError) or cause.errno in _REFUSED_ERRNOS


async def read_state(
    store: Store, paths: CheckpointPaths, cache: ManifestCache | None = None
) -> StoreState:
    """Read what :func:`plan_gc` needs: one listing, the manifests, the intents, the pointer.

    The pointer is read before the listing; :func:`plan_gc`'s rule for it holds whatever
    moves in between.

    Args:
        store: The store.
        paths: The checkpoint layout.
        cache: Manifests read before, taken instead of reading them again while the
            listing shows them unchanged, by path, size and e-tag.

    Returns:
        What GC read.
    """
    state, _ = await read_state_and_owners(store, paths, cache)
    return state


async def read_state_and_owners(
    store: Store, paths: CheckpointPaths, cache: ManifestCache | None = None
) -> tuple[StoreState, list[CheckpointId | None]]:
    """:func:`read_state`, and :func:`owners_of` of its objects, computed on the way."""
    latest, _, _ = await read_pointer(store, paths.latest_pointer())
    record, _, _ = await read_writer(store, paths.writer_record())
    fenced = frozenset(
        fence.checkpoint_id
        for fence in (record.fences if record is not None else ())
        if fence.checkpoint_id is not None
    )
    objects = await store.list(paths.base_prefix)
    manifests: dict[CheckpointId, CheckpointManifest] = {}
    damaged: dict[CheckpointId, str] = {}
    newer: dict[CheckpointId, NewerFormatError] = {}
    tombstones: dict[CheckpointId, ObjectInfo] = {}
    intents: dict[CheckpointId, list[tuple[ObjectInfo, Intent | None]]] = {}
    committed: dict[CheckpointId, ObjectInfo] = {}
    intent_infos: list[tuple[CheckpointId, ObjectInfo]] = []
    manifest_of = ManifestPaths(paths)
    owners = owners_of(paths, objects)
    for info, cid in zip(objects, owners, strict=True):
        if cid is None:
            continue
        if info.path == manifest_of(cid):
            if is_tombstone(info):
                tombstones[cid] = info
            else:
                committed[cid] = info
        elif paths.is_intent_path(info.path):
            intent_infos.append((cid, info))

    def read_manifest(cid: CheckpointId, info: ObjectInfo) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            path = info.path
            known = cache.get(info) if cache is not None else None
            if known is not None:
                manifests[cid] = known
                return
            try:
                root = decode_root(path, await _read_listed(store, info))
                manifests[cid] = await read_whole(store, paths, path, root)
                if cache is not None:
                    cache.put(info, manifests[cid])
            except CheckpointNotFoundError:
                return  # deleted since the listing
            except IntegrityError as exc:
                damaged[cid] = str(exc)
            except NewerFormatError as exc:
                newer[cid] = exc

        return job

    ended: set[CheckpointId] = set()

    def read_intent(cid: CheckpointId, info: ObjectInfo) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            try:
                blob = await store.get(info.path)
            except CheckpointNotFoundError:
                ended.add(cid)
                return
            # The listing's time is the lease's start as GC saw it; the bytes say for how long.
            intents.setdefault(cid, []).append((info, decode_intent(bytes(blob.data))))

        return job

    reads = [read_manifest(cid, info) for cid, info in committed.items()]
    reads += [read_intent(cid, info) for cid, info in intent_infos if cid not in committed]
    await bounded_gather(MANIFEST_READ_CONCURRENCY, reads)
    state = StoreState(
        manifests, objects, intents, tombstones, damaged, latest, fenced, frozenset(ended), newer
    )
    return state, owners


async def _read_listed(store: Store, info: ObjectInfo) -> Buffer:
    """The bytes of the object a listing reported as ``info``.

    One ranged read of the listed size plus one byte (a GET takes two round trips through
    obstore: the response, then its body); should the object no longer have that size
    (replaced since the listing; by an empty tombstone, and then the range fails), a
    whole read, as if the listing had said nothing.
    """
    if info.size > 0:
        try:
            data = await store.get_range(info.path, 0, info.size + 1)
        except CheckpointNotFoundError:
            raise
        except StoreError:
            pass
        else:
            if memoryview(data).nbytes == info.size:
                return data
    return (await store.get(info.path)).data
