"""A torch job through a parameter server, restarted by the launcher, resumes from its checkpoint:
``launchkit launch -n 2 -s 1 --max-restarts 1 -- python examples/train_torch.py --compression 1bit
--checkpoint PATH --resume``, and the same uncompressed with a server-side SGD with momentum
(``--server-optimizer``), worker 1 SIGKILLed mid-training. A restart starts the whole job again,
servers included, so the new servers hold nothing: the checkpoint's servers' file (the stored
values, which are the weights with a server-side optimizer, its momentum, the servers' 1-bit pull
residuals) and each rank's file (model, optimizer, the KV store's 1-bit push residuals, the data
order) are what restore them. The second attempt prints the unbroken run's losses and
accuracies, epoch for epoch; nothing is left."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest

from tests.faults.faultjob import Job, assert_nothing_left, launch_args
from tests.trainer_core.markedjob import REPO
from tests.trainer_core.test_torch_restart import RESUMED, epochs

pytest.importorskip("torch", reason="the torch extra: pip install -e '.[torch]'")
pytest.importorskip("sklearn")

EPOCHS = 6
CASES = {
    "1bit": ["--compression", "1bit"],
    "server-sgd-momentum": ["--server-optimizer", "--momentum", "0.5", "--lr", "0.05"],
}


def example(case: str, *args: str) -> list[str]:
    return [sys.executable, "examples/train_torch.py", *CASES[case], "--epochs", str(EPOCHS), *args]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_killed_worker_restarts_the_ps_torch_job_from_its_checkpoint(
    case: str, tmp_path: Path, launchkit_home: Path
) -> None:
    ck = tmp_path / "torch.ck"
    job = Job([*launch_args("--max-restarts", "1", "--restart-backoff", "0.2", servers=1),
               *example(case, "--checkpoint", str(ck), "--resume")], launchkit_home, cwd=REPO)  # fmt: skip
    job.wait_for("epoch   2 ", timeout=120)  # mid-training: 2 of 6 epochs done and checkpointed
    job.inject(job.pid("worker", 1), signal.SIGKILL)
    code, _ = job.finish(timeout=150)
    assert code == 0, job.out
    assert re.search(r"attempt 1 failed \(.*worker 1.*\); restarting", job.out), job.out
    _, _, second = job.out.partition("(attempt 2 of 2)")
    m = RESUMED.search(second)
    assert m, f"the second attempt did not resume from the checkpoint:\n{job.out}"
    resumed = int(m.group(1))
    assert 2 <= resumed < EPOCHS, job.out
    assert [int(e[0]) for e in epochs(second)] == list(range(resumed + 1, EPOCHS + 1)), job.out
    assert_nothing_left(job.job_id)

    unbroken = Job([*launch_args(servers=1), *example(case)], launchkit_home, cwd=REPO)
    code, _ = unbroken.finish(timeout=150)
    assert code == 0, unbroken.out
    assert epochs(second) == epochs(unbroken.out)[resumed:], (job.out, unbroken.out)
    # only the last checkpoint's files: one per rank and the servers' one
    assert sorted(p.name for p in tmp_path.glob("torch.ck.*")) == [
        f"torch.ck.{EPOCHS}.rank0", f"torch.ck.{EPOCHS}.rank1", f"torch.ck.{EPOCHS}.server"
    ]  # fmt: skip
