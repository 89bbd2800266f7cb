"""Launch at scale over namespace hosts: launchkit beside pdsh, mpirun and launch.py's
way, on the same hosts, in one run.

    sudo python -m bench.scale [--hosts 8 32] [--per-host 2] [--repeat 2] [--json out.json]

Needs root: the hosts are network namespaces, each with its own sshd (``tests/cluster/netns.py``,
as the tests make them). Per host count, alternating rounds (the first round's results are
kept: each tool's first connection to a host records its key before the rounds):

- **launchkit**: ``launchkit launch -H HOSTS -n P -s 0`` of processes that print ``UP <time>``
  and sleep (``echo "UP $(date +%s.%N)"; exec sleep 600`` under ``sh -c``, in every column):
  the time from the start to the last ``UP``; then ``launchkit kill JOB`` and the time
  until nothing of the job is left (no process with its job id, on any host) and the launcher
  has exited; a second launch ended by SIGINT to the launcher (Ctrl-C), timed the same way.
  The launcher's peak RSS (``ru_maxrss``), its CPU seconds (user + system, its own process) and
  its peak thread count (sampled every 50 ms from ``/proc``);
- **pdsh**: ``pdsh -R ssh -w HOSTS true`` (Debian's pdsh, its default fan-out of 32; installed
  with apt-get when missing): the time until it exits;
- **mpirun**: Open MPI's ``mpirun`` with P ranks over the same hosts (its tree spawn over ssh),
  of the same ``UP`` program: the time to the last ``UP``, then SIGTERM to mpirun;
- with ``--compare DIR``: launchkit from another copy of its source too (``git archive REV``
  unpacked there), its columns prefixed ``[DIR]``, before or after this one in turn;
- **one ssh per process** (launch.py's way, Horovod's and DeepSpeed's per host): P ``ssh`` at
  once, each running one ``UP`` program: the time to the last ``UP``.

Before each timed column the bench waits (30 s at most) until the machine is quiet (under a fifth
of a core busy for half a second): the end of the column before on 128 hosts does not count in
the next one. Prints a Markdown table. The machine has 2 cores: the ssh handshakes bound every column.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale_trace import machine_busy  # noqa: E402
from tests.cluster.netns import HostGroup  # noqa: E402
from tests.launchkit.procs import pids_with_job  # noqa: E402

#: the trivial process: says when it runs (the clock is the machine's, shared by the hosts), waits
UP = 'echo "UP $(date +%s.%N)"; exec sleep 600'


def launch_argv(group: HostGroup, hostfile: Path, procs: int, program: list[str]) -> list[str]:
    """``launchkit launch`` of ``procs`` workers of ``program`` over ``group`` (no servers, no dashboard)."""
    return [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "-H",
        str(hostfile),
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
        "--no-dashboard",
        "-n",
        str(procs),
        "-s",
        "0",
        *program,
    ]


def pdsh_argv(group: HostGroup, command: str, fanout: int | None = None) -> tuple[list[str], dict[str, str]]:
    """``pdsh`` running ``command`` on every host of ``group`` (its default window unless
    ``fanout``), and the environment that gives its ssh the group's options."""
    env = {**os.environ, "PDSH_SSH_ARGS_APPEND": shlex.join(group.ssh_options()[2:])}
    window = ["-f", str(fanout)] if fanout else []
    return ["pdsh", "-R", "ssh", *window, "-w", ",".join(f"root@{h.address}" for h in group), command], env


def mpirun_argv(group: HostGroup, per_host: int, program: list[str]) -> list[str]:
    """Open MPI's ``mpirun`` of ``per_host`` ranks of ``program`` on every host of ``group``."""
    hosts = ",".join(f"{h.address}:{per_host}" for h in group)
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        str(per_host * len(group)),
        "--host",
        hosts,
        "--mca",
        "plm_rsh_args",
        shlex.join(group.ssh_options()),
        "--mca",
        "oob_tcp_if_include",
        "10.231.0.0/24",
        "--mca",
        "btl_tcp_if_include",
        "10.231.0.0/24",
        *program,
    ]


