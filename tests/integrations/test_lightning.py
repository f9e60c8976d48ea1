"""Lightning's Trainer checkpoints through :class:`cairn.lightning.CairnCheckpointIO`.

A small regression model trains for 3 epochs under ``ModelCheckpoint(save_top_k=2,
save_last=True)`` on local disk and on S3 (moto): ``cairn list`` shows the two best
checkpoints and one ``last.ckpt``; ``fit(ckpt_path="last")`` resumes with the weights and
optimizer state the first run ended with, and goes on exactly as an uninterrupted run; a
flipped byte in the stored checkpoint is refused with :class:`~cairn.IntegrityMismatchError`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import obstore
import pytest
from obstore.store import LocalStore, ObjectStore
from support.artifacts import artifact_path
from support.cli import cairn, s3_env, s3_store

pytest.importorskip("torch", reason="the torch extra is not installed")
pytest.importorskip("lightning", reason="the lightning extra is not installed")

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cairn import IntegrityMismatchError, ObjectStoreCheckpointer
from cairn.integrations._interface import run_blocking
from cairn.integrations.named import checkpoint_names, named_ids
from cairn.lightning import POINTER_KIND, AsyncCairnCheckpointIO, CairnCheckpointIO
from cairn.stores import ForwardingStore, PutMode, StoreMethod, as_store
from cairn.sync import SyncCheckpointer

T = TypeVar("T")

pytestmark = [pytest.mark.torch, pytest.mark.frameworks, pytest.mark.slow]

STEPS_PER_EPOCH = 4


class Regression(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def loader() -> DataLoader[Any]:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(16 * STEPS_PER_EPOCH, 8, generator=gen)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=16)


class StartStep(Callback):
    """Records the global step training starts at (after any restore)."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_start(self, trainer: Trainer, module: LightningModule) -> None:
        self.step = trainer.global_step


def trainer(epochs: int, plugins: list[Any], callbacks: list[Any]) -> Trainer:
    return Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        plugins=plugins,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )


def checkpointing(dirpath: Path) -> ModelCheckpoint:
    return ModelCheckpoint(
        dirpath=dirpath, save_top_k=2, save_last=True, monitor="train_loss", mode="min"
    )


def state_of(module: LightningModule, trainer: Trainer) -> tuple[dict[str, Any], dict[str, Any]]:
    return copy.deepcopy(module.state_dict()), copy.deepcopy(trainer.optimizers[0].state_dict())


