"""A save killed mid-way on a local directory, as garbage collection meets it later.

A local store's write stages its bytes in ``{name}#{n}`` and renames the file onto its
name; a kill leaves the staging file, which no listing shows. :func:`killed_save` leaves
such a save behind: one object uploaded, its intent, and two cut writes, all stamped
hours ago so that its lease has lapsed.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

from cairn import CheckpointId, ObjectStoreCheckpointer

__all__ = ["age_files", "killed_save", "staging_files"]


def age_files(directory: Path, by: dt.timedelta) -> None:
    """Set back the modification time of every file below ``directory`` by ``by``: the
    stamps a local store reports, so leases lapse and objects age without a wait."""
    back = by.total_seconds()
    for path in directory.rglob("*"):
        if path.is_file():
            stat = path.stat()
            os.utime(path, (stat.st_atime - back, stat.st_mtime - back))


def staging_files(root: Path) -> list[Path]:
    """Every write's staging file (``name#N``) below ``root``."""
    return sorted(p for p in root.rglob("*#*") if re.search(r"#\d+$", p.name))


async def killed_save(ckpt: ObjectStoreCheckpointer, root: Path) -> tuple[CheckpointId, list[Path]]:
    """Leave a save in ``ckpt``'s local store (at ``root``) that was killed two hours ago
    while it rewrote its intent and uploaded into a folder of its own: its id, and the
    staging files the kill left."""
    cid = CheckpointId.now()
    crashed = ObjectStoreCheckpointer(ckpt.store, ckpt.paths, lease=dt.timedelta(seconds=5))
    await crashed.save_snapshot(cid, "op", 0, b"uploaded before the kill")
    directory = root / ckpt.paths.checkpoint_dir(cid)
    cut = [directory / "intent.json#123456789", directory / "operators/op1/partition-3.a.snap#42"]
    for path in cut:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a write")
    age_files(directory, dt.timedelta(hours=2))
    return cid, cut
