"""What the engine backends' tests share: the contract check, starting a launch that keeps
running, ending it each way (launchkit kill, Ctrl-C, SIGKILL of the launcher), the
--detach round trip (submit, ps, logs, top, kill), and the teardown timing of a job whose
processes trap SIGTERM (``teardown``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.launchkit.procs import LAUNCHKIT, PROG, pids_with_job, record, run, wait_for_job, wait_until


def env_of(cluster, home: Path) -> dict[str, str]:
    """The launcher's environment for a job on ``cluster``'s engine, with its own job records."""
    return {**os.environ, **cluster.env, "LAUNCHKIT_HOME": str(home)}


def gone(cluster, job: str) -> bool:
    """Nothing of the job left: no job in the engine's queue, no process on this machine."""
    return not cluster.job_ids() and not pids_with_job(job)


SHIM = "launchkit.hostside.shim"


def shims_of(job: str, cwd: Path) -> list[int]:
    """This machine's rank shims (``pgrep -f launchkit.hostside.shim``) of job ``job``, or working
    in ``cwd`` or below it (a shim that lost the job's environment still counts); never those of
    another test's job, which may run beside this one (another pytest-xdist worker)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
            if SHIM.encode() not in cmdline:
                continue
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            workdir = Path(os.readlink(f"/proc/{name}/cwd"))
        except OSError:  # ended meanwhile
            continue
        if f"LAUNCHKIT_JOB_ID={job}".encode() in environ or workdir.is_relative_to(cwd):
            found.append(int(name))
    return found


def check_contract(envs: dict, servers: int, workers: int, cluster: str) -> None:
    """Every process once, with its role, ranks, task id, counts and one job id and secret."""
    assert sorted(envs) == sorted(
        [("scheduler", 0)] + [("server", i) for i in range(servers)] + [("worker", i) for i in range(workers)]
    )
    secrets = {e["LAUNCHKIT_JOB_SECRET"] for e in envs.values()}
    assert len(secrets) == 1 and len(secrets.pop()) == 64
    for (role, rank), e in envs.items():
        assert e["DMLC_ROLE"] == role and e["LAUNCHKIT_ROLE_RANK"] == str(rank)
        assert e["DMLC_JOB_CLUSTER"] == cluster
        assert e["DMLC_NUM_SERVER"] == str(servers) and e["DMLC_NUM_WORKER"] == str(workers)
        task_id = rank if role == "server" else servers + rank if role == "worker" else servers + workers
        assert e["DMLC_TASK_ID"] == str(task_id)
    assert len({e["LAUNCHKIT_JOB_ID"] for e in envs.values()}) == 1


def program(cwd: Path) -> str:
    """The test program, copied into the job's directory: every node sees that directory (a
    namespace host need not see the checkout)."""
    shutil.copy(PROG, cwd / "jobprog.py")
    return "jobprog.py"


def start_waiting_job(launcher: str, cwd: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    """A 2-worker, 1-server job whose processes wait 60 s, launched in a session of its own."""
    prog = program(cwd)
    return subprocess.Popen(
        [
            *LAUNCHKIT,
            "launch",
            "--launcher",
            launcher,
            "-n",
            "2",
            "-s",
            "1",
            *extra,
            "python3",
            prog,
            "wait",
            "60",
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def end_running_job(
    how: str,
    launcher: str,
    cwd: Path,
    home: Path,
    env: dict[str, str],
    gone: Callable[[str], bool],
    extra: tuple[str, ...] = (),
) -> None:
    """Start a job, wait until all of it runs, end it by ``how`` and check nothing is left."""
    proc = start_waiting_job(launcher, cwd, env, *extra)
    try:
        job = wait_for_job(home)
        assert wait_until(lambda: len(pids_with_job(job)) >= 8, 30)  # a shim and a program per process
        if how == "kill":
            res = run(["kill", job], env=env)
            assert res.returncode == 0, res.stderr
            assert proc.wait(30) == 143
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        else:
            proc.kill()
            proc.wait(5)
        assert wait_until(lambda: gone(job), 20)
    finally:
        proc.kill()


def detach_round_trip(
    launcher: str, cwd: Path, home: Path, env: dict[str, str], gone: Callable[[str], bool]
) -> str:
    """--detach, then ps, logs, top and kill on the running job; returns the job id."""
    res = run(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "1",
            "--launcher",
            launcher,
            "--detach",
            "python3",
            program(cwd),
            "wait",
            "60",
        ],
        cwd=cwd,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    assert f"submitted as {launcher} job" in res.stderr
    assert wait_until(lambda: len(pids_with_job(job)) >= 6, 30)  # it runs with no launcher at all
    ps = run(["ps"], env=env)
    assert job in ps.stdout and "running" in ps.stdout
    assert wait_until(lambda: "[worker 0] ready" in run(["logs", job], env=env).stdout, 10)
    top = run(["top", job, "--once"], env=env)
    assert top.returncode == 0 and top.stdout.count("running") >= 3, top.stdout
    res = run(["kill", job], env=env)
    assert res.returncode == 0 and f"cancelled {launcher} job" in res.stdout, res.stderr
    assert wait_until(lambda: gone(job), 20)
    assert record(home, job)["state"] == "killed"
    return job


def detached_failure(
    launcher: str, cwd: Path, home: Path, env: dict[str, str], idle: Callable[[], bool]
) -> None:
    """A detached job whose worker exits 3: recorded as failed with 3 once the engine is done."""
    res = run(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--launcher",
            launcher,
            "--detach",
            "--grace-period",
            "1",
            "python3",
            program(cwd),
            "fail",
            "worker",
            "0",
            "3",
        ],
        cwd=cwd,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    assert wait_until(idle, 30)
    assert wait_until(lambda: "failed" in run(["ps", "--all"], env=env).stdout, 10)
    assert record(home, job)["exit_code"] == 3
    if launcher == "slurm":  # the batch job removed worker 0's address (-s 0: no launcher stays)
        assert not list(cwd.glob(".launchkit-*.worker0"))


#: Every process of the job writes `start T` to MARKS/ROLE-RANK, and `term T` when SIGTERM comes
#: (it traps it, and exits 143); with `fail`, worker 1 exits 3 (`fail T`) once all have started.
#: It writes its pid first (`pid P`).
TEARDOWN_SH = """\
f="$1/$DMLC_ROLE-$LAUNCHKIT_ROLE_RANK"
trap 'echo "term $(date +%s.%N)" >> "$f"; exit 143' TERM
echo "pid $$" >> "$f"
echo "start $(date +%s.%N)" >> "$f"
if [ "$2" = fail ] && [ "$DMLC_ROLE" = worker ] && [ "$LAUNCHKIT_ROLE_RANK" = 1 ]; then
  while [ "$(ls "$1" | wc -l)" -lt "$3" ]; do sleep 0.05; done
  echo "fail $(date +%s.%N)" >> "$f"
  exit 3
