"""Lightning on cairn: a ``CheckpointIO`` plugin whose checkpoints are verified cairn checkpoints.

Install with ``pip install '.[lightning]'`` from a clone (Lightning 2.x: the
``lightning`` package, or ``pytorch_lightning`` where only that is installed). Then::

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from cairn.lightning import CairnCheckpointIO

    trainer = Trainer(
        plugins=[CairnCheckpointIO("s3://bucket/run")],
        callbacks=[ModelCheckpoint(dirpath="ckpts", save_top_k=2, save_last=True, monitor="loss")],
    )
    trainer.fit(model, ckpt_path="last")

Each ``Trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls) commits one cairn
checkpoint named after the file Lightning asked for (``epoch=2-step=300.ckpt``,
``last.ckpt``): ``cairn list`` shows it, ``cairn verify`` checks it, and a load reads it
back with every byte checked against its SHA-256. See :class:`CairnCheckpointIO` for
paths, ``"last"``, removal and what is guaranteed; :class:`AsyncCairnCheckpointIO` saves
in the background, the step waiting only for the copy of the tensors to host memory.
"""

from __future__ import annotations

# ruff: noqa: E402 (the imports after the check of the extra need it)
from cairn.errors import MissingExtraError

MissingExtraError.require("cairn.lightning", "lightning", ("torch",))

from cairn.lightning._io import POINTER_KIND, AsyncCairnCheckpointIO, CairnCheckpointIO

__all__ = ["POINTER_KIND", "AsyncCairnCheckpointIO", "CairnCheckpointIO"]
