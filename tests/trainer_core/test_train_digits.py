"""End to end: ``launchkit launch -n 2 -s 1 --launcher local python examples/train_digits.py``
with real processes (scheduler, server, workers), checking the test accuracy rank 0 prints; and
``-s 0 ... --comm allreduce`` (no servers: the workers allreduce) against the servers' accuracy.

Each run carries a unique marker in its environment (``--env``); afterwards no process with that
marker may be left (every process the test started is gone).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.available import skip_without
from tests.trainer_core.markedjob import run_marked

EPOCH = re.compile(r"epoch\s+(\d+)\s+loss (\S+)\s+test accuracy ([\d.]+)%")
WIRE = re.compile(r"wire: (\d+) bytes per step per worker")

skip_without("sklearn")


def launch(*args: str, workers: int = 2, servers: int = 1, timeout: float = 60) -> str:
    """Run the example under the launcher; the combined output (asserts success and no leftovers)."""
    launch_args = ["-n", str(workers), "-s", str(servers)]
    rc, out = run_marked(
        launch_args, [sys.executable, "examples/train_digits.py", *args], "TRAIN_DIGITS_TEST", timeout
    )
    assert rc == 0, out
    return out


def accuracies(out: str) -> list[float]:
    return [float(m.group(3)) for m in EPOCH.finditer(out)]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_data_parallel_32bit_trains() -> None:
    out = launch("--epochs", "5", "--hidden", "64")
    acc = accuracies(out)
    assert len(acc) == 5 and acc[-1] >= 90.0, out
    m = WIRE.search(out)
    assert m and int(m.group(1)) == 2 * 4 * (64 * 64 + 64 + 64 * 10 + 10), out


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_async_sgd_reaches_90_percent() -> None:
    out = launch("--learner", "async", "--epochs", "5", "--hidden", "64")
    acc = accuracies(out)
    assert len(acc) == 5 and acc[-1] >= 90.0, out


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_block_momentum_reaches_90_percent() -> None:
    out = launch("--learner", "block_momentum", "--epochs", "5", "--hidden", "64")
    acc = accuracies(out)
    assert len(acc) == 5 and acc[-1] >= 90.0, out


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("compression", ["none", "1bit"])
def test_checkpoint_resume_continues(tmp_path: Path, compression: str) -> None:
    ck = tmp_path / "digits.npz"
    opts = ("--hidden", "32", "--compression", compression)
    first = launch("--epochs", "2", *opts, "--checkpoint", str(ck))
    assert [int(m.group(1)) for m in EPOCH.finditer(first)] == [1, 2]
    # rank 0's file, plus worker 1's own residuals when compressing
    extra = sorted(p.name for p in tmp_path.iterdir() if p != ck)
    assert ck.exists() and extra == ([] if compression == "none" else ["digits.worker1.npz"])
    second = launch("--epochs", "4", *opts, "--checkpoint", str(ck), "--resume")
    assert "resumed at epoch 2" in second, second
    assert [int(m.group(1)) for m in EPOCH.finditer(second)] == [3, 4]
    # the resumed run is the uninterrupted one: same losses and accuracies (2 workers: exact
    # sums; with 1 bit also the servers' and every worker's residuals are restored)
    straight = launch("--epochs", "4", *opts)
    tail = [m.groups() for m in EPOCH.finditer(straight)][2:]
    assert [m.groups() for m in EPOCH.finditer(second)] == tail


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_one_bit_data_parallel_reaches_90_percent_with_32x_fewer_bytes() -> None:
    out = launch("--compression", "1bit", "--epochs", "10")
    acc = accuracies(out)
    assert len(acc) == 10 and acc[-1] >= 90.0, out
    m = WIRE.search(out)
    raw = 2 * 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert m and "measured" in out and raw / int(m.group(1)) > 28, out


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("compression", "epochs"), [("none", 5), ("1bit", 10)])
def test_allreduce_without_servers_reaches_the_parameter_servers_accuracy(
    compression: str, epochs: int
) -> None:
    opts = ("--epochs", str(epochs), "--hidden", "64", "--compression", compression)
    ps = accuracies(launch(*opts))
    out = launch("--comm", "allreduce", *opts, servers=0)
    # no servers: with a scheduler process ("1 scheduler, 0 servers, 2 workers") or without one
    assert re.search(r"\(train_digits\): (1 scheduler, 0 servers, )?2 workers", out), out
    acc = accuracies(out)
    assert len(acc) == epochs and acc[-1] >= ps[-1] - 0.5 and acc[-1] >= 88.0, (ps, out)
    m = WIRE.search(out)
    raw = 2 * 4 * (64 * 64 + 64 + 64 * 10 + 10)
    assert m and raw / int(m.group(1)) > (28 if compression == "1bit" else 0.99), out


def test_resume_without_a_checkpoint_is_refused() -> None:
    """``--resume`` alone trained from scratch, saying nothing."""
    refused = subprocess.run(
        [sys.executable, "examples/train_digits.py", "--resume"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_"))},
    )
    assert refused.returncode == 2, refused.stderr
    assert "--resume continues from --checkpoint PATH: give it too" in refused.stderr
