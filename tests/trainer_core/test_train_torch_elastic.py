"""``examples/train_torch.py --elastic`` (hvd.elastic) as an elastic job through ``launchkit
launch -n 2:3``: it trains and says each epoch with the number of workers; ``--elastic`` with a
choice that keeps state elsewhere is refused (exit 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the torch extra")

from tests.available import skip_without
from tests.trainer_core.markedjob import REPO, run_marked

skip_without("sklearn", reason="the digits come from scikit-learn")

SCRIPT = str(REPO / "examples" / "train_torch.py")


@pytest.mark.timeout(300)
def test_train_torch_elastic_trains_in_an_elastic_job() -> None:
    cmd = [sys.executable, SCRIPT, "--elastic", "--epochs", "2"]
    rc, out = run_marked(["-n", "2:3", "-s", "0", "--no-dashboard"], cmd, "TRAIN_TORCH_ELASTIC", 240)
    assert rc == 0, out
    epochs = [line for line in out.splitlines() if "test accuracy" in line]
    assert len(epochs) == 2 and all("(3 workers)" in line for line in epochs), out


def test_train_torch_elastic_with_a_checkpoint_is_refused() -> None:
    got = subprocess.run(
        [sys.executable, SCRIPT, "--elastic", "--checkpoint", "x.pt"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert got.returncode == 2 and "--elastic" in got.stderr and "Traceback" not in got.stderr, got.stderr
