"""Ray Train's upload hook through cairn (``cairn.ray.train_upload_fn``): a tiny
``TorchTrainer`` run on CPU, one of its workers killed after its second checkpoint,
resumed by Ray from the checkpoint it reads back through cairn."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import cairn
from support.paths import REPO

from cairn import CheckpointPaths, SyncCheckpointer

ray = pytest.importorskip("ray", reason="cairn.ray.train needs ray (the ray extra)")
pytest.importorskip("ray.train", reason="needs Ray Train (ray[train]: pandas, pyarrow)")
pytest.importorskip("torch", reason="a TorchTrainer run needs torch (the torch extra)")

from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from cairn.ray import train_storage, train_upload_fn  # noqa: E402
from cairn.ray.train import CairnTrainStorage  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    # Ray Data, which Ray Train imports, warns of its own deprecated settings
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]

EPOCHS = 4


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), path) if p)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as exc:
        pytest.skip(f"a local Ray cannot start: {exc}")
    try:
        yield
    finally:
        ray.shutdown()
        os.environ["PYTHONPATH"] = path


def train(config: dict[str, Any]) -> None:
    import ray.train
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    frozen = torch.nn.Linear(64, 64)  # never trained: its file is carried, not uploaded
    start, log = 0, Path(config["log"])
    restored = ray.train.get_checkpoint()
    if restored is not None:
        handler = restored.filesystem.handler
        with restored.as_directory() as local:
            state = json.loads(Path(local, "state.json").read_text())
            model.load_state_dict(torch.load(Path(local, "model.pt"), weights_only=True))
        start = state["epoch"] + 1
        with log.open("a") as out:
            out.write(json.dumps({"resumed_at": start, "via": type(handler).__name__}) + "\n")
    upload = train_upload_fn(config["store"])
    for epoch in range(start, EPOCHS):
        with torch.no_grad():
            model.weight += 1.0
        with tempfile.TemporaryDirectory() as local:
            torch.save(model.state_dict(), Path(local, "model.pt"))
            torch.save(frozen.state_dict(), Path(local, "frozen.pt"))
            Path(local, "state.json").write_text(json.dumps({"epoch": epoch}))
            os.utime(Path(local, "frozen.pt"), (1_000_000_000, 1_000_000_000))
            ray.train.report(
                {"epoch": epoch, "weight": float(model.weight.detach().sum())},
                checkpoint=Checkpoint.from_directory(local),
                checkpoint_upload_fn=upload,
            )
        marker = Path(config["marker"])
        if epoch == 1 and not marker.exists():
            # Once Ray Train has registered the second checkpoint (its reports are taken
            # in by the controller's poll, which a worker that exits at once can beat),
            # the worker dies.
            ray.train.get_all_reported_checkpoints(
                consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
            )
            marker.touch()
            os._exit(1)


def test_a_torch_trainer_resumes_from_a_checkpoint_it_reads_through_cairn(
    tmp_path: Path,
) -> None:
    store, log = tmp_path / "store", tmp_path / "log.jsonl"
    trainer = TorchTrainer(
        train,
        train_loop_config={"store": str(store), "marker": str(tmp_path / "died"), "log": str(log)},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
        run_config=RunConfig(
            storage_path=str(tmp_path / "ray"),
            storage_filesystem=train_storage(str(store)),
            name="tiny",
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    assert (tmp_path / "died").exists()
    assert result.metrics is not None and result.checkpoint is not None
    [resumed] = [json.loads(line) for line in log.read_text().splitlines()]
    assert resumed == {"resumed_at": 2, "via": "CairnTrainStorage"}  # after the second
    assert result.metrics["epoch"] == EPOCHS - 1
    # every epoch added 1 to each of the 8 weights: the resumed run lost and redid nothing
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    start = float(torch.nn.Linear(8, 1).weight.detach().sum())
    assert result.metrics["weight"] == pytest.approx(start + 8 * EPOCHS)
    assert isinstance(result.checkpoint.filesystem.handler, CairnTrainStorage)
    with result.checkpoint.as_directory() as local:
        assert json.loads(Path(local, "state.json").read_text()) == {"epoch": EPOCHS - 1}
        assert sorted(os.listdir(local)) == ["frozen.pt", "model.pt", "state.json"]
    with SyncCheckpointer(str(store), CheckpointPaths("")) as ckpt:
        manifests = [ckpt.load_manifest(cid) for cid in ckpt.list_checkpoints()]
    saves = EPOCHS + 2 - resumed["resumed_at"]  # the epochs redone saved again
    assert [m.epoch for m in manifests] == list(range(saves))
    for manifest in manifests[1:]:  # the frozen layer's file is carried, not uploaded
        assert manifest.stats is not None and manifest.stats.carried_bytes > 64 * 64 * 4
    run = cairn("verify", "--all", "--store", str(store), "--prefix", "", "--json")
    assert run.code == 0, run.explain()
    assert all(c["status"] == "ok" for c in run.json()["checkpoints"])
