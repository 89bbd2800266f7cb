"""Where the time and CPU of a launch over namespace hosts go, phase by phase, beside
pdsh's ``true`` on the same hosts.

    sudo python -m bench.scale_profile [--hosts 32] [--per-host 2] [--profile out.prof]

Runs the ssh backend's own steps in this process (no supervisor, no CLI): connect every host,
start every watchdog, ask each to start its processes, wait for every pid; each phase's wall
time, this process's CPU seconds (``time.process_time``: paramiko's handshakes, the watchdog's
bootstrap, the readers) and the whole machine's busy CPU seconds (``/proc/stat``: the sshds,
the hosts' ``python3`` watchdogs and everything else). pdsh the same way: its wall time, its
own and its ``ssh`` children's CPU (``RUSAGE_CHILDREN``), and the machine's. With ``--profile``
the launcher's phases run under cProfile (slower; for where its CPU goes, not for timing).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import resource
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

from bench.scale import pdsh_argv  # noqa: E402
from bench.scale_trace import machine_busy  # noqa: E402
from tests.cluster.netns import HostGroup  # noqa: E402


def timed(what: str, fn: Callable[[], Any], rows: list[tuple[str, float, float, float]]) -> Any:
    w0, c0, m0 = time.perf_counter(), time.process_time(), machine_busy()
    out = fn()
    rows.append((what, time.perf_counter() - w0, time.process_time() - c0, machine_busy() - m0))
    return out


def pdsh(group: HostGroup, rows: list[tuple[str, float, float, float]]) -> None:
    argv, env = pdsh_argv(group, "true")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0, m0 = time.perf_counter(), machine_busy()
    subprocess.run(argv, env=env, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rows.append(("pdsh true (pdsh + its ssh clients)", time.perf_counter() - w0, cpu, machine_busy() - m0))


def launch(group: HostGroup, per_host: int, rows: list[tuple[str, float, float, float]]) -> None:
    from launchkit.backends.ssh import connection as ssh
    from launchkit.backends.ssh.agent import HostAgent
    from launchkit.backends.ssh.backend import connect_all
    from launchkit.backends.ssh.options import SshOptions
    from launchkit.core.hostfile import parse_host
    from launchkit.core.spec import Task

    opts = SshOptions(identity=str(group.identity), known_hosts=str(group.known_hosts))
    hosts = [parse_host(line) for line in group.hostfile_lines()]
    conns, errors = timed("launchkit: connect every host", lambda: connect_all(hosts, opts), rows)
    if errors:
        raise SystemExit(f"unreachable: {errors}")
    job = f"prof{os.getpid()}"
    agents = [
        HostAgent(h, conns[h], job, hb_interval=1.0, hb_timeout=10.0, grace=1.0, interface=None)
        for h in hosts
    ]
    timed("launchkit: start every watchdog", lambda: ssh.on_each(lambda a: a.start(10.0), agents), rows)
    procs = []

    def spawn() -> None:
        for i in range(per_host * len(hosts)):
            a = agents[i % len(agents)]
            task = Task("worker", i, i, a.host, 0, ("sleep", "600"), {"LAUNCHKIT_JOB_ID": job}, "/")
            procs.append(a.spawn(i, task, wait=False))
        for p in procs:
            p.started.wait(30)

    timed("launchkit: every process started (pid back)", spawn, rows)
    rows.append(("launchkit: threads now", float(threading.active_count()), 0.0, 0.0))
    timed(
        "launchkit: close (every watchdog ends its processes)",
        lambda: ssh.on_each(lambda a: a.close(5.0), agents),
        rows,
    )


def traced_launch(group: HostGroup, per_host: int, home: str, start_profile: str | None = None) -> None:
    """One ``launchkit launch`` under ``bench.scale_trace``: its steps' timeline, then the last UP."""
    hostfile = group.write_hostfile(Path(home) / "hosts", slots=per_host)
    procs = per_host * len(group)
    t0 = time.time()
    argv = [
        sys.executable,
        "-m",
        "bench.scale_trace",
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
        'echo "UP $(date +%s.%N)"; exec sleep 600',
    ]
    env = {**os.environ, "LAUNCHKIT_HOME": home, "LK_TRACE_T0": repr(t0), "PYTHONPATH": str(ROOT)}
    if start_profile:  # the supervisor's start of the processes under cProfile (bench.scale_trace)
        env["LK_TRACE_PROFILE"] = str(Path(start_profile).resolve())
    lk = subprocess.Popen(
        argv,
        cwd="/",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    ups: list[float] = []
    trace: list[str] = []
    threading.Thread(target=lambda: trace.extend(lk.stderr or []), daemon=True).start()
    for line in lk.stdout or []:
        if " UP " in line:
            ups.append(float(line.split()[3]) - t0)
            if len(ups) == procs:
                break
    time.sleep(0.5)
    lk.send_signal(2)
    lk.wait(60)
    if not ups:
        print("".join(trace)[-3000:])
        return
    print(f"first UP {min(ups):.2f} s, last UP {max(ups):.2f} s ({len(ups)} of {procs})")
    base = None
    for line in trace:
        if line.startswith("TRACE"):
            _, name, start, end, cpu, busy = line.split()
            base = float(busy) if base is None else base
            print(
                f"  {name:32} {float(start):7.2f} -> {float(end):7.2f} s   cpu {float(cpu):.2f} s"
                f"   machine cpu {float(busy) - base:.2f} s"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--profile", help="write the launcher phases' cProfile here")
    ap.add_argument("--full", action="store_true", help="also a whole launch's timeline (bench.scale_trace)")
    ap.add_argument(
        "--start-profile", help="with --full: the supervisor's start of the processes' cProfile here"
    )
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    group = HostGroup.create(args.hosts)
    try:
        with tempfile.TemporaryDirectory() as home:
            argv, env = pdsh_argv(group, "true")
            subprocess.run(argv, env=env, capture_output=True, check=False)  # every host key recorded
            for _ in range(args.rounds):
                rows: list[tuple[str, float, float, float]] = []
                pdsh(group, rows)
                if args.profile:
                    prof = cProfile.Profile()
                    prof.runcall(launch, group, args.per_host, rows)
                    prof.dump_stats(args.profile)
                else:
                    launch(group, args.per_host, rows)
                print(
                    f"| {args.hosts} hosts, {args.per_host} a host | wall s | this process CPU s | machine CPU s |"
                )
                print("|---|---|---|---|")
                for what, wall, cpu, busy in rows:
                    print(f"| {what} | {wall:.2f} | {cpu:.2f} | {busy:.2f} |")
                if args.full:
                    traced_launch(group, args.per_host, home, args.start_profile)
    finally:
        group.close()


if __name__ == "__main__":
    main()
