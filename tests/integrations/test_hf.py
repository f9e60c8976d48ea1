"""Hugging Face's ``Trainer`` checkpoints through :class:`cairn.hf.CairnCallback`.

A tiny GPT-2 built from a config in code (nothing is downloaded) trains 4 steps with a
save every 2, ``save_total_limit=1``, on local disk and on S3 (moto). Each
``checkpoint-N`` is committed under its name, the second carrying the files equal to the
first's; cairn's GC keeps one checkpoint. Restored from the store into an empty
directory (the local output is deleted first), ``checkpoint-4`` resumes a run whose
next losses are the uninterrupted run's, to the last bit.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import warnings
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import LocalStore, ObjectStore
from support.cli import cairn, s3_env, s3_store

pytest.importorskip("torch", reason="the torch extra is not installed")
pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("accelerate", reason="the hf extra is not installed")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from cairn import (
    CheckpointNotFoundError,
    IntegrityMismatchError,
    ObjectStoreCheckpointer,
    StoreError,
)
from cairn.hf import CairnCallback, restore_checkpoint
from cairn.stores import ForwardingStore, Store, StoreMethod, as_store
from cairn.sync import SyncCheckpointer

pytestmark = [pytest.mark.torch, pytest.mark.frameworks, pytest.mark.slow]


class Examples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """16 fixed sequences of 16 token ids."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, 64, (16, 16), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Losses(TrainerCallback):
    """The training loss logged at each step."""

    def __init__(self) -> None:
        self.by_step: dict[int, float] = {}

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self.by_step[state.global_step] = logs["loss"]


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def train(
    output: Path, steps: int, callbacks: list[Any], resume: Path | None = None
) -> dict[int, float]:
    losses = Losses()
    args = TrainingArguments(
        output_dir=str(output),
        max_steps=steps,
        save_steps=2,
        save_total_limit=1,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        seed=0,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model(), args=args, train_dataset=Examples(), callbacks=[*callbacks, losses]
    )
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    return losses.by_step