def assert_same(a: Any, b: Any) -> None:
    """Equal nested dicts and lists of tensors and plain values, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


@dataclass
class Place:
    """Where the checkpoints go: what the plugin is given, how ``cairn`` reaches it, and the
    raw store (to damage it)."""

    store: Any
    cli: list[str]
    env: dict[str, str]
    raw: ObjectStore


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "local":
        root = tmp_path / "store"
        root.mkdir()
        return Place(str(root), ["--store", str(root)], {}, LocalStore(root))
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    store = s3_store(server, bucket)
    return Place(store, ["--store", f"s3://{bucket}"], s3_env(server), store)


@pytest.fixture(autouse=True)
def _quiet_lightning() -> Any:
    # Lightning's tips and info lines go to its loggers; its own deprecation notices about
    # torch (and torch's about itself) are warnings that are not this test's business.
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
        yield


def test_three_epochs_list_resume_and_refuse_a_flipped_byte(place: Place, tmp_path: Path) -> None:
    whole = Regression()
    trainer(4, [], [ModelCheckpoint(dirpath=tmp_path / "plain", save_top_k=0)]).fit(whole, loader())
    uninterrupted = state_of(whole, whole.trainer)

    dirpath = tmp_path / "ckpts"
    first = Regression()
    run = trainer(3, [CairnCheckpointIO(place.store)], [checkpointing(dirpath)])
    run.fit(first, loader())
    ended = state_of(first, run)

    listed = cairn("list", *place.cli, "--json", env=place.env)
    assert listed.code == 0, listed.explain()
    names = sorted(c["name"] for c in listed.json()["checkpoints"])
    kept = sorted(p.name for p in dirpath.iterdir())
    assert len(names) == 3 and names == kept, listed.explain()
    assert "last.ckpt" in names and sum(n.startswith("epoch=") for n in names) == 2
    assert POINTER_KIND in (dirpath / "last.ckpt").read_text()

    # Resume: the weights and optimizer state the first run ended with, then the same
    # fourth epoch as the uninterrupted run, bit for bit.
    io = CairnCheckpointIO(place.store)
    loaded = io.load_checkpoint(dirpath / "last.ckpt")
    assert_same(loaded["state_dict"], ended[0])
    assert_same(loaded["optimizer_states"][0], ended[1])
    start = StartStep()
    resumed = Regression()
    again = trainer(4, [io], [checkpointing(dirpath), start])
    again.fit(resumed, loader(), ckpt_path="last")
    assert start.step == 3 * STEPS_PER_EPOCH
    assert_same(state_of(resumed, again), uninterrupted)

    # A flipped byte in the newest last.ckpt: the resume is refused, nothing unpickled.
    ckpt = SyncCheckpointer.wrap(ObjectStoreCheckpointer(place.raw))
    newest = io.resolve("last")
    path = artifact_path(ckpt.paths, ckpt.load_manifest(newest), "lightning", 0)
    data = bytearray(obstore.get(place.raw, path).bytes())
    data[len(data) // 2] ^= 0x01
    obstore.put(place.raw, path, bytes(data))
    with pytest.raises(IntegrityMismatchError, match="lightning"):
        trainer(5, [CairnCheckpointIO(place.store)], [checkpointing(dirpath)]).fit(
            Regression(), loader(), ckpt_path="last"
        )


class SlowCommits(ForwardingStore):
    """Every manifest write waits a little: saves queued behind one another take long."""

    async def _around(
        self,
        operation: StoreMethod,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        mode: PutMode | None = None,
    ) -> T:
        if operation == "put" and path.endswith("manifest.json"):
            await asyncio.sleep(0.2)
        return await call()


def test_async_saves_and_removals_run_in_order(tmp_path: Path) -> None:
    store = SlowCommits(as_store(LocalStore(tmp_path / "store", mkdir=True)))
    dirpath = tmp_path / "ckpts"
    # The training thread only copies the tensors; the saves, and ModelCheckpoint's
    # removal of the worst one (at epoch 3), run behind it in call order: the removal
    # finds the checkpoint it removes committed, and nothing is left over.
    io = AsyncCairnCheckpointIO(store)
    trainer(3, [io], [checkpointing(dirpath)]).fit(Regression(), loader())
    names = sorted(p.name for p in dirpath.iterdir())
    assert len(names) == 3
    assert sorted(run_blocking(checkpoint_names(io.checkpointer))) == names
    for name in names:
        assert len(run_blocking(named_ids(io.checkpointer, name))) == 1, name


def test_remove_keeps_the_checkpoint_a_run_resumed_from(tmp_path: Path) -> None:
    store = tmp_path / "store"
    dirpath = tmp_path / "ckpts"
    trainer(3, [CairnCheckpointIO(str(store))], [checkpointing(dirpath)]).fit(
        Regression(), loader()
    )
    io = CairnCheckpointIO(str(store))
    names = sorted(p.name for p in dirpath.iterdir() if p.name != "last.ckpt")
    resumed_from = io.resolve(dirpath / names[0])
    io.load_checkpoint(names[0])  # by name, as on a machine without the pointer files
    assert io.loaded == resumed_from
    io.remove_checkpoint(dirpath / names[0])
    assert resumed_from in run_blocking(io.checkpointer.list_checkpoints()), "a run's origin"
    assert not (dirpath / names[0]).exists()
    io.remove_checkpoint(dirpath / names[1])
    assert run_blocking(named_ids(io.checkpointer, names[1])) == []
    assert not (dirpath / names[1]).exists()


def _no_cuda() -> str | None:
    if not torch.cuda.is_available():
        return "CUDA is not available here (torch.cuda.is_available() is False)"
    return None


@pytest.mark.skipif(_no_cuda() is not None, reason=str(_no_cuda()))
def test_a_gpu_run_saves_and_resumes_through_cairn(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    dirpath = tmp_path / "ckpts"

    def on_gpu(epochs: int, callbacks: list[Any]) -> Trainer:
        return Trainer(
            max_epochs=epochs,
            accelerator="gpu",
            devices=1,
            plugins=[CairnCheckpointIO(store)],
            callbacks=callbacks,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    first = Regression()
    run = on_gpu(2, [checkpointing(dirpath)])
    run.fit(first, loader())
    ended = state_of(first, run)
    loaded = CairnCheckpointIO(store).load_checkpoint("last")
    assert_same(loaded["state_dict"], {k: v.cpu() for k, v in ended[0].items()})
    start = StartStep()
    resumed = Regression()
    on_gpu(3, [checkpointing(dirpath), start]).fit(resumed, loader(), ckpt_path="last")
    assert start.step == 2 * STEPS_PER_EPOCH
    assert next(resumed.parameters()).is_cuda
