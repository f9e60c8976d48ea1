"""Hugging Face ``transformers.Trainer`` on cairn: every ``checkpoint-N`` a verified checkpoint.

Install with ``pip install '.[hf]'`` from a clone (transformers and accelerate). Then::

    from transformers import Trainer, TrainingArguments
    from cairn.hf import CairnCallback, restore_checkpoint

    args = TrainingArguments("out", save_steps=500, save_total_limit=3)
    trainer = Trainer(model, args, train_dataset=data, callbacks=[CairnCallback("s3://bucket/run")])
    trainer.train()

    # on another machine: the newest checkpoint-N, every file verified, then resume
    folder = restore_checkpoint("s3://bucket/run", "latest", "restored")
    trainer.train(resume_from_checkpoint=str(folder))

Each ``checkpoint-N`` directory the Trainer writes is committed as one cairn checkpoint
named ``checkpoint-N`` whose one directory partition holds its files; a file equal to
the previous checkpoint's (same SHA-256) is carried by reference, not uploaded again.
With ``save_total_limit``, cairn's GC keeps that many newest checkpoints (and the best
one, with ``load_best_model_at_end``). See :class:`CairnCallback`.
"""

from __future__ import annotations

# ruff: noqa: E402 (the imports after the check of the extra need it)
from cairn.errors import MissingExtraError

MissingExtraError.require("cairn.hf", "hf", ("torch", "transformers", "accelerate"))

from cairn.hf._callback import OPERATOR, CairnCallback, restore_checkpoint

__all__ = ["OPERATOR", "CairnCallback", "restore_checkpoint"]