@pytest.fixture(params=["local", "s3"])
def place(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[Any, list[str], dict[str, str], ObjectStore]:
    if request.param == "local":
        root = tmp_path / "store"
        root.mkdir()
        return str(root), ["--store", str(root)], {}, LocalStore(root)
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    store = s3_store(server, bucket)
    return store, ["--store", f"s3://{bucket}"], s3_env(server), store


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        yield


def test_two_saves_gc_to_the_limit_and_a_restored_checkpoint_resumes_exactly(
    place: tuple[Any, list[str], dict[str, str], ObjectStore], tmp_path: Path
) -> None:
    store, cli, env, raw = place
    uninterrupted = train(tmp_path / "whole", 6, [])

    callback = CairnCallback(store)
    first = train(tmp_path / "out", 4, [callback])
    assert first == {step: uninterrupted[step] for step in (1, 2, 3, 4)}
    assert len(callback.saved) == 2
    earlier, later = callback.saved

    # The second save carried what did not change (the config, ...) from the first and
    # uploaded the new weights; GC then kept only checkpoint-4 (save_total_limit=1).
    ckpt = SyncCheckpointer.wrap(ObjectStoreCheckpointer(raw))
    [folder] = ckpt.load_manifest(later).directories
    carried = {f.relative_path for f in folder.files if f.owner == earlier}
    assert "config.json" in carried and "model.safetensors" not in carried
    listed = cairn("list", *cli, "--json", env=env)
    assert listed.code == 0, listed.explain()
    assert [c["name"] for c in listed.json()["checkpoints"]] == ["checkpoint-4"]

    # Resume on a "new machine": nothing local, the directory restored from the store.
    shutil.rmtree(tmp_path / "out")
    restored = restore_checkpoint(store, "checkpoint-4", tmp_path / "restored")
    assert sorted(p.name for p in restored.iterdir()) == sorted(
        f.relative_path for f in folder.files
    )
    again = CairnCallback(store)
    resumed = train(tmp_path / "out", 6, [again], resume=restored)
    assert resumed == {5: uninterrupted[5], 6: uninterrupted[6]}

    # A flipped byte in the newest weights file: the restore is refused, writes nothing.
    newest = again.saved[-1]
    [files] = ckpt.load_manifest(newest).directories
    weights = next(f for f in files.files if f.relative_path == "model.safetensors")
    path = ckpt.paths.resolve(weights.owner or newest, weights.path)
    data = bytearray(obstore.get(raw, path).bytes())
    data[len(data) // 2] ^= 0x01
    obstore.put(raw, path, bytes(data))
    with pytest.raises(IntegrityMismatchError, match=r"model\.safetensors"):
        restore_checkpoint(store, "latest", tmp_path / "damaged")
    assert not (tmp_path / "damaged").exists() or not any((tmp_path / "damaged").iterdir())
    with pytest.raises(CheckpointNotFoundError, match="checkpoint-2"):
        restore_checkpoint(store, "checkpoint-2", tmp_path / "gone")


class SlowStore(ForwardingStore):
    """Each upload waits ``delay`` seconds first, and fails once ``failing`` is set."""

    def __init__(self, inner: Store, delay: float) -> None:
        super().__init__(inner)
        self.delay, self.failing = delay, False

    async def _around(
        self, operation: StoreMethod, path: str, call: Callable[[], Awaitable[Any]], **_: object
    ) -> Any:
        if operation in ("put", "put_stream"):
            await asyncio.sleep(self.delay)
            if self.failing:
                raise StoreError(operation, path, "refused on purpose")
        return await call()


class StepsWhileCommitting(TrainerCallback):
    """The steps that began while ``callback`` committed a checkpoint in the background,
    and how many checkpoints it had committed when each save's ``on_save`` returned."""

    def __init__(self, callback: CairnCallback) -> None:
        self.callback, self.steps, self.saved_by = callback, list[int](), dict[int, int]()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.callback.committing:
            self.steps.append(state.global_step + 1)

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.saved_by[state.global_step] = len(self.callback.saved)


def test_background_commits_run_beside_the_steps_and_finish_before_the_next_save(
    tmp_path: Path,
) -> None:
    uninterrupted = train(tmp_path / "whole", 6, [])
    root = tmp_path / "store"
    # Each upload is slow, so that without the wait before each save the Trainer's
    # rotation (save_total_limit=1) would delete a folder while it is uploaded.
    callback = CairnCallback(SlowStore(as_store(str(root)), delay=0.3), background=True)
    probe = StepsWhileCommitting(callback)

    losses = train(tmp_path / "out", 6, [callback, probe])

    assert losses == uninterrupted
    assert probe.steps and set(probe.steps) <= {3, 4, 5, 6}, probe.steps
    # checkpoint-2 and -4 were committed in the background; the run's last one in on_save.
    assert probe.saved_by == {2: 0, 4: 1, 6: 3}
    assert len(callback.saved) == 3 and not callback.committing
    with SyncCheckpointer(str(root)) as ckpt:
        assert [ckpt.load_manifest(c).name for c in ckpt.list_checkpoints()] == ["checkpoint-6"]
    restored = restore_checkpoint(str(root), "latest", tmp_path / "restored")
    written = tmp_path / "out" / "checkpoint-6"
    assert {p.name: p.read_bytes() for p in restored.iterdir()} == {
        p.name: p.read_bytes() for p in written.iterdir()
    }


class FailUploadsAfter(TrainerCallback):
    """Makes ``store`` refuse every upload from the end of step ``step`` on."""

    def __init__(self, store: SlowStore, step: int) -> None:
        self.store, self.step = store, step

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.step:
            self.store.failing = True


def test_a_failed_background_commit_stops_training_at_the_next_save(tmp_path: Path) -> None:
    store = SlowStore(as_store(str(tmp_path / "store")), delay=0.0)
    callback = CairnCallback(store, background=True)
    reached = Losses()
    with pytest.raises(StoreError, match="refused on purpose"):
        train(tmp_path / "out", 6, [callback, FailUploadsAfter(store, 4), reached])
    assert len(callback.saved) == 1  # checkpoint-2; checkpoint-4's commit failed
    assert max(reached.by_step) == 5  # raised before the Trainer wrote checkpoint-6
