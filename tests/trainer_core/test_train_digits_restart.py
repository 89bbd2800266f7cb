"""A job without servers restarted by the launcher resumes from its checkpoint: ``launchkit launch
-n 2 -s 0 --max-restarts 1 -- python examples/train_digits.py --comm allreduce --checkpoint PATH
--resume``, worker 1 killed (SIGKILL) mid-training. The launcher starts the whole job again; the
new attempt resumes from the last checkpoint (rank 0 says which epoch, and trains only the epochs
after it) and ends where an unbroken run ends: the same losses and accuracies, epoch for epoch,
since every worker's compressed allreduce residuals and local learner state come back as saved.

Only the launcher's public behaviour is used (its output, the job's processes found by their
environment), so this holds whether ``-s 0`` starts a scheduler process or worker 0 serves the
rendezvous.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest

from tests.available import skip_without
from tests.faults.faultjob import Job, assert_nothing_left, launch_args
from tests.trainer_core.markedjob import REPO
from tests.trainer_core.test_train_digits import EPOCH, accuracies, launch

skip_without("sklearn")

EPOCHS = 6
KILL_AFTER = 2  # worker 1 is SIGKILLed once rank 0 printed (and so checkpointed) this epoch
RESUMED = re.compile(r"resumed at epoch (\d+)")
# the launcher sees the kill (the process ends); nothing here waits on a heartbeat, whose 2 s bound
# (faultjob.FAST_LIVENESS) a loaded machine can starve a process for
PATIENT = ("--env", "PS_HEARTBEAT_TIMEOUT:10")


def epochs(out: str) -> list[tuple[str, ...]]:
    """(epoch, loss, accuracy) as rank 0 printed them."""
    return [m.groups() for m in EPOCH.finditer(out)]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("learner", "compression"),
    [("data_parallel", "none"), ("data_parallel", "1bit"), ("model_averaging", "1bit")],
)
def test_killed_worker_restarts_the_allreduce_job_from_its_checkpoint(
    tmp_path: Path, launchkit_home: Path, learner: str, compression: str
) -> None:
    opts = [
        "--comm",
        "allreduce",
        "--epochs",
        str(EPOCHS),
        "--hidden",
        "64",
        "--learner",
        learner,
        "--compression",
        compression,
    ]
    ck = tmp_path / "digits.npz"
    job = Job(
        [
            *launch_args(*PATIENT, "--max-restarts", "1", "--restart-backoff", "0.2", servers=0),
            sys.executable,
            "examples/train_digits.py",
            *opts,
            "--checkpoint",
            str(ck),
            "--resume",
        ],
        launchkit_home,
        cwd=REPO,
    )
    worker_1 = job.pid("worker", 1, timeout=60)  # found before: the kill follows the line at once
    job.wait_for(f"epoch {KILL_AFTER:3d} ", timeout=60)  # mid-training: checkpointed, epochs to go
    job.inject(worker_1, signal.SIGKILL)
    code, _ = job.finish(timeout=120)
    assert code == 0, job.out
    assert re.search(r"attempt 1 failed \(.*worker 1.*\); restarting", job.out), job.out
    _, _, second = job.out.partition("(attempt 2 of 2)")
    assert second, job.out
    m = RESUMED.search(second)
    assert m, f"the second attempt did not resume from the checkpoint:\n{job.out}"
    resumed = int(m.group(1))
    assert KILL_AFTER <= resumed < EPOCHS, job.out  # from the checkpoint, not from zero
    assert [int(e[0]) for e in epochs(second)] == list(range(resumed + 1, EPOCHS + 1)), job.out
    assert_nothing_left(job.job_id)

    unbroken = launch(*opts, servers=0, timeout=120)
    # the resumed epochs are the unbroken run's, exactly; so is the accuracy it reaches
    assert epochs(second) == epochs(unbroken)[resumed:], (job.out, unbroken)
    assert abs(accuracies(second)[-1] - accuracies(unbroken)[-1]) <= 0.5


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_resume_without_a_workers_file_is_refused_naming_it(tmp_path: Path, launchkit_home: Path) -> None:
    ck = tmp_path / "digits.npz"
    opts = [
        "--comm",
        "allreduce",
        "--hidden",
        "32",
        "--compression",
        "1bit",
        "--checkpoint",
        str(ck),
        "--resume",
    ]
    launch(*opts, "--epochs", "1", servers=0)
    (tmp_path / "digits.worker1.npz").unlink()
    job = Job(
        [*launch_args(servers=0), sys.executable, "examples/train_digits.py", *opts, "--epochs", "2"],
        launchkit_home,
        cwd=REPO,
    )
    code, _ = job.finish(timeout=60)
    assert code != 0, job.out
    assert (
        f"train_digits.py: error: cannot resume from {ck}: {tmp_path / 'digits.worker1.npz'}: worker 1's state of checkpoint {ck} is missing"
        in job.out
    ), job.out
    # worker 1 says why and exits 2; the launcher names it (worker 0 fails in its next collective)
    assert "[worker 1] Traceback" not in job.out and "epoch   2" not in job.out, job.out
    assert re.search(r"launchkit: error: .*worker 1 on \S+ exited with code 2", job.out), job.out
    assert_nothing_left(job.job_id)
