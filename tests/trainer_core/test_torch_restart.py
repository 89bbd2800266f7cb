"""A torch job restarted by the launcher resumes from its checkpoint: ``launchkit launch -n 2 -s 0
--max-restarts 1 -- python examples/train_torch.py --compression 1bit --checkpoint PATH --resume``,
worker 1 SIGKILLed mid-training. The new attempt resumes from the last checkpoint
(``trainer_core.torch.checkpoint``: model, optimizer, every rank's 1-bit residuals, each rank's data
order) and prints the unbroken run's losses and accuracies, epoch for epoch; a job that loses a worker
and may not restart fails naming its rank; nothing is left.

The same through a parameter server (``-s 1``), with 1-bit compression and uncompressed with a
server-side SGD with momentum (``--server-optimizer``). A restart starts the whole job again,
servers included, so the new servers hold nothing: the checkpoint's servers' file (the stored
values, which are the weights with a server-side optimizer, its momentum, the servers' 1-bit pull
residuals) and each rank's file (model, optimizer, the KV store's 1-bit push residuals, the data
order) are what restore them."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest

from tests.available import skip_without
from tests.faults.faultjob import Job, assert_nothing_left, launch_args
from tests.trainer_core.markedjob import REPO
from tests.trainer_core.test_train_digits import EPOCH

pytest.importorskip("torch", reason="the torch extra: pip install -e '.[torch]'")
skip_without("sklearn")

EPOCHS = 6
OPTS = ["--compression", "1bit", "--epochs", str(EPOCHS)]
#: case -> (servers, the example's options)
CASES = {
    "allreduce-1bit": (0, ["--compression", "1bit"]),
    "ps-1bit": (1, ["--compression", "1bit"]),
    "ps-server-sgd-momentum": (1, ["--server-optimizer", "--momentum", "0.5", "--lr", "0.05"]),
}
RESUMED = re.compile(r"resumed at epoch (\d+)")


def epochs(out: str) -> list[tuple[str, ...]]:
    """(epoch, loss, accuracy) as rank 0 printed them."""
    return [m.groups() for m in EPOCH.finditer(out)]


def example(*args: str, opts: list[str] | None = None) -> list[str]:
    chosen = OPTS if opts is None else [*opts, "--epochs", str(EPOCHS)]
    return [sys.executable, "examples/train_torch.py", *chosen, *args]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_killed_worker_restarts_the_torch_job_from_its_checkpoint(
    case: str, tmp_path: Path, launchkit_home: Path
) -> None:
    servers, opts = CASES[case]
    ck = tmp_path / "torch.ck"
    job = Job(
        [
            *launch_args("--max-restarts", "1", "--restart-backoff", "0.2", servers=servers),
            *example("--checkpoint", str(ck), "--resume", opts=opts),
        ],
        launchkit_home,
        cwd=REPO,
    )
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

    unbroken = Job([*launch_args(servers=servers), *example(opts=opts)], launchkit_home, cwd=REPO)
    code, _ = unbroken.finish(timeout=150)
    assert code == 0, unbroken.out
    assert epochs(second) == epochs(unbroken.out)[resumed:], (job.out, unbroken.out)
    # older epochs' files are gone: only the last checkpoint's, one per rank (and the servers' one)
    files = [f"torch.ck.{EPOCHS}.rank{r}" for r in (0, 1)] + (
        [f"torch.ck.{EPOCHS}.server"] if servers else []
    )
    assert sorted(p.name for p in tmp_path.glob("torch.ck.*")) == files


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_worker_fails_the_torch_job_naming_its_rank(launchkit_home: Path) -> None:
    job = Job([*launch_args(servers=0), *example()], launchkit_home, cwd=REPO)
    job.wait_for("epoch   1 ", timeout=90)
    job.inject(job.pid("worker", 1), signal.SIGKILL)
    code, _ = job.finish(timeout=60)
    assert code == 128 + signal.SIGKILL, job.out
    assert re.search(r"launchkit: error: .*failed: worker 1 on \S+ was killed by signal 9", job.out), job.out
    assert_nothing_left(job.job_id)
