"""Where a committed checkpoint's artifacts are: the names its manifest records.

A save's artifacts carry its attempt token (``partition-0.{attempt}.snap``), so a test
that damages or removes an artifact asks the manifest for its path.
"""

from __future__ import annotations

from cairn import CheckpointManifest, CheckpointPaths


def artifact_path(
    paths: CheckpointPaths,
    manifest: CheckpointManifest,
    operator: str,
    partition: int,
    *,
    is_delta: bool = False,
) -> str:
    """The store path of ``manifest``'s own artifact for that partition and kind."""
    for name, entry in manifest.partition_entries():
        if (name, entry.partition_id, entry.is_delta) == (operator, partition, is_delta):
            return paths.resolve(entry.owner or manifest.checkpoint_id, entry.path)
    raise AssertionError(f"{manifest.checkpoint_id} has no {operator!r}/{partition} artifact")
