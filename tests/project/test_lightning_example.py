"""The Lightning example works as its docstring says.

``examples/lightning_train.py --demo`` trains three times: an uninterrupted run, a run
SIGKILLed after step 20, and that run started again with only the store left (its
pointer files deleted), which resumes from the newest ``last.ckpt`` (step 16). Every step
either of the last two prints has the uninterrupted run's loss, bit for bit.
"""

from __future__ import annotations

import pytest
from support.paths import REPO, run_demo

pytest.importorskip("torch", reason="the torch extra is not installed")
pytest.importorskip("lightning", reason="the lightning extra is not installed")

pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.torch, pytest.mark.frameworks]

EXAMPLE = REPO / "examples" / "lightning_train.py"


def test_a_killed_lightning_run_resumes_with_the_same_loss_curve() -> None:
    returncode, stdout, explain = run_demo(EXAMPLE)
    assert returncode == 0, explain
    assert "... killed at step 20 (signal 9); the store holds:" in stdout, explain
    for name in ("epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt", "last.ckpt"):
        assert name in stdout, explain
    assert "resuming from last.ckpt (checkpoint " in stdout, explain
    resumed = stdout.split("no pointer files left) ==\n", 1)[1]
    assert resumed.splitlines()[1].startswith("step  17  loss "), "resumed after step 16"
    assert stdout.count("step  32  loss") == 2, "both runs trained to the end"
    assert stdout.rstrip().endswith("loss curves identical: True"), explain
