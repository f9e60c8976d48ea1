"""``CairnCheckpointIO``: Lightning's ``CheckpointIO`` on cairn. See :mod:`cairn.lightning`.

Lightning hands a ``CheckpointIO`` a whole checkpoint (a dict of tensors and plain
values, built on global rank 0) and a file path. This plugin serialises the dict with
``torch.save`` and commits it as one cairn checkpoint of one artifact, operator
:data:`OPERATOR`, partition 0, named after the path's last component, with the
``global_step`` as its epoch (:func:`cairn.integrations.named.save_named`).

Lightning's ``ModelCheckpoint`` decides what to keep by looking at its directory (which
files exist, and which is newest for ``fit(ckpt_path="last")``), so each save also
writes a *pointer file* at the path, a few hundred bytes of JSON that name the
checkpoint's id (:data:`POINTER_KIND`), never the state itself. Loading a pointer loads
the checkpoint it names from the store, verified.

Invariants:

* a save is visible only once its manifest is committed; the pointer file is written
  (atomically, by rename) after that, so a pointer never names a checkpoint that was not
  committed;
* a second save under a name replaces the first as a file would: the earlier
  checkpoints of that name are deleted after the new one commits, through
  :meth:`~cairn.ObjectStoreCheckpointer.delete_checkpoint`, never the one this plugin
  loaded (a resumed run's origin) nor one another checkpoint builds on;
* ``remove_checkpoint`` deletes by the same rule;
* every byte loaded was checked against the SHA-256 its manifest records; a mismatch
  raises :class:`~cairn.IntegrityMismatchError` and nothing is unpickled.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import secrets
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit

import torch

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import CheckpointNotFoundError, InvalidInputError, MissingExtraError
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths, validate_checkpoint_name
from cairn.format.signing import SigningKey
from cairn.integrations._interface import run_blocking
from cairn.integrations.named import checkpoint_names, named_ids, retire_named, save_named

if TYPE_CHECKING:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from obstore.store import ObjectStore

    from cairn.stores import Store
else:

    def _checkpoint_io_base() -> type:
        try:
            from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
        except ImportError:
            try:
                from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
            except ImportError:  # neither lightning nor pytorch_lightning's fabric
                raise MissingExtraError("cairn.lightning", "lightning", ("lightning",)) from None
        return CheckpointIO

    CheckpointIO = _checkpoint_io_base()

__all__ = ["LAST", "OPERATOR", "POINTER_KIND", "AsyncCairnCheckpointIO", "CairnCheckpointIO"]

T = TypeVar("T")

OPERATOR = "lightning"
"""The operator of the one artifact a Lightning checkpoint is stored as."""
POINTER_KIND = "cairn-lightning-pointer"
"""The ``kind`` of a pointer file: JSON ``{"kind", "checkpoint_id", "name", "store"}``."""
LAST = "last"
"""The path that loads the newest checkpoint named ``last*.ckpt`` (ModelCheckpoint's
``save_last``), as Lightning's ``ckpt_path="last"`` means."""
_LAST_NAME = re.compile(r"last(-v?\d+)?\.ckpt")
_POINTER_MAX_BYTES = 64 << 10


class CairnCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that saves each checkpoint as a named cairn checkpoint.

    Pass it in ``Trainer(plugins=[...])``. A path is named by its last component
    (``/runs/a/ckpts/epoch=1-step=20.ckpt`` is ``epoch=1-step=20.ckpt``), so one store
    (or prefix) holds one run's checkpoints. Next to each save a pointer file is written
    at the path itself (a local one; none for a URL), which lets ``ModelCheckpoint`` see
    its files and ``Trainer.fit(ckpt_path="last")`` find the newest ``last.ckpt``. On a
    machine without the pointer files, pass the path, the name or the id instead:
    ``fit(ckpt_path="ckpts/last.ckpt")`` loads the newest checkpoint of that name from
    the store.

    Loading reads ``path`` as: a pointer file (the checkpoint it names); a checkpoint id;
    ``"last"`` (the newest checkpoint named ``last.ckpt`` or ``last-vN.ckpt``); else a
    name, its newest checkpoint. For saves in the background use
    :class:`AsyncCairnCheckpointIO`.

    Args:
        store: Anything :class:`~cairn.ObjectStoreCheckpointer` accepts (a URL, a plain
            path, an obstore store).
        prefix: The checkpoint base inside the store; None (the default) is the store's
            root (see :meth:`~cairn.ObjectStoreCheckpointer.resolve_paths`).
        signing_key: The key, or keys, that sign each manifest and that a load requires
            (see :mod:`cairn.format.signing`).
        compression: ``"zstd"`` stores checkpoints compressed; None stores them raw.
        pointer_files: Write a pointer file at each local path saved to (and remove it
            with the checkpoint).
        max_concurrent_uploads: Uploads in flight at once (parts of one checkpoint).

    Raises:
        InvalidInputError: An argument is out of range.
        CodecError: ``compression`` names no known or installed codec.
    """

    def __init__(
        self,
        store: Store | ObjectStore | str,
        *,
        prefix: str | None = None,
        signing_key: SigningKey | Sequence[SigningKey] | None = None,
        compression: str | None = None,
        pointer_files: bool = True,
        max_concurrent_uploads: int = 8,
    ) -> None:
        super().__init__()
        self._store = store
        self._prefix = prefix
        self._settings: dict[str, Any] = {
            "signing_key": signing_key,
            "compression": compression,
            "max_concurrent_uploads": max_concurrent_uploads,
        }
        self.pointer_files = bool(pointer_files)
        self._ckpt: ObjectStoreCheckpointer | None = self._make()
        self.loaded: CheckpointId | None = None
        """The checkpoint the last :meth:`load_checkpoint` read (never deleted by this
        plugin: a resumed run's origin)."""

    def _make(self) -> ObjectStoreCheckpointer:
        paths = None if self._prefix is None else CheckpointPaths(self._prefix)
        return ObjectStoreCheckpointer(self._store, paths, **self._settings)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ckpt"] = None  # a spawned rank opens the store again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def checkpointer(self) -> ObjectStoreCheckpointer:
        """The checkpointer this plugin saves and loads through."""
        if self._ckpt is None:
            self._ckpt = self._make()
        return self._ckpt

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any = None
    ) -> None:
        """Commit ``checkpoint`` as a cairn checkpoint named after ``path``.

        Earlier checkpoints of the same name are then deleted (a file saved again is
        replaced), except the one this plugin loaded and any that another checkpoint
        builds on; with ``pointer_files``, a pointer file is written at a local ``path``.

        Args:
            checkpoint: The state Lightning built.
            path: Where Lightning would write the file; its last component is the name.
            storage_options: Not supported: must be None.

        Raises:
            InvalidInputError: ``storage_options`` is given.
            InvalidNameError: The path's last component is not a usable checkpoint name.
            FencedError: A newer writer generation took over the store.
        """
        if storage_options is not None:
            raise InvalidInputError(
                f"CairnCheckpointIO takes no storage_options, got {storage_options!r}"
            )
        name = name_of(path)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        step = checkpoint.get("global_step", 0)
        epoch = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0
        ckpt = self.checkpointer
        manifest = self._run(
            save_named(ckpt, name, epoch=epoch, snapshots={(OPERATOR, 0): buffer.getbuffer()})
        )
        cid = manifest.checkpoint_id
        keep = {cid} if self.loaded is None else {cid, self.loaded}
        self._run(retire_named(ckpt, name, keep=keep))
        local = local_path(path)
        if self.pointer_files and local is not None:
            write_pointer(local, cid, name, self._store)

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any = "cpu",
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """The checkpoint ``path`` names, every byte verified, unpickled by ``torch.load``.

        Args:
            path: A pointer file, a checkpoint id, ``"last"``, or a path or name whose
                last component names the checkpoint.
            map_location: As ``torch.load`` takes it; ``"cpu"`` (the default, as
                Lightning's own ``TorchCheckpointIO``) loads every tensor into host
                memory, and Lightning moves the state onto the model's device.
            weights_only: As ``torch.load`` takes it; None is torch's default (True
                since torch 2.6: tensors and plain values only).

        Returns:
            The checkpoint dict.

        Raises:
            CheckpointNotFoundError: No committed checkpoint has that id or name (or the
                one a pointer file names is gone).
            IntegrityMismatchError: The stored bytes differ from what was committed.
        """
        cid = self.resolve(path)
        loaded = self._run(self.checkpointer.load(cid))
        data = loaded.artifacts.get((OPERATOR, 0))
        if data is None:
            raise CheckpointNotFoundError(
                f"checkpoint {cid} holds no Lightning checkpoint (no {OPERATOR!r} partition 0)"
            )
        self.loaded = cid
        state: dict[str, Any] = torch.load(
            io.BytesIO(data), map_location=map_location, weights_only=weights_only
        )
        return state

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delete the checkpoints named after ``path`` (and its pointer file).

        Each goes through :meth:`~cairn.ObjectStoreCheckpointer.delete_checkpoint`: the
        one this plugin loaded, and one another checkpoint builds on, are kept (a
        warning names why).

        Args:
            path: The path Lightning saved to.
        """
        name = name_of(path)
        keep = () if self.loaded is None else (self.loaded,)
        self._run(retire_named(self.checkpointer, name, keep=keep))
        local = local_path(path)
        if local is not None and read_pointer(local) is not None:
            local.unlink(missing_ok=True)

    def resolve(self, path: str | os.PathLike[str]) -> CheckpointId:
        """The committed checkpoint :meth:`load_checkpoint` would read for ``path``.

        Args:
            path: As :meth:`load_checkpoint` takes it.

        Returns:
            Its id.

        Raises:
            CheckpointNotFoundError: There is none.
        """
        text = os.fspath(path)
        local = local_path(text)
        pointer = read_pointer(local) if local is not None else None
        if pointer is not None:
            if not self._run(self.checkpointer.exists(pointer)):
                raise CheckpointNotFoundError(
                    f"pointer file {text} names checkpoint {pointer}, which is not committed "
                    f"in {self._shown()}"
                )
            return pointer
        try:
            return CheckpointId(text)
        except ValueError:
            pass
        if text == LAST:
            return self._newest_last(text)
        name = name_of(text)
        found = self._run(named_ids(self.checkpointer, name))
        if not found:
            raise CheckpointNotFoundError(f"no checkpoint named {name!r} in {self._shown()}")
        return found[0]

    def _newest_last(self, text: str) -> CheckpointId:
        ckpt = self.checkpointer
        names = [n for n in self._run(checkpoint_names(ckpt)) if _LAST_NAME.fullmatch(n)]
        newest = [ids[0] for ids in (self._run(named_ids(ckpt, n)) for n in names) if ids]
        if not newest:
            raise CheckpointNotFoundError(
                f"{text!r}: no checkpoint named last.ckpt or last-vN.ckpt in {self._shown()}"
            )
        return max(newest)

    def _shown(self) -> str:
        return self._store if isinstance(self._store, str) else repr(self.checkpointer)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_blocking(coro)

    def teardown(self) -> None:
        """Nothing to release: saves are committed before ``save_checkpoint`` returns."""


def name_of(path: str | os.PathLike[str]) -> str:
    """The checkpoint name of a path Lightning gives: its last component.

    Args:
        path: A local path or a URL.

    Returns:
        The name.

    Raises:
        InvalidNameError: The last component is not a usable checkpoint name.
    """
    text = os.fspath(path).rstrip("/")
    return validate_checkpoint_name(text.rsplit("/", 1)[-1])


def local_path(path: str | os.PathLike[str]) -> Path | None:
    """The local file ``path`` is (a plain path, or a ``file://`` URL); None for a URL."""
    text = os.fspath(path)
    if "://" not in text:
        return Path(text)
    parts = urlsplit(text)
    return Path(unquote(parts.path)) if parts.scheme == "file" else None


def write_pointer(path: Path, cid: CheckpointId, name: str, store: object) -> None:
    """Write a pointer file at ``path`` naming ``cid``: to a fresh file, fsynced, then
    renamed into place (a reader sees the old pointer or the new one)."""
    body = {
        "kind": POINTER_KIND,
        "checkpoint_id": str(cid),
        "name": name,
        "store": store if isinstance(store, str) else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(temp, "w", encoding="utf-8") as out:
        json.dump(body, out)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)


def read_pointer(path: Path) -> CheckpointId | None:
    """The checkpoint a pointer file at ``path`` names; None when ``path`` is not one."""
    try:
        if not path.is_file() or path.stat().st_size > _POINTER_MAX_BYTES:
            return None
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("kind") != POINTER_KIND:
        return None
    try:
        return CheckpointId(str(body.get("checkpoint_id")))
    except ValueError:
        return None


class AsyncCairnCheckpointIO(CairnCheckpointIO):
    """:class:`CairnCheckpointIO` whose saves and removals run on a background thread.

    ``save_checkpoint`` copies every tensor of the checkpoint into host memory on the
    calling (training) thread, which is all the step waits for, then queues the save.
    Saves and removals run one at a time, in the order they were called, so a removal
    that ``ModelCheckpoint`` asks for never overtakes the save it concerns (Lightning's
    own ``AsyncCheckpointIO`` runs removals on the training thread at once). A load, and
    ``teardown`` (the end of ``fit``), first wait for everything queued; a failure of a
    queued call is raised by the next call or by ``teardown``.

    Takes the arguments of :class:`CairnCheckpointIO`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_executor"] = None
        state["_pending"] = []
        return state

    def _submit(self, call: Callable[[], None]) -> None:
        self._raise_failures(wait=False)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="cairn-lightning")
        self._pending.append(self._executor.submit(call))

    def _raise_failures(self, *, wait: bool) -> None:
        done = [f for f in self._pending if wait or f.done()]
        self._pending = [f for f in self._pending if f not in done]
        for future in done:
            future.result()  # raises what the call raised

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any = None
    ) -> None:
        """Copy ``checkpoint``'s tensors to host memory, then queue its save (see
        :meth:`CairnCheckpointIO.save_checkpoint`).

        Args:
            checkpoint: The state Lightning built.
            path: Where Lightning would write the file; its last component is the name.
            storage_options: Not supported: must be None.

        Raises:
            InvalidInputError: ``storage_options`` is given.
        """
        if storage_options is not None:
            raise InvalidInputError(
                f"CairnCheckpointIO takes no storage_options, got {storage_options!r}"
            )
        copied = _to_host(checkpoint)
        save = super().save_checkpoint
        self._submit(lambda: save(copied, path))

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Queue the removal of the checkpoints named after ``path`` (see
        :meth:`CairnCheckpointIO.remove_checkpoint`), after the saves queued before it.

        Args:
            path: The path Lightning saved to.
        """
        remove = super().remove_checkpoint
        self._submit(lambda: remove(path))

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any = "cpu",
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Wait for the queued saves and removals, then load as
        :meth:`CairnCheckpointIO.load_checkpoint` does.

        Args:
            path: As :meth:`CairnCheckpointIO.load_checkpoint` takes it.
            map_location: As ``torch.load`` takes it.
            weights_only: As ``torch.load`` takes it.

        Returns:
            The checkpoint dict.
        """
        self._raise_failures(wait=True)
        return super().load_checkpoint(path, map_location, weights_only)

    def teardown(self) -> None:
        """Wait for every queued save and removal; raise the first failure."""
        try:
            self._raise_failures(wait=True)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def _to_host(value: Any) -> Any:
    """``value`` with every tensor in it copied into host memory (a fresh copy even of a
    CPU tensor: training goes on changing the original)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        copied = copy.copy(value)  # its own type (an AttributeDict, a defaultdict's factory)
        for key, item in value.items():
            copied[key] = _to_host(item)
        return copied
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_to_host(v) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_to_host(v) for v in value)
    return value
