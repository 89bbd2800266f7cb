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

EPOCHS = 4
KILL_AFTER = 1  # worker 1 is SIGKILLed once rank 0 printed (and so every rank saved) this epoch
OPTS = ["--compression", "1bit", "--epochs", str(EPOCHS)]
#: case -> (servers, the example's options)
CASES = {
    "allreduce-1bit": (0, ["--compression", "1bit"]),
    "ps-1bit": (1, ["--compression", "1bit"]),
    "ps-server-sgd-momentum": (1, ["--server-optimizer", "--momentum", "0.5", "--lr", "0.05"]),
}
RESUMED = re.compile(r"resumed at epoch (\d+)")
# the launcher sees the kill (the process ends); nothing here waits on a heartbeat, whose 2 s bound
# (faultjob.FAST_LIVENESS) a loaded machine can starve a process for while it loads torch and numba
PATIENT = ("--env", "PS_HEARTBEAT_TIMEOUT:10")


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
            *launch_args(*PATIENT, "--max-restarts", "1", "--restart-backoff", "0.2", servers=servers),
            *example("--checkpoint", str(ck), "--resume", opts=opts),
        ],
        launchkit_home,
        cwd=REPO,
    )
    worker_1 = job.pid("worker", 1, timeout=120)  # found before: the kill follows the line at once
    job.wait_for(f"epoch {KILL_AFTER:3d} ", timeout=120)  # mid-training: checkpointed, epochs to go
    job.inject(worker_1, signal.SIGKILL)
    code, _ = job.finish(timeout=150)
    assert code == 0, job.out
    assert re.search(r"attempt 1 failed \(.*worker 1.*\); restarting", job.out), job.out
    _, _, second = job.out.partition("(attempt 2 of 2)")
    m = RESUMED.search(second)
    assert m, f"the second attempt did not resume from the checkpoint:\n{job.out}"
    resumed = int(m.group(1))
    assert KILL_AFTER <= resumed < EPOCHS, job.out
    assert [int(e[0]) for e in epochs(second)] == list(range(resumed + 1, EPOCHS + 1)), job.out
    assert_nothing_left(job.job_id)

    unbroken = Job([*launch_args(*PATIENT, servers=servers), *example(opts=opts)], launchkit_home, cwd=REPO)
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
    job = Job([*launch_args(*PATIENT, servers=0), *example()], launchkit_home, cwd=REPO)
    worker_1 = job.pid("worker", 1, timeout=90)
    job.wait_for(f"epoch {KILL_AFTER:3d} ", timeout=90)
    job.inject(worker_1, signal.SIGKILL)
    code, _ = job.finish(timeout=60)
    assert code == 128 + signal.SIGKILL, job.out
    assert re.search(r"launchkit: error: .*failed: worker 1 on \S+ was killed by signal 9", job.out), job.out
    assert_nothing_left(job.job_id)