class Launcher:
    """One ``launchkit launch``: its UP lines as they come, its peak threads, how it ended."""

    def __init__(
        self, group: HostGroup, hostfile: Path, home: str, procs: int, code: str | None = None
    ) -> None:
        argv = launch_argv(group, hostfile, procs, [UP])
        self.env = {**os.environ, "LAUNCHKIT_HOME": home}
        if code:  # another copy of launchkit's source (--compare), for it and its kill
            self.env["PYTHONPATH"] = code
        self.procs, self.ups, self.threads = procs, [], 0
        self.all_up = threading.Event()
        self.t0 = time.time()
        self.proc = subprocess.Popen(
            argv,
            cwd="/",
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr or []), daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()
        self.job = ""

    def _read(self) -> None:
        for line in self.proc.stdout or []:
            if line.startswith("[worker") and " UP " in line:
                self.ups.append(float(line.split()[3]))
                if len(self.ups) == self.procs:
                    self.all_up.set()

    def _sample(self) -> None:  # (never poll(): ``end`` reaps it with its rusage)
        while True:
            try:
                status = Path(f"/proc/{self.proc.pid}/status").read_text()
            except OSError:
                return
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("State", "").strip().startswith("Z"):
                return
            self.threads = max(self.threads, int(fields.get("Threads", "0")))
            time.sleep(0.05)

    def wait_up(self, timeout: float) -> float:
        if not self.all_up.wait(timeout):
            self.proc.kill()
            raise RuntimeError(f"{len(self.ups)} of {self.procs} up; stderr: {''.join(self.err)[-2000:]}")
        return max(self.ups) - self.t0

    def job_id(self, home: str) -> str:
        ids = sorted(p.stem for p in (Path(home) / "jobs").glob("*.json"))
        return ids[-1]

    def ended(self) -> tuple[float, float] | None:
        """The launcher's (peak RSS MiB, CPU seconds) once it has exited (reaped here), else None."""
        pid, _, usage = os.wait4(self.proc.pid, os.WNOHANG)
        if pid == 0:
            return None
        self.proc.returncode = 0
        return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def until_gone(job: str, launcher: Launcher, t0: float, timeout: float = 120) -> tuple[float, float, float]:
    """Seconds from ``t0`` until the launcher exited and no process of ``job`` is left on any host
    (every PID namespace is seen from here); the launcher's peak RSS and CPU seconds."""
    deadline = time.time() + timeout
    usage = None
    while time.time() < deadline:
        usage = usage or launcher.ended()
        if usage is not None and not pids_with_job(job):
            return time.time() - t0, *usage
        time.sleep(0.02)
    raise RuntimeError(
        f"job {job}: launcher gone: {usage is not None}, {len(pids_with_job(job))} processes left"
    )


def quiet(most: float = 30.0, busy: float = 0.2, every: float = 0.5) -> None:
    """Wait (``most`` s at most) until the machine is quiet: under ``busy`` of one core for
    ``every`` s. What the column before left running (a job's end on 128 hosts, their sshds'
    sessions closing) then does not count in the next one's time."""
    deadline = time.time() + most
    while time.time() < deadline:
        before = machine_busy()
        time.sleep(every)
        if machine_busy() - before < busy * every:
            return


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def launchkit_round(
    group: HostGroup, hostfile: Path, home: str, procs: int, idle: float, code: str | None = None
) -> dict[str, float]:
    out: dict[str, float] = {}
    quiet()
    lk = Launcher(group, hostfile, home, procs, code)
    out["launchkit: all running s"] = lk.wait_up(300)
    if idle:  # the launcher's CPU while the job runs (heartbeats, samplers, the live file)
        before = cpu_seconds(lk.proc.pid)
        time.sleep(idle)
        out["launcher CPU s per minute, running"] = (cpu_seconds(lk.proc.pid) - before) * 60 / idle
    out["launchkit: threads (peak)"] = lk.threads
    job = lk.job_id(home)
    t0 = time.time()
    kill = subprocess.Popen(
        [sys.executable, "-m", "launchkit", "kill", job],
        env=lk.env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    gone, rss, cpu = until_gone(job, lk, t0)
    _, err = kill.communicate(timeout=300)
    if kill.returncode != 0:
        raise RuntimeError(f"launchkit kill: {err[-2000:]}")
    out["launchkit kill: nothing left s"] = gone
    out["launchkit kill: the command's own time s"] = time.time() - t0
    out["launcher peak RSS MiB"] = rss
    out["launcher CPU s (start to killed)"] = cpu
    quiet()
    lk = Launcher(group, hostfile, home, procs, code)
    lk.wait_up(300)
    job = lk.job_id(home)
    t0 = time.time()
    os.kill(lk.proc.pid, signal.SIGINT)
    out["Ctrl-C: nothing left s"] = until_gone(job, lk, t0)[0]
    return out


def pdsh_round(group: HostGroup) -> float:
    argv, env = pdsh_argv(group, "true")
    quiet()
    t0 = time.time()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"pdsh: {res.stderr[-2000:]}")
    return time.time() - t0


