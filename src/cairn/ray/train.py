"""Ray Train checkpoints through cairn: the upload hook of ``ray.train.report``, and the
storage filesystem Ray reads them back through.

Ray Train (2.60) accepts from a ``checkpoint_upload_fn`` only a checkpoint on the run's
own storage filesystem, under its experiment directory. So cairn gives both:

* :func:`train_storage` wraps the filesystem Ray keeps its run in (local, S3, ...): pass
  it as ``RunConfig(storage_filesystem=...)``. Everything Ray writes goes to that
  filesystem unchanged, except that a checkpoint directory holding a cairn pointer
  (``.cairn-checkpoint``) is served from cairn: its files are restored once per process
  with ``restore_directory``, each checked against its SHA-256;
* :func:`train_upload_fn` is the hook: it saves the worker's checkpoint directory as a
  cairn checkpoint (one directory partition, ``(operator, world rank)``; every file
  verified; incremental by file: a file of the same size and modification time as in
  the previous checkpoint is carried by reference, not uploaded; committed atomically),
  then writes the pointer at the path Ray expects, and returns that checkpoint.

Invariants: a pointer is written only after its cairn checkpoint committed, so Ray never
knows a checkpoint that does not load; what a checkpoint directory serves is exactly the
committed cairn checkpoint its pointer names, verified, and a checkpoint whose restore
fails is not served at all. Ray's deletion of an old checkpoint removes the pointer only:
the cairn checkpoint goes by cairn's GC (a retention policy, ``cairn gc``), which knows
what later checkpoints still carry from it.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from collections.abc import Callable
from typing import Any

from pyarrow.fs import (
    FileInfo,
    FileSelector,
    FileSystem,
    FileSystemHandler,
    FileType,
    LocalFileSystem,
    PyFileSystem,
)

from cairn.data import CheckpointData
from cairn.errors import InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths
from cairn.sync import SyncCheckpointer

__all__ = ["POINTER", "CairnTrainStorage", "train_storage", "train_upload_fn"]

POINTER = ".cairn-checkpoint"
"""The file, in a checkpoint directory of Ray's storage, that names its cairn checkpoint."""


def _checkpointer(store: str, prefix: str) -> SyncCheckpointer:
    return SyncCheckpointer(store, CheckpointPaths(prefix))


