"""The ssh cases of bench/reliability.py, on three network-namespace hosts (root; tests/cluster/netns.py):
a host whose link goes down mid-training, a host unreachable at launch, the launcher SIGKILLed
during --sync-dst-dir's rsync. launchkit runs tests/faults/trainprog.py with the hosts' numpy +
pyzmq venv; MXNet's launch.py runs the same MXNet program as the local cases, with MXNet's venv
(both venvs live in /var/tmp, which the hosts share).

launch.py's ssh launcher runs ``ssh -o StrictHostKeyChecking=no HOST -p PORT '...'`` and ``rsync
--rsh="ssh ..."``: an ``ssh`` first on its PATH adds the test cluster's key and known-hosts file.
Its tracker publishes ``gethostbyname(getfqdn())``, which the namespace hosts cannot reach: the
address they reach this machine by (10.231.0.1) is put in its place before launch.py runs unchanged.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.reliability_kit import REPO, TRAINPROG, Outcome, Run, Side, end_all, finish, tagged
from tests.cluster.netns import HostGroup

HOST_TC_PYTHON = "/var/tmp/launchkit-test-venv-tc/bin/python"
COUNT_JOB_SH = (
    "for e in /proc/[0-9]*/environ; do tr '\\0' '\\n' <$e 2>/dev/null | grep -q '^DMLC_ROLE=' && echo x; done"
)


def on_hosts(group: HostGroup) -> int:
    """Processes of a job (any with DMLC_ROLE in its environment) and rsyncs left on the hosts."""
    n = 0
    for h in group:
        n += len(h.run(COUNT_JOB_SH).stdout.split())
        n += len(h.run("pgrep -x rsync || true").stdout.split())
    return n


def rsyncs_of(run: Run) -> list[int]:
    """This run's rsync processes here (they carry its token, as every process it starts)."""
    found = []
    for pid in tagged(run.tag):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "rsync":
                found.append(pid)
        except OSError:
            continue
    return found


