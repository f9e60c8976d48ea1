"""``cairn delete`` and ``cairn gc``: removing checkpoints without breaking the others.

``delete`` follows the library's rule (:meth:`ObjectStoreCheckpointer.delete_checkpoint`):
it refuses (exit 2) to remove a checkpoint that other checkpoints or saves in progress
build on (their parent, or the owner of artifacts their restore chains carry over by
reference) unless ``--force``, and moves ``_latest`` off what it deletes. ``--dry-run``
says what would happen. ``gc`` applies a :class:`cairn.RetentionPolicy` with
:meth:`ObjectStoreCheckpointer.gc`, which keeps whatever a retained checkpoint needs.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from cairn import (
    CheckpointId,
    CheckpointInUseError,
    CheckpointManifest,
    ObjectStoreCheckpointer,
)
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.limits import duration_of

__all__ = ["Deleted", "delete", "parse_duration", "parse_since", "window"]

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s)")
_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> dt.timedelta:
    """``7d``, ``12h``, ``1h30m``, ``90s``, ``2w`` (or a bare number of seconds), up to
    999999999 days (timedelta's limit: see :func:`cairn.cli.limits.duration_of`).

    Raises :class:`ValueError` (a usage error on the command line) for anything else.
    """
    if isinstance(text, dt.timedelta):  # typer hands defaults through the parser too
        return text
    spec = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", spec):
        return duration_of(float(spec))
    position, seconds = 0, 0.0
    for match in _DURATION_PART.finditer(spec):
        if match.start() != position or spec[position : match.start()].strip():
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position == 0 or spec[position:].strip():
        raise ValueError(f"not a duration: {text!r} (use e.g. 7d, 12h, 30m, 90s, 1h30m)")
    return duration_of(seconds)


def parse_since(text: str, now_ms: int) -> int:
    """``--since``'s value as milliseconds after 1970: a duration before ``now_ms``
    (``7d``, ``12h``; see :func:`parse_duration`), or an ISO 8601 date or time
    (``2026-01-31``, ``2026-01-31T12:00``, UTC unless it names its offset).

    Raises :class:`ValueError` for anything else.
    """
    try:
        span = parse_duration(text)
    except ValueError:
        pass
    else:
        return now_ms - int(span.total_seconds() * 1000)
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"not a duration or a date: {text!r} (use e.g. 7d, 12h, 2026-01-31, 2026-01-31T12:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def window(ids: list[CheckpointId], limit: int | None, since_ms: int | None) -> list[CheckpointId]:
    """``ids`` (oldest first) created at ``since_ms`` or later, then the ``limit`` newest
    of those (None: no bound), still oldest first. An id's time is the one it carries."""
    kept = [cid for cid in ids if since_ms is None or cid.timestamp_ms >= since_ms]
    return kept[-limit:] if limit is not None else kept


@dataclass(frozen=True)
class Deleted:
    """A deleted checkpoint (or, on a dry run, one that would be): its epoch, the bytes
    its own upload held, and who built on it (they break when it is forced)."""

    checkpoint_id: CheckpointId
    epoch: int | None
    size_bytes: int
    dependents: list[CheckpointId]
    dry_run: bool = False


async def delete(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId, force: bool, where: str, dry_run: bool
) -> Deleted:
    """Delete ``cid`` with :meth:`ObjectStoreCheckpointer.delete_checkpoint`, whose rule
    refuses while other checkpoints or saves build on it.

    Raises :class:`CliError` with exit 2 if it is not committed, or if something builds on
    it and ``force`` is not set (on a dry run too: it says what the deletion would do).
    """
    if not await ckpt.exists(cid):
        raise CliError(f"no checkpoint {cid} in {where}", ExitCode.USAGE)
    dependents: list[CheckpointId] = []
    if dry_run or force:  # a real deletion without force asks the library, which refuses
        dependents = await ckpt.dependents(cid)
        if dependents and not force:
            raise _in_use(cid, [str(d) for d in dependents])
    epoch, size = None, 0
    [manifest] = await ckpt.load_manifests([cid])
    if isinstance(manifest, CheckpointManifest):
        epoch = manifest.epoch
        size = sum(e.size_bytes for _, e in manifest.partition_entries() if e.owner is None)
    if not dry_run:
        try:
            await ckpt.delete_checkpoint(cid, force=force)
        except CheckpointInUseError as exc:
            raise _in_use(cid, exc.dependents) from None
    return Deleted(cid, epoch, size, dependents, dry_run)


def _in_use(cid: CheckpointId, dependents: list[str]) -> CliError:
    """The library's refusal, with the command line's way to override it."""
    refusal = CheckpointInUseError(str(cid), dependents, override="pass --force")
    return CliError(str(refusal), ExitCode.USAGE)
