"""``CairnCallback``: each ``checkpoint-N`` of a ``transformers.Trainer`` as a cairn checkpoint.

The Trainer writes ``{output_dir}/checkpoint-{global_step}`` (weights, optimizer,
scheduler, RNG states, ``trainer_state.json``) and then calls its callbacks' ``on_save``.
There, on the main process, this callback commits the directory as one cairn checkpoint:
a directory partition (operator :data:`OPERATOR`, partition 0) named ``checkpoint-N``,
with the global step as its epoch (:func:`cairn.integrations.named.save_named`). It
builds on the checkpoint it committed before (or, in a resumed run, the store's newest
one of the same kind): a file whose SHA-256 equals the file of the same relative path
there is carried by reference instead of uploaded, so files that do not change from one
save to the next (a frozen model's weights, the tokenizer, the config) are uploaded once.

With ``background=True`` the commit (and its GC) runs on a thread of its own while
training goes on; at most one is in flight. The callback waits for it before the Trainer
writes its next ``checkpoint-N`` (in ``on_step_end`` and ``on_epoch_end`` when the
Trainer is about to save: its rotation may delete the folder being uploaded), in the
next ``on_save``, and at the end of training; the error of a failed commit is raised
there. The save at the run's last step is committed in ``on_save`` itself: after the
last step the Trainer may delete that folder before any callback runs again.

With ``save_total_limit``, a GC run (:meth:`~cairn.ObjectStoreCheckpointer.gc`) follows
each commit, keeping that many newest checkpoints (by step) and the best one the Trainer
names (``load_best_model_at_end``); GC keeps every object a kept checkpoint carries,
whichever checkpoint uploaded it.

Invariants: a checkpoint is visible only once its manifest, naming every file, is
committed; a file's bytes are hashed as they are read and uploaded, and every restore
checks each file against that SHA-256 before ``dest`` appears
(:meth:`~cairn.ObjectStoreCheckpointer.restore_directory`); GC never deletes the
checkpoint just committed (it is the latest) nor anything it carries.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import CheckpointNotFoundError, InvalidInputError
from cairn.format.ids import CheckpointId
from cairn.format.layout import CheckpointPaths, validate_checkpoint_name
from cairn.format.signing import SigningKey
from cairn.integrations._interface import run_blocking
from cairn.integrations.named import named_ids, save_named
from cairn.protocol.retention import RetentionPolicy

if TYPE_CHECKING:
    from obstore.store import ObjectStore
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from cairn.stores import Store

__all__ = ["LATEST", "OPERATOR", "CairnCallback", "restore_checkpoint"]

OPERATOR = "hf-trainer"
"""The operator of the directory partition a ``checkpoint-N`` directory is stored as."""
LATEST = "latest"
"""The reference :func:`restore_checkpoint` reads as the newest checkpoint."""


def _checkpointer(
    store: Store | ObjectStore | str,
    prefix: str | None,
    signing_key: SigningKey | Sequence[SigningKey] | None,
    **settings: Any,
) -> ObjectStoreCheckpointer:
    paths = None if prefix is None else CheckpointPaths(prefix)
    return ObjectStoreCheckpointer(store, paths, signing_key=signing_key, **settings)


def _holds_trainer_folder(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> bool:
    manifest = run_blocking(ckpt.load_manifest(cid))
    return any((d.operator, d.partition_id) == (OPERATOR, 0) for d in manifest.directories)


class CairnCallback(TrainerCallback):
    """A ``TrainerCallback`` that commits each ``checkpoint-N`` directory to a cairn store.

    Pass it in ``Trainer(callbacks=[...])``. Give each run a store (or prefix) of its
    own: with ``save_total_limit``, GC keeps that many checkpoints of the whole prefix.
    ``on_save`` returns once the checkpoint is committed (the files that changed are
    uploaded meanwhile), or with ``background``, at once. With several processes, the
    main one commits the directory (shared by all of them, as the Trainer writes it).

    Args:
        store: Anything :class:`~cairn.ObjectStoreCheckpointer` accepts (a URL, a plain
            path, an obstore store).
        prefix: The checkpoint base inside the store; None (the default) is the store's
            root (see :meth:`~cairn.ObjectStoreCheckpointer.resolve_paths`).
        signing_key: The key, or keys, that sign each manifest (see
            :mod:`cairn.format.signing`).
        incremental: Carry files equal to the previous checkpoint's instead of
            uploading them; False uploads every file of every save.
        retention: Follow each commit with a GC run that honours ``save_total_limit``;
            False keeps every checkpoint (GC as you choose, e.g. ``cairn gc``).
        max_concurrent_uploads: Files uploaded at once at most.
        background: Commit each checkpoint on a thread of its own while training goes
            on (see the module docstring for when it is waited for); False (the
            default) commits it in ``on_save``.

    Raises:
        InvalidInputError: An argument is out of range.
    """

    def __init__(
        self,
        store: Store | ObjectStore | str,
        *,
        prefix: str | None = None,
        signing_key: SigningKey | Sequence[SigningKey] | None = None,
        incremental: bool = True,
        retention: bool = True,
        max_concurrent_uploads: int = 8,
        background: bool = False,
    ) -> None:
        self.checkpointer = _checkpointer(
            store,
            prefix,
            signing_key,
            max_concurrent_uploads=max_concurrent_uploads,
        )
        """The checkpointer each save goes through."""
        self.incremental = bool(incremental)
        self.retention = bool(retention)
        self.saved: list[CheckpointId] = []
        """The checkpoints this callback committed, oldest first."""
        self.background = bool(background)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    @property
    def committing(self) -> bool:
        """Whether a checkpoint is being committed in the background now."""
        return self._pending is not None and not self._pending.done()

    def wait(self) -> None:
        """Wait for the checkpoint being committed in the background, if any.

        Raises:
            CheckpointerError: What its commit (or the GC after it) raised.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Before the Trainer writes a checkpoint, wait for the one in the background."""
        if control.should_save:
            self.wait()

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Before the Trainer writes a checkpoint, wait for the one in the background."""
        if control.should_save:
            self.wait()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """At the end of training, wait for the checkpoint in the background."""
        self.wait()

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Commit ``{output_dir}/checkpoint-{global_step}``; then, with
        ``save_total_limit``, collect what the limit does not keep.

        Args:
            args: The Trainer's arguments.
            state: The Trainer's state (its global step names the directory).
            control: The Trainer's control flags (not changed).
            **kwargs: What else the Trainer passes (unused).

        Raises:
            InvalidInputError: The directory the Trainer wrote is not there.
            FencedError: A newer writer generation took over the store.
            CheckpointerError: With ``background``, what the previous commit raised.
        """
        if not state.is_world_process_zero:
            return
        self.wait()
        name = f"checkpoint-{state.global_step}"
        folder = Path(args.output_dir or ".") / name
        if not folder.is_dir():
            raise InvalidInputError(f"the Trainer wrote no checkpoint directory at {folder}")
        limit = args.save_total_limit
        keep = limit if self.retention and limit is not None and limit > 0 else None
        step, best = state.global_step, state.best_model_checkpoint
        # The last save of a run is committed here: once training ends, the Trainer may
        # delete its folder (save_total_limit=1 with load_best_model_at_end) before any
        # callback runs again.
        last = 0 < state.max_steps <= step
        if not self.background or last:
            self._commit(name, folder, step, keep, best)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="cairn-hf")
        self._pending = self._executor.submit(self._commit, name, folder, step, keep, best)

    def _commit(
        self, name: str, folder: Path, step: int, keep: int | None, best: str | None
    ) -> None:
        """Commit ``folder`` as checkpoint ``name``; then, with ``keep``, GC to it."""
        manifest = run_blocking(
            save_named(
                self.checkpointer,
                name,
                epoch=step,
                directories={(OPERATOR, 0): folder},
                parent_id=self._parent(),
            )
        )
        self.saved.append(manifest.checkpoint_id)
        if keep is not None:
            pinned = self._best(best)
            run_blocking(
                self.checkpointer.gc(RetentionPolicy(keep_last=keep, pinned=tuple(pinned)))
            )

    def _parent(self) -> CheckpointId | None:
        if not self.incremental:
            return None
        if self.saved:
            return self.saved[-1]
        latest = run_blocking(self.checkpointer.latest_id())
        if latest is not None and _holds_trainer_folder(self.checkpointer, latest):
            return latest
        return None

    def _best(self, best: str | None) -> list[CheckpointId]:
        if not best:
            return []
        found = run_blocking(named_ids(self.checkpointer, Path(best).name))
        return found[:1]


def restore_checkpoint(
    store: Store | ObjectStore | str,
    checkpoint: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
) -> Path:
    """Write a ``checkpoint-N`` directory that :class:`CairnCallback` committed into
    ``dest``, every file verified, for ``Trainer.train(resume_from_checkpoint=dest)``.

    ``dest`` appears only once every file is written, fsynced and verified; on any
    failure it is left as it was.

    Args:
        store: The store, as :class:`CairnCallback` took it.
        checkpoint: ``"latest"`` (the newest checkpoint), a checkpoint id, or a name
            (``checkpoint-500``, or a path ending in it): the newest checkpoint of that
            name.
        dest: The directory to write: it must not exist, or be empty.
        prefix: The checkpoint base inside the store, as :class:`CairnCallback` took it.
        signing_key: The key, or keys, a checkpoint must be signed with.

    Returns:
        ``dest``, as a path.

    Raises:
        CheckpointNotFoundError: No such checkpoint, or it holds no Trainer directory.
        InvalidInputError: ``dest`` exists and is not an empty directory.
        IntegrityMismatchError: A file's bytes differ from what was committed.
    """
    ckpt = _checkpointer(store, prefix, signing_key)
    text = os.fspath(checkpoint).rstrip("/")
    shown = store if isinstance(store, str) else repr(ckpt)
    cid: CheckpointId | None
    if text == LATEST:
        cid = run_blocking(ckpt.latest_id())
    else:
        try:
            cid = CheckpointId(text)
        except ValueError:
            name = validate_checkpoint_name(text.rsplit("/", 1)[-1])
            found = run_blocking(named_ids(ckpt, name))
            cid = found[0] if found else None
    if cid is None:
        raise CheckpointNotFoundError(f"no checkpoint {text!r} in {shown}")
    if not _holds_trainer_folder(ckpt, cid):
        raise CheckpointNotFoundError(
            f"checkpoint {cid} in {shown} holds no Trainer directory ({OPERATOR!r} partition 0)"
        )
    run_blocking(ckpt.restore_directory(cid, OPERATOR, 0, dest))
    return Path(dest)