class SshSide:
    """One launcher's ssh job on ``group``: the working directory it syncs, its argv and environment."""

    def __init__(self, side: Side, group: HostGroup, workdir: Path) -> None:
        self.side, self.group = side, group
        self.dir = workdir / f"job-{side.name}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.hostfile = workdir / f"hosts-{side.name}"
        if side.name == "launchkit":
            for pkg in ("trainer_core", "dmlc_env"):
                shutil.copytree(REPO / pkg, self.dir / pkg, ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(TRAINPROG, self.dir / TRAINPROG.name)
            group.write_hostfile(self.hostfile)
            self.env = side.env
        else:
            (self.dir / "mxprog.py").write_text((Path(side.workdir) / "mxprog.py").read_text())
            self.hostfile.write_text("".join(f"{h.address}\n" for h in group))
            bindir = workdir / "bin"
            bindir.mkdir(exist_ok=True)
            opts = " ".join(group.ssh_options())
            (bindir / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh {opts} -l root "$@"\n')
            (bindir / "ssh").chmod(0o755)
            self.env = {**side.env, "PATH": f"{bindir}:{os.environ['PATH']}"}
            self.env.pop("DMLC_INTERFACE", None)

    def start(self, extra: list[str] | None = None) -> Run:
        extra = extra or []
        if self.side.name == "launchkit":
            flags = [
                "--launcher",
                "ssh",
                "-H",
                str(self.hostfile),
                "-i",
                str(self.group.identity),
                "--known-hosts",
                str(self.group.known_hosts),
                "--sync-dst-dir",
                "/srv/lkjob",
                "--heartbeat-timeout",
                "2",
                "--connect-timeout",
                "2",
                *extra,
            ]
            argv = self.side.argv(flags)  # the last --launcher counts
            i = argv.index(str(TRAINPROG))  # the hosts' python runs the synced copy
            argv[i - 1 : i + 1] = [HOST_TC_PYTHON, TRAINPROG.name]
        else:
            args = [
                self.side.launch_py,
                "-n",
                "2",
                "-s",
                "1",
                "-H",
                str(self.hostfile),
                "--launcher",
                "ssh",
                "--sync-dst-dir",
                "/srv/mxjob",
                self.side.mx_py,
                "mxprog.py",
                "400",
            ]
            run = (
                "import runpy, sys, threading; threading.Thread.isAlive = threading.Thread.is_alive; "
                "import dmlc_tracker.tracker as t; t.get_host_ip = lambda host_ip=None: '10.231.0.1'; "
                f"sys.argv = {args!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
            )
            argv = [self.side.mx_py, "-c", run]
        return Run(argv, self.env, str(self.dir))


def settle(
    run: Run, group: HostGroup, since: float, cap: float, message: Callable[[list[str]], str]
) -> Outcome:
    """reliability_kit.finish, counting what is left on the hosts too."""
    return finish(run, since, cap, message, elsewhere=lambda: on_hosts(group))


def link_down(s: SshSide, cap: float) -> Outcome:
    run = s.start()
    if not run.wait_for(lambda: run.saw("step 3"), 90):
        raise SystemExit(f"{s.side.name}: no step 3 over ssh:\n" + "".join(run.lines[-30:]))
    subprocess.run(["ip", "link", "set", s.group[2].veth, "down"], check=True)
    since = time.monotonic()
    out = settle(run, s.group, since, cap, s.side.message)
    subprocess.run(["ip", "link", "set", s.group[2].veth, "up"], check=True)
    return out


def unreachable(s: SshSide, cap: float) -> Outcome:
    subprocess.run(["ip", "link", "set", s.group[1].veth, "down"], check=True)
    try:
        run = s.start()
        return settle(run, s.group, time.monotonic(), cap, s.side.message)
    finally:
        subprocess.run(["ip", "link", "set", s.group[1].veth, "up"], check=True)


def sigkill_during_rsync(s: SshSide, cap: float) -> Outcome:
    for h in s.group:
        subprocess.run(
            [
                "tc",
                "qdisc",
                "replace",
                "dev",
                h.veth,
                "root",
                "tbf",
                "rate",
                "8mbit",
                "burst",
                "32kb",
                "latency",
                "400ms",
            ],
            check=True,
        )
    (s.dir / "data.bin").write_bytes(os.urandom(6 << 20))
    try:
        run = s.start()
        if not run.wait_for(lambda: len(rsyncs_of(run)) >= len(s.group), 30):
            raise SystemExit(f"{s.side.name}: no rsync seen:\n" + "".join(run.lines[-30:]))
        time.sleep(0.5)
        os.kill(run.proc.pid, signal.SIGKILL)
        since = time.monotonic()
        run.proc.wait()
        left, gone = None, None
        while time.monotonic() - since < cap:
            alive = len(tagged(run.tag)) + on_hosts(s.group)
            if left is None and time.monotonic() - since >= 2.0:
                left = alive
            if not alive:
                gone = time.monotonic() - since
                break
            time.sleep(0.2)
        end_all(run.tag)
        return Outcome(
            -9,
            gone if gone is not None else cap,
            "nothing printed: the launcher is gone",
            left or 0,
            0,
            gone=gone is not None,
        )
    finally:
        (s.dir / "data.bin").unlink()
        for h in s.group:
            subprocess.run(["tc", "qdisc", "del", "dev", h.veth, "root"], check=False)


CASES: dict[str, tuple[str, Callable[[SshSide, float], Outcome]]] = {
    "ssh-link-down-mid": ("ssh: a host's link goes down mid-training", link_down),
    "ssh-host-unreachable": ("ssh: a host unreachable at launch", unreachable),
    "ssh-sigkill-during-rsync": ("ssh: SIGKILL of the launcher during --sync-dst-dir", sigkill_during_rsync),
}


def run_case(name: str, side: Side, workdir: Path, cap: float) -> Outcome:
    """One case on a fresh cluster of three namespace hosts (torn down after)."""
    group = HostGroup.create(3)
    try:
        return CASES[name][1](SshSide(side, group, workdir), cap)
    finally:
        group.close()