fi
while :; do sleep 0.1; done
"""


@dataclass
class Teardown:
    """How a job with TERM-trapping processes ended: seconds from the cause (worker 1's failure,
    the SIGINT, the `launchkit kill`) to the launcher's exit, and to each process's SIGTERM."""

    rc: int
    exit_s: float
    term_s: dict[str, float]
    stderr: str
    stdout: str


def marks(directory: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for p in directory.iterdir():
        words = [line.split() for line in p.read_text().splitlines()]
        out[p.name] = {w[0]: float(w[1]) for w in words if len(w) == 2}
    return out


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def teardown(
    how: str,
    launcher: str,
    cwd: Path,
    home: Path,
    env: dict[str, str],
    extra: tuple[str, ...] = (),
    grace: int = 10,
) -> Teardown:
    """Run a 2-worker, 1-server job whose processes trap SIGTERM, with a long grace period, and
    end it by ``how``: ``fail`` (worker 1 exits 3), ``sigint`` (to the launcher), ``kill``,
    ``kill9`` (a SIGKILL of worker 1's parent: an engine's shim, on this machine), ``stalled``
    (the same, with the engine process the launcher started, mpirun, stopped: it passes nothing on)."""
    (cwd / "teardown.sh").write_text(TEARDOWN_SH)
    box = cwd / "marks"
    box.mkdir()
    mode = "fail" if how == "fail" else "wait"
    stopped = 0
    proc = subprocess.Popen(
        [
            *LAUNCHKIT,
            "launch",
            "--launcher",
            launcher,
            "-n",
            "2",
            "-s",
            "1",
            "--grace-period",
            str(grace),
            *extra,
            "--",
            "sh",
            "teardown.sh",
            str(box),
            mode,
            "4",
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        started = lambda: len(marks(box)) == 4 and all("start" in m for m in marks(box).values())  # noqa: E731
        assert wait_until(started, 40), marks(box)
        t0 = time.time()
        if how == "sigint":
            proc.send_signal(signal.SIGINT)
        elif how in ("kill9", "stalled"):
            shim = parent_of(int(marks(box)["worker-1"]["pid"]))
            if how == "stalled":
                stopped = shim
                while parent_of(stopped) != proc.pid:
                    stopped = parent_of(stopped)
                os.kill(stopped, signal.SIGSTOP)
            os.kill(shim, signal.SIGKILL)
        elif how == "kill":
            killer = subprocess.Popen(
                [*LAUNCHKIT, "kill", wait_for_job(home)],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        out, err = proc.communicate(timeout=45)
        ended = time.time()
        if how == "kill":
            said, _ = killer.communicate(timeout=30)
            assert killer.returncode == 0, said
            err += f"{said}(launchkit kill took {time.time() - t0:.1f}s)\n"
    finally:
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        proc.kill()
    seen = marks(box)
    if how == "fail":
        t0 = seen["worker-1"]["fail"]
    terms = {name: m["term"] - t0 for name, m in seen.items() if "term" in m}
    return Teardown(proc.returncode, ended - t0, terms, err, out)
