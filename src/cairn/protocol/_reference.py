"""The reference's interface: the checkpointer trait engines and test doubles implement.

:class:`Checkpointer` names the methods of the reference's ``ObjectStoreCheckpointer``
trait, with their meaning; :class:`cairn.ObjectStoreCheckpointer` implements it over an
object store (where the reference is wrong, it fixes it and says so there). It is
exported as :class:`cairn.Checkpointer` and :class:`cairn.checkpointer.Checkpointer`.

Invariant: an implementation keeps each method's meaning as its docstring here states
it; nothing here has behaviour of its own.
"""

from __future__ import annotations

import abc

from cairn.data import CheckpointData, LoadedCheckpoint
from cairn.data.inputs import ArtifactData
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.format.manifest import CheckpointManifest

__all__ = ["Checkpointer"]


class Checkpointer(abc.ABC):
    """The checkpointer interface (the reference's trait), for engines and test doubles."""

    @abc.abstractmethod
    async def save_manifest(self, manifest: CheckpointManifest) -> None:
        """Write a manifest to the checkpoint store: commits that checkpoint.

        Args:
            manifest: The manifest of the checkpoint to commit.
        """

    @abc.abstractmethod
    async def load_manifest(self, checkpoint_id: CheckpointId) -> CheckpointManifest:
        """Load a manifest by checkpoint id.

        Args:
            checkpoint_id: The checkpoint.

        Returns:
            Its manifest.
        """

    @abc.abstractmethod
    async def save_snapshot(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Write a state snapshot for one operator partition.

        Args:
            checkpoint_id: The checkpoint it belongs to.
            operator: The operator.
            partition: The partition.
            data: The partition's full state.

        Returns:
            The SHA-256 of ``data``, in hex.
        """

    @abc.abstractmethod
    async def save_delta(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: ArtifactData
    ) -> str:
        """Write an incremental delta for one operator partition.

        Args:
            checkpoint_id: The checkpoint the delta is part of.
            operator: The operator whose state changed.
            partition: Which of its partitions changed.
            data: The delta on the parent's state.

        Returns:
            The delta's SHA-256, in hex.
        """

    @abc.abstractmethod
    async def load_artifact(self, path: str, *, expected_sha256: str | None = None) -> Buffer:
        """Load a snapshot or delta by store path, verifying it when a digest is given.

        Args:
            path: Where the artifact is in the store.
            expected_sha256: The hex digest to check its bytes against, or None.

        Returns:
            Its bytes.
        """

    @abc.abstractmethod
    async def update_latest(self, checkpoint_id: CheckpointId, *, force: bool = False) -> bool:
        """Point ``_latest`` at a committed checkpoint.

        Args:
            checkpoint_id: The checkpoint.
            force: Move it even backwards.

        Returns:
            Whether it moved.
        """

    @abc.abstractmethod
    async def read_latest(self) -> CheckpointId | None:
        """The checkpoint ``_latest`` names.

        Returns:
            Its id, or None when there is none.
        """

    @abc.abstractmethod
    async def list_checkpoints(self) -> list[CheckpointId]:
        """Every committed checkpoint.

        Returns:
            Their ids, oldest first.
        """

    @abc.abstractmethod
    async def delete_checkpoint(self, checkpoint_id: CheckpointId, *, force: bool = False) -> None:
        """Delete a checkpoint and all its artifacts; a missing one is not an error.

        Args:
            checkpoint_id: The checkpoint.
            force: Delete it even while other checkpoints or saves in progress build on
                it.

        Raises:
            CheckpointInUseError: Others build on it, and not ``force``.
        """

    @abc.abstractmethod
    async def save(self, data: CheckpointData) -> CheckpointManifest:
        """Upload, commit and publish one checkpoint atomically.

        Args:
            data: The checkpoint to save.

        Returns:
            Its committed manifest.
        """

    @abc.abstractmethod
    async def load(self, checkpoint_id: CheckpointId, *, verify: bool = True) -> LoadedCheckpoint:
        """Load a committed checkpoint with every artifact, verified.

        Args:
            checkpoint_id: The checkpoint.
            verify: Check every artifact against its digest.

        Returns:
            The checkpoint, with its artifacts.
        """

    @abc.abstractmethod
    async def load_latest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that loads and verifies.

        Returns:
            The checkpoint, or None when there is none.
        """