class CairnTrainStorage(FileSystemHandler):  # type: ignore[misc]
    """A pyarrow filesystem handler: ``base`` for everything, but for checkpoint
    directories holding a cairn pointer, whose files come from cairn (see the module).

    Args:
        store: The store's URL, or a local directory's path.
        prefix: Where in the store the checkpoints are.
        base: The filesystem Ray keeps its run in.
    """

    def __init__(self, store: str, prefix: str, base: FileSystem) -> None:
        self.store, self.prefix, self.base = store, prefix, base
        self._restored: dict[str, str] = {}  # checkpoint directory -> its local copy

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_restored": {}}  # a restore is private to a process

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CairnTrainStorage)
            and (other.store, other.prefix) == (self.store, self.prefix)
            and other.base.equals(self.base)
        )

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((self.store, self.prefix))

    # -- checkpoint directories -------------------------------------------------------------

    def _pointed(self, path: str) -> tuple[str, str] | None:
        """(checkpoint directory, the path's part inside it) when ``path`` is in a
        directory holding a pointer; None otherwise."""
        path = path.rstrip("/")
        directory, inside = path, ""
        while directory and directory not in ("/", "."):
            if directory in self._restored:
                return directory, inside
            info = self.base.get_file_info(posixpath.join(directory, POINTER))
            if info.type == FileType.File:
                return directory, inside
            directory, tail = posixpath.split(directory)
            inside = posixpath.join(tail, inside) if inside else tail
        return None

    def _local(self, directory: str) -> str:
        local = self._restored.get(directory)
        if local is None:
            with self.base.open_input_stream(posixpath.join(directory, POINTER)) as pointer:
                named = json.loads(pointer.read().decode())
            local = os.path.join(tempfile.mkdtemp(prefix="cairn-ray-train-"), "checkpoint")
            with _checkpointer(self.store, self.prefix) as ckpt:
                ckpt.restore_directory(
                    CheckpointId.parse(named["checkpoint"]),
                    named["operator"],
                    int(named["partition"]),
                    local,
                )
            self._restored[directory] = local
        return local

    def _info(self, path: str) -> FileInfo:
        pointed = self._pointed(path)
        if pointed is None:
            return self.base.get_file_info(path)
        directory, inside = pointed
        info = LocalFileSystem().get_file_info(os.path.join(self._local(directory), inside))
        return FileInfo(path.rstrip("/"), info.type, size=info.size, mtime=info.mtime)

    # -- the handler's interface ------------------------------------------------------------

    def get_type_name(self) -> str:
        """The filesystem's type, as pyarrow names it.

        Returns:
            ``cairn+`` and the base's.
        """
        return f"cairn+{self.base.type_name}"

    def normalize_path(self, path: str) -> str:
        """``path`` as the base normalizes it.

        Args:
            path: A path.

        Returns:
            The path.
        """
        return str(self.base.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[FileInfo]:
        """What each path is.

        Args:
            paths: Paths.

        Returns:
            Their ``FileInfo``.
        """
        return [self._info(path) for path in paths]

    def get_file_info_selector(self, selector: FileSelector) -> list[FileInfo]:
        """What a directory holds (a checkpoint directory: its cairn files).

        Args:
            selector: The directory and how to list it.

        Returns:
            The ``FileInfo`` of what it selects.
        """
        pointed = self._pointed(selector.base_dir)
        if pointed is None:
            return list(self.base.get_file_info(selector))
        directory, inside = pointed
        root = self._local(directory)
        local = FileSelector(
            os.path.join(root, inside),
            allow_not_found=selector.allow_not_found,
            recursive=selector.recursive,
        )
        return [
            FileInfo(
                posixpath.join(directory, os.path.relpath(info.path, root)),
                info.type,
                size=info.size,
                mtime=info.mtime,
            )
            for info in LocalFileSystem().get_file_info(local)
        ]

    def open_input_stream(self, path: str) -> Any:
        """A file, to read.

        Args:
            path: Its path.

        Returns:
            A pyarrow input stream.
        """
        pointed = self._pointed(path)
        if pointed is None:
            return self.base.open_input_stream(path)
        return LocalFileSystem().open_input_stream(
            os.path.join(self._local(pointed[0]), pointed[1])
        )

    def open_input_file(self, path: str) -> Any:
        """A file, to read at any offset.

        Args:
            path: Its path.

        Returns:
            A pyarrow random-access file.
        """
        pointed = self._pointed(path)
        if pointed is None:
            return self.base.open_input_file(path)
        return LocalFileSystem().open_input_file(os.path.join(self._local(pointed[0]), pointed[1]))

    def create_dir(self, path: str, recursive: bool) -> None:
        """Create a directory in the base.

        Args:
            path: Its path.
            recursive: Create its parents too.
        """
        self.base.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        """Delete a directory of the base (a checkpoint directory: its pointer only).

        Args:
            path: Its path.
        """
        self._restored.pop(path.rstrip("/"), None)
        self.base.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        """Empty a directory of the base.

        Args:
            path: Its path.
            missing_dir_ok: A missing directory is not an error.
        """
        self.base.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        """Refused: cairn never empties the whole base.

        Raises:
            InvalidInputError: Always.
        """
        raise InvalidInputError("cairn's Ray Train storage does not empty its root")

    def delete_file(self, path: str) -> None:
        """Delete a file of the base.

        Args:
            path: Its path.
        """
        self.base.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        """Move a file or directory of the base.

        Args:
            src: From.
            dest: To.
        """
        self.base.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        """Copy a file of the base.

        Args:
            src: From.
            dest: To.
        """
        self.base.copy_file(src, dest)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        """A file of the base, to write.

        Args:
            path: Its path.
            metadata: Its metadata.

        Returns:
            A pyarrow output stream.
        """
        return self.base.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        """A file of the base, to append to.

        Args:
            path: Its path.
            metadata: Its metadata.

        Returns:
            A pyarrow output stream.
        """
        return self.base.open_append_stream(path, metadata=metadata)


def train_storage(store: str, *, prefix: str = "", base: FileSystem | None = None) -> Any:
    """The storage filesystem for ``RunConfig(storage_filesystem=...)`` that serves the
    checkpoints :func:`train_upload_fn` saves from cairn.

    Args:
        store: The store's URL, or a local directory's path.
        prefix: Where in the store the checkpoints are (``""``: the store's root).
        base: The filesystem Ray keeps its run in (None: the local one).

    Returns:
        A ``pyarrow.fs.PyFileSystem``.
    """
    base = LocalFileSystem() if base is None else base
    return PyFileSystem(CairnTrainStorage(store, CheckpointPaths(prefix).base_prefix, base))


class _Upload:
    """The ``checkpoint_upload_fn``; picklable, so Ray can ship it to its workers."""

    def __init__(self, store: str, prefix: str, operator: str) -> None:
        self.store, self.prefix, self.operator = store, prefix, operator

    def __call__(self, checkpoint: Any, checkpoint_dir_name: str) -> Any:
        import ray.train

        context = ray.train.get_context()
        storage = context.get_storage()
        filesystem = storage.storage_filesystem
        handler = getattr(filesystem, "handler", None)
        if not isinstance(handler, CairnTrainStorage) or (handler.store, handler.prefix) != (
            self.store,
            self.prefix,
        ):
            raise InvalidInputError(
                "train_upload_fn needs RunConfig(storage_filesystem=train_storage(store)) "
                f"of the same store and prefix; the run's is {filesystem!r}"
            )
        rank = context.get_world_rank()
        with checkpoint.as_directory() as local, _checkpointer(self.store, self.prefix) as ckpt:
            parent = ckpt.latest_id()
            epoch = 0 if parent is None else ckpt.load_manifest(parent).epoch + 1
            manifest = ckpt.save(
                CheckpointData(
                    epoch=epoch, directories={(self.operator, rank): local}, parent_id=parent
                )
            )
        path = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
        pointer = {
            "checkpoint": str(manifest.checkpoint_id),
            "operator": self.operator,
            "partition": rank,
        }
        filesystem.create_dir(path, recursive=True)
        with filesystem.open_output_stream(posixpath.join(path, POINTER)) as out:
            out.write(json.dumps(pointer).encode())
        return ray.train.Checkpoint(path=path, filesystem=filesystem)


def train_upload_fn(
    store: str, *, prefix: str = "", operator: str = "ray-train"
) -> Callable[[Any, str], Any]:
    """The ``checkpoint_upload_fn`` for ``ray.train.report`` that saves through cairn;
    the run's ``RunConfig(storage_filesystem=...)`` must be :func:`train_storage` of the
    same store and prefix.

    Args:
        store: The store's URL, or a local directory's path (opened in each worker).
        prefix: Where in the store the checkpoints are (``""``: the store's root).
        operator: The name of the directory partitions (one per reporting worker, its
            world rank the partition).

    Returns:
        A function of ``(checkpoint, checkpoint_dir_name)`` that saves the checkpoint's
        directory as a cairn checkpoint and returns the ``ray.train.Checkpoint`` that
        reads it back through cairn.
    """
    return _Upload(store, CheckpointPaths(prefix).base_prefix, operator)
