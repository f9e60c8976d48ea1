"""The DCP training example works as its docstring (and the README) says.

``examples/torch_train.py --demo`` trains under torchrun with two ranks three times: an
uninterrupted run, a run whose rank 1 is SIGKILLed at step 25, and that run resumed
from its newest cairn checkpoint (with ``dcp.async_save``). The loss curves must be
identical, bit for bit. The killed run ends in the one line that says the kill was the
injected one and the checkpoint of step 20 is intact, not in tracebacks.
"""

from __future__ import annotations

import pytest
from support.paths import REPO, run_demo

pytest.importorskip("torch")  # the torch extra; CI installs it (scripts/test.sh)

pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.torch]

EXAMPLE = REPO / "examples" / "torch_train.py"


def test_a_killed_training_run_resumes_with_the_same_loss_curve() -> None:
    returncode, stdout, explain = run_demo(EXAMPLE)
    assert returncode == 0, explain
    assert "killed at step 25 (exit code 1)" in stdout, explain
    summary = (
        "rank 1 was killed on purpose after step 25 (--kill-at 25); the newest checkpoint, "
        "step 20, is intact (every digest verified); run again without --kill-at to resume "
        "from it\n"
    )
    assert f"(exit code 1)\n{summary}" in stdout, explain
    assert "Traceback" not in explain, "the expected kill is summarised, not dumped"
    assert "at step 20" in stdout, "resumed from the checkpoint of step 20"
    *_, verdict, hint = stdout.rstrip().splitlines()
    assert verdict == "loss curves identical: True", explain
    # The demo's stores are temporary: it names no command to look at them afterwards.
    assert "cairn list --store ./dcp-run" not in stdout.replace(hint, "")
    assert "cairn list --store" not in stdout.replace(hint, ""), explain
    assert "(temporary, deleted when the demo ends)" in stdout, explain
    assert hint.startswith("the demo's stores are deleted; to keep checkpoints for `cairn")
    assert stdout.count("step  39  loss") == 2, "both runs trained to the end"