def up_times(
    argv_list: list[list[str]],
    procs: int,
    stop: Callable[[list[subprocess.Popen[str]]], None],
    env: dict[str, str] | None = None,
) -> float:
    """Start every argv at once; the time to the ``procs``-th UP line of their outputs."""
    ups: list[float] = []
    lock = threading.Lock()
    done = threading.Event()
    quiet()
    t0 = time.time()
    started = [
        subprocess.Popen(
            a,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        for a in argv_list
    ]

    def read(p: subprocess.Popen[str]) -> None:
        for line in p.stdout or []:
            if line.startswith("UP "):
                with lock:
                    ups.append(float(line.split()[1]))
                    if len(ups) == procs:
                        done.set()

    for p in started:
        threading.Thread(target=read, args=(p,), daemon=True).start()
    ok = done.wait(300)
    stop(started)
    for p in started:
        p.wait(60)
    if not ok:
        raise RuntimeError(f"{len(ups)} of {procs} up")
    return max(ups) - t0


def mpirun_round(group: HostGroup, per_host: int) -> float:
    argv = mpirun_argv(group, per_host, ["sh", "-c", UP])

    def stop(ps: list[subprocess.Popen[str]]) -> None:
        for p in ps:
            os.killpg(p.pid, signal.SIGTERM)

    return up_times([argv], per_host * len(group), stop)


def ssh_each_round(group: HostGroup, per_host: int) -> float:
    argvs = [
        ["ssh", *group.ssh_options(), f"root@{h.address}", f"exec sh -c {shlex.quote(UP)}"]
        for h in group
        for _ in range(per_host)
    ]

    def stop(ps: list[subprocess.Popen[str]]) -> None:  # the remote processes end with their ssh session
        for p in ps:
            os.killpg(p.pid, signal.SIGKILL)
        for h in group:
            h.run("pkill -x sleep || true")

    return up_times(argvs, per_host * len(group), stop)


def ensure_pdsh() -> None:
    if shutil.which("pdsh") is None:
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "pdsh"],
            check=True,
            capture_output=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )


def measure(
    n: int, per_host: int, repeat: int, home: str, idle: float, compare: str | None = None
) -> dict[str, Any]:
    t0 = time.time()
    group = HostGroup.create(n)
    row: dict[str, Any] = {"hosts": n, "processes": n * per_host, "hosts up s": time.time() - t0}
    print(f"{n} hosts up in {row['hosts up s']:.1f} s", flush=True)
    rounds: list[dict[str, float]] = []
    try:
        hostfile = group.write_hostfile(Path(home) / f"hosts{n}", slots=per_host)
        pdsh_round(group)  # every host's key recorded (the known_hosts file is shared by every tool)
        for i in range(repeat):
            if compare and i % 2:  # the other launchkit first in every other round
                old = launchkit_round(group, hostfile, home, n * per_host, idle, compare)
            r = launchkit_round(group, hostfile, home, n * per_host, idle)
            if compare and not i % 2:
                old = launchkit_round(group, hostfile, home, n * per_host, idle, compare)
            if compare:
                r.update({f"[{compare}] {k}": v for k, v in old.items()})
            r["pdsh true s"] = pdsh_round(group)
            r["mpirun: all running s"] = mpirun_round(group, per_host)
            r["one ssh per process: all running s"] = ssh_each_round(group, per_host)
            rounds.append(r)
            print(json.dumps({"hosts": n, "round s": time.time() - t0, **r}), flush=True)
    finally:
        group.close()
    for k in rounds[0]:
        row[k] = statistics.median(r[k] for r in rounds)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--idle", type=float, default=0, help="seconds of the launcher's CPU sampled while running"
    )
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument(
        "--compare",
        metavar="DIR",
        help="also launchkit from this copy of its source, alternated with this one",
    )
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ensure_pdsh()
    with tempfile.TemporaryDirectory() as home:
        rows = [measure(n, args.per_host, args.repeat, home, args.idle, args.compare) for n in args.hosts]
    keys = [k for k in rows[0] if k not in ("hosts",)]
    print("| hosts | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for r in rows:
        print(
            f"| {r['hosts']} | "
            + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys)
            + " |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
