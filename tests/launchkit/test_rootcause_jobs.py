"""The root cause of a job whose worker ends while the others wait for it, with real processes:
the launcher names that worker, what it did, what the others waited in, and the workers that
waited, not one of the waiting workers that failed because of it. In a collective (``launchkit
launch -s 0 --launcher local``, program: noserverprog.py ``early``) the worker exits 0, with or
without ``collective.shutdown()``, or raises; on the parameter-server path (``-s 1``) it exits 0
while the others wait in a sync round or in ``barrier()``. (The choice in-process:
test_rootcause.py.) Before, a worker that called ``shutdown()`` and exited 0, or one that exited 0
while the others waited at a server or in a barrier, was not named: a waiting worker (or the
scheduler) was."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.launchkit.noserver import PROG
from tests.launchkit.procs import pids_with_job, record, run, wait_for_job, wait_until

pytestmark = pytest.mark.timeout(150)


def waiting(workers: int, gone: int) -> str:
    """``worker 0``, ``workers 0 and 2``, ``workers 0, 1 and 2`` (as the launcher writes them)."""
    ranks = [str(r) for r in range(workers) if r != gone]
    if len(ranks) == 1:
        return f"worker {ranks[0]}"
    return f"workers {', '.join(ranks[:-1])} and {ranks[-1]}"


def named_waiting(text: str, head: str, what: str, workers: int, gone: int) -> None:
    """``text`` has ``head`` ``while WAITERS waited for it in what``, WAITERS some of the other
    workers (at the servers, one worker's refusal can end the job before another's request
    arrived, so that one did not wait: the launcher names only those that did)."""
    m = re.search(
        re.escape(head) + r" while workers? ([\d, and]+?) waited for it in " + re.escape(what), text
    )
    assert m, text[-3000:]
    named = {int(r) for r in re.findall(r"\d+", m.group(1))}
    assert named and named <= set(range(workers)) - {gone}, (named, text[-3000:])


def early(tmp_path: Path, launchkit_home: Path, workers: int, gone: int, how: str, servers: int = 0) -> str:
    """Run the job; the launcher's stderr, once the job has ended with exit 1 and left nothing."""
    job = [sys.executable, PROG, "early", str(gone), how]
    if servers:
        (tmp_path / "job.py").write_text(PS_JOB)
        job = [sys.executable, "job.py", str(gone), how]
    res = run(
        [
            "launch",
            "-n",
            str(workers),
            "-s",
            str(servers),
            "--launcher",
            "local",
            "--grace-period",
            "2",
            *job,
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    job = wait_for_job(launchkit_home)
    assert record(launchkit_home, job)["state"] == "failed"
    assert wait_until(lambda: not pids_with_job(job), 5)
    return res.stderr


@pytest.mark.parametrize(
    ("workers", "gone", "how"),
    [
        (2, 1, "exit"),
        (3, 1, "exit"),
        (4, 3, "exit"),
        (2, 1, "shutdown"),
        (3, 1, "shutdown"),
        (4, 2, "shutdown"),
    ],
)
def test_a_worker_that_exits_0_while_the_others_wait_is_named_with_what_they_waited_in(
    tmp_path: Path, launchkit_home: Path, workers: int, gone: int, how: str
) -> None:
    """``exit``: it ends without leaving the group (its channels close: the others learn it
    died); ``shutdown``: it leaves the group first (the others fail at once, ``PeerShutDown``)."""
    err = early(tmp_path, launchkit_home, workers, gone, how)
    said = (
        f"failed: worker {gone} on localhost exited 0 while {waiting(workers, gone)} waited for it "
        "in allreduce 'grad.3'"
    )
    assert said in " ".join(err.split()), err[-3000:]
    if how == "shutdown":
        assert f"PeerShutDown: collective: rank {gone} (worker {gone} on " in err, err[-3000:]


@pytest.mark.parametrize(("workers", "gone"), [(2, 1), (3, 1), (4, 2)])
def test_a_worker_that_raises_while_the_others_wait_is_named_with_what_they_waited_in(
    tmp_path: Path, launchkit_home: Path, workers: int, gone: int
) -> None:
    err = early(tmp_path, launchkit_home, workers, gone, "raise")
    said = f"failed: worker {gone} on localhost exited with code 1"
    text = " ".join(err.split())
    assert said in text, err[-3000:]
    # its abort reaches the others at once: those already in 'grad.3' say they waited for it there
    # (one that had not submitted it yet has nothing to say)
    if f"{said} while" in text:
        named_waiting(text, said, "allreduce 'grad.3'", workers, gone)
    assert f"ValueError: boom from worker {gone}" in err.split(f"last lines of worker {gone}:")[1]


PS_JOB = """\
import sys
import numpy as np
from trainer_core import kv
store = kv.create("dist_sync")
store.init("w", np.zeros(4, np.float32))
out = np.empty(4, np.float32)
store.pushpull("w", np.ones(4, np.float32), out)
where, how = sys.argv[2].split("-")
if store.rank == int(sys.argv[1]):
    print("worker ends early", flush=True)
    if how == "raise":
        raise ValueError(f"boom from worker {store.rank}")
    sys.exit(0)  # its store finishes as the process exits: the others still wait for it
if where == "barrier":
    store.barrier()
else:  # the next sync round, which waits for every worker's push
    store.pushpull("w", np.ones(4, np.float32), out)
"""

ROUND = "a sync round (pushpull request to server 0)"


@pytest.mark.parametrize(
    ("workers", "gone", "where", "what"),
    [
        (2, 1, "round", ROUND),
        (3, 1, "round", ROUND),
        (2, 1, "barrier", "barrier()"),
        (3, 2, "barrier", "barrier()"),
    ],
)
def test_a_worker_that_exits_0_while_the_others_wait_at_the_servers_is_named(
    tmp_path: Path, launchkit_home: Path, workers: int, gone: int, where: str, what: str
) -> None:
    """Its store finishes as it exits: the others' sync round is refused by the server (``worker 1
    finished while this request waited for its push``), or the scheduler ends their barrier."""
    err = early(tmp_path, launchkit_home, workers, gone, f"{where}-exit", servers=1)
    head = f"failed: worker {gone} on localhost exited 0"
    named_waiting(" ".join(err.split()), head, what, workers, gone)


@pytest.mark.parametrize(("workers", "where"), [(2, "round"), (3, "barrier")])
def test_a_worker_that_raises_while_the_others_wait_at_the_servers_is_named(
    tmp_path: Path, launchkit_home: Path, workers: int, where: str
) -> None:
    """It fails on its own (its abort reaches every node): named with its exit code and traceback;
    in a barrier the others' lines also say that they waited for it there."""
    err = early(tmp_path, launchkit_home, workers, 1, f"{where}-raise", servers=1)
    said = "failed: worker 1 on localhost exited with code 1"
    text = " ".join(err.split())
    assert said in text, err[-3000:]
    if where == "barrier" and f"{said} while" in text:  # (the others may not have reached it yet)
        named_waiting(text, said, "barrier()", workers, 1)
    assert "ValueError: boom from worker 1" in err.split("last lines of worker 1:")[1]
