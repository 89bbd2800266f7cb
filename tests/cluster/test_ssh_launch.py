"""The ssh backend on real sshd servers: one on loopback, and hosts in network namespaces, each
with its own address, hostname, process table and /srv, /root, /tmp, /dev/shm."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.launchkit.procs import PROG, parse_prefixed, record, run, start, wait_for_job, wait_until

PROG_NAME = Path(PROG).name
SYNC_DIR = "/srv/lkjob"
HOSTILE = "a b $(touch /tmp/pwned) `id` ;rm -rf /nope 'q' \"dq\" x=y:z $HOME"


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    """A working directory holding the test program; launches sync it to SYNC_DIR."""
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(PROG, d / PROG_NAME)
    return d


def ssh_flags(group) -> list[str]:
    return ["-i", str(group.identity), "--known-hosts", str(group.known_hosts)]


def launch_args(group, hostfile: Path, *rest: str) -> list[str]:
    return ["launch", "-H", str(hostfile), *ssh_flags(group), "--sync-dst-dir", SYNC_DIR, *rest]


def job_pids_on(group, job: str) -> dict[str, list[int]]:
    return {h.name: h.pids_with_env(f"LAUNCHKIT_JOB_ID={job}") for h in group}


def test_three_hosts_each_process_reports_its_host_and_contract(netns_hosts, jobdir: Path) -> None:
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    res = run(
        launch_args(group, hostfile, "-n", "3", "-s", "3", "python3", PROG_NAME, "env"),
        cwd=jobdir,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    assert len(envs) == 7
    addresses = [h.address for h in group]
    for (role, rank), e in envs.items():
        if role == "scheduler":
            assert e["cwd"] == str(jobdir)
            continue
        i = rank if role == "server" else 3 + rank  # MXNet's placement: process i on hosts[i % 3]
        host = group[i % 3]
        assert e["DMLC_NODE_HOST"] == host.address  # resolved on the host, not the hostfile's alias
        assert e["cwd"] == SYNC_DIR
        assert e["DMLC_JOB_CLUSTER"] == "ssh"
        assert e["DMLC_ROLE"] == role and e["LAUNCHKIT_ROLE_RANK"] == str(rank)
        assert e["DMLC_PS_ROOT_URI"] == group.bridge_address  # the address the hosts were reached through
        assert e["stdin_is_devnull"] == "True"
    assert {e["DMLC_NODE_HOST"] for k, e in envs.items() if k[0] != "scheduler"} == set(addresses)
    assert len({e["LAUNCHKIT_JOB_SECRET"] for e in envs.values()}) == 1
    # each host really is a separate machine: hostname from inside
    hostnames = {h.ssh("hostname").stdout.strip() for h in group}
    assert hostnames == {"node1", "node2", "node3"}


def test_hostile_values_arrive_literally(netns_hosts, jobdir: Path) -> None:
    group = netns_hosts(2)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    args = launch_args(
        group,
        hostfile,
        "-n",
        "2",
        "-s",
        "0",
        "--env",
        f"X_HOSTILE:{HOSTILE}",
        "python3",
        PROG_NAME,
        "argv",
        HOSTILE,
        "$(id)",
        ";",
        "'",
    )
    res = run(args, cwd=jobdir, timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        line = next(line for line in res.stdout.splitlines() if line.startswith(f"[worker {rank}] ["))
        assert json.loads(line.split("] ", 1)[1]) == [HOSTILE, "$(id)", ";", "'"]
    res = run(
        launch_args(
            group,
            hostfile,
            "-n",
            "2",
            "-s",
            "0",
            "--env",
            f"X_HOSTILE:{HOSTILE}",
            "python3",
            PROG_NAME,
            "env",
        ),
        cwd=jobdir,
        timeout=60,
    )
    assert all(e["X_HOSTILE"] == HOSTILE for e in parse_prefixed(res.stdout).values())
    for h in group:
        assert h.run("ls /tmp").stdout.count("pwned") == 0


def test_sync_with_progress_and_excludes(netns_hosts, jobdir: Path) -> None:
    group = netns_hosts(2)
    (jobdir / "data").mkdir()
    (jobdir / "data" / "train.bin").write_bytes(b"x" * 200_000)
    (jobdir / "model.ckpt").write_text("big checkpoint")
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    res = run(
        launch_args(
            group,
            hostfile,
            "-n",
            "2",
            "-s",
            "0",
            "--sync-exclude",
            "*.ckpt",
            "python3",
            PROG_NAME,
            "argv",
            "ok",
        ),
        cwd=jobdir,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "sync" in res.stderr and "100%" in res.stderr
    for h in group:
        listing = h.run(f"find {SYNC_DIR} -type f").stdout.split()
        assert sorted(listing) == sorted([f"{SYNC_DIR}/{PROG_NAME}", f"{SYNC_DIR}/data/train.bin"])
    assert not Path(SYNC_DIR).exists()  # /srv is private to each host


@pytest.mark.parametrize(("dst", "where"), [("~/lkjob", "/root/lkjob"), ("lkjob2/", "/root/lkjob2")])
def test_a_destination_in_the_home_is_where_the_processes_start(
    netns_hosts, jobdir: Path, dst: str, where: str
) -> None:
    """``--sync-dst-dir '~/lkjob'`` (quoted, so no local shell expanded it): rsync wrote into the
    remote home's lkjob and the processes started in a literal ``~/lkjob`` (exit 127); now they
    start where rsync wrote, as for a relative destination (the login directory's)."""
    group = netns_hosts(2)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    args = ["launch", "-H", str(hostfile), *ssh_flags(group), "--sync-dst-dir", dst]
    res = run([*args, "-n", "2", "-s", "0", "python3", PROG_NAME, "env"], cwd=jobdir, timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    assert {e["cwd"] for e in envs.values()} == {where} and len(envs) == 2
    for h in group:
        assert h.run(f"ls {where}").stdout.split() == [PROG_NAME]  # each host's private /root


def test_sync_failure_is_fatal_and_per_host(netns_hosts, jobdir: Path) -> None:
    group = netns_hosts(2)
    group[1].run("mkdir -p /srv/ro && mount -t tmpfs -o ro tmpfs /srv/ro")
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    args = [
        "launch",
        "-H",
        str(hostfile),
        *ssh_flags(group),
        "--sync-dst-dir",
        "/srv/ro/job",
        "-n",
        "2",
        "-s",
        "0",
        "python3",
        PROG_NAME,
        "wait",
    ]
    res = run(args, cwd=jobdir, timeout=60)
    assert res.returncode == 1
    assert "sync to 1 of 2 host(s) failed, nothing started" in " ".join(res.stderr.split())
    assert group[1].address in res.stderr
    assert "[worker" not in res.stdout


def test_failing_remote_worker_ends_the_job_everywhere(netns_hosts, jobdir: Path, launchkit_home) -> None:
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    t0 = time.monotonic()
    res = run(
        launch_args(
            group,
            hostfile,
            "-n",
            "3",
            "-s",
            "3",
            "--grace-period",
            "2",
            "python3",
            PROG_NAME,
            "fail",
            "worker",
            "1",
            "4",
        ),
        cwd=jobdir,
        timeout=60,
    )
    assert res.returncode == 4, res.stderr[-3000:]
    assert time.monotonic() - t0 < 20
    assert f"worker 1 on {group[1].hostfile_line()} exited with code 4" in res.stderr
    job = wait_for_job(launchkit_home)
    assert wait_until(lambda: all(not p for p in job_pids_on(group, job).values()), 5), job_pids_on(
        group, job
    )


def test_sigkill_of_launcher_leaves_nothing_on_any_host(netns_hosts, jobdir: Path, launchkit_home) -> None:
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    proc = start(
        launch_args(group, hostfile, "-n", "3", "-s", "3", "python3", PROG_NAME, "grandchild"), cwd=jobdir
    )
    try:
        job = wait_for_job(launchkit_home, timeout=30)
        # every host runs a server and a worker, each with a setsid grandchild
        assert wait_until(lambda: all(len(p) >= 4 for p in job_pids_on(group, job).values()), 15), (
            job_pids_on(group, job)
        )
        proc.kill()
        proc.wait(timeout=5)
        assert wait_until(lambda: all(not p for p in job_pids_on(group, job).values()), 8), job_pids_on(
            group, job
        )
    finally:
        proc.kill()
        proc.communicate()


def test_kill_across_hosts(netns_hosts, jobdir: Path, launchkit_home) -> None:
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    proc = start(
        launch_args(group, hostfile, "-n", "3", "-s", "0", "python3", PROG_NAME, "grandchild"), cwd=jobdir
    )
    try:
        job = wait_for_job(launchkit_home, timeout=30)
        assert wait_until(lambda: all(len(p) >= 2 for p in job_pids_on(group, job).values()), 15)
        res = run(["kill", job])
        assert res.returncode == 0, res.stderr
        for h in group:
            assert f"{h.hostfile_line()}: ended" in res.stdout
        assert all(not p for p in job_pids_on(group, job).values())
        assert proc.wait(timeout=15) == 143
        assert record(launchkit_home, job)["state"] == "killed"
    finally:
        proc.kill()
        proc.communicate()


def test_kill_sweeps_only_the_hosts_that_ran_the_job(netns_hosts, jobdir: Path, launchkit_home) -> None:
    """The record names every host of the hostfile; the sweep after the launcher ended the job
    goes only to those that ran a process of it: a host without one that went away since is not
    contacted (it was, and made kill fail as unreachable), and the others report as before."""
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts", slots=1)
    proc = start(
        launch_args(group, hostfile, "-n", "2", "-s", "0", "python3", PROG_NAME, "grandchild"), cwd=jobdir
    )
    try:
        job = wait_for_job(launchkit_home, timeout=30)
        assert wait_until(lambda: sum(1 for p in job_pids_on(group, job).values() if len(p) >= 2) == 2, 15)
        idle = next(h for h in group if not job_pids_on(group, job).get(h.name))
        ran = [h for h in group if h is not idle]
        idle.stop()  # the host without a process of the job goes away
        res = run(["kill", job])
        assert res.returncode == 0, res.stderr
        for h in ran:
            assert f"{h.hostfile_line()}: ended" in res.stdout
        assert idle.hostfile_line() not in res.stdout + res.stderr
        assert all(not h.pids_with_env(f"LAUNCHKIT_JOB_ID={job}") for h in ran)
        assert proc.wait(timeout=15) == 143
    finally:
        proc.kill()
        proc.communicate()


def test_kill_all_on_hosts_with_launcher_gone(netns_hosts, jobdir: Path, launchkit_home) -> None:
    group = netns_hosts(2)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    # a stray on node2 that carries some job id but has no launcher at all, and whose home (on this
    # machine) records nothing of it (issue 40: one that names no home is left)
    stray = f"LAUNCHKIT_JOB_ID=orphan-1 LAUNCHKIT_JOB_HOME={socket.gethostname()}:/nonexistent-home"
    group[1].run(f"{stray} setsid sleep 60 </dev/null >/dev/null 2>&1 &")
    assert wait_until(lambda: bool(group[1].pids_with_env("LAUNCHKIT_JOB_ID=orphan-1")), 5)
    res = run(["kill", "--all", "-H", str(hostfile), *ssh_flags(group)])
    assert res.returncode == 0, res.stderr
    assert f"{group[1].hostfile_line()}: ended 1 process(es)" in res.stdout
    assert not group[1].pids_with_env("LAUNCHKIT_JOB_ID=orphan-1")
    # a host that cannot be reached is reported, and the exit code says so
    group[0].stop()
    res = run(["kill", "--all", "-H", str(hostfile), *ssh_flags(group)])
    assert res.returncode == 1
    assert f"{group[0].hostfile_line()}: unreachable" in " ".join(res.stderr.split())
    assert f"{group[1].hostfile_line()}: ended 0 process(es)" in res.stdout


def test_link_cut_ends_that_hosts_processes(netns_hosts, jobdir: Path, launchkit_home) -> None:
    group = netns_hosts(3)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    proc = start(
        launch_args(
            group,
            hostfile,
            "-n",
            "3",
            "-s",
            "0",
            "--heartbeat-timeout",
            "2",
            "python3",
            PROG_NAME,
            "grandchild",
        ),
        cwd=jobdir,
    )
    try:
        job = wait_for_job(launchkit_home, timeout=30)
        assert wait_until(lambda: all(len(p) >= 2 for p in job_pids_on(group, job).values()), 15)
        cut = group[1]
        subprocess.run(["ip", "link", "set", cut.veth, "down"], check=True)
        t0 = time.monotonic()
        assert wait_until(lambda: not cut.pids_with_env(f"LAUNCHKIT_JOB_ID={job}"), 8), (
            "cut host kept running"
        )
        assert time.monotonic() - t0 < 8
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 255, err[-3000:]
        assert f"host {cut.hostfile_line()} stopped answering" in err
        assert all(not p for p in job_pids_on(group, job).values())
    finally:
        proc.kill()
        proc.communicate()


def test_unreachable_host_fails_fast_and_starts_nothing(netns_hosts, jobdir: Path, launchkit_home) -> None:
    group = netns_hosts(3)
    group[2].stop()
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    res = run(
        launch_args(
            group, hostfile, "--connect-timeout", "2", "-n", "3", "-s", "0", "python3", PROG_NAME, "wait"
        ),
        cwd=jobdir,
        timeout=30,
    )
    assert res.returncode == 1
    assert "1 of 3 host(s) unreachable, nothing started" in " ".join(res.stderr.split())
    assert group[2].address in res.stderr
    assert not (launchkit_home / "jobs").exists() or not list((launchkit_home / "jobs").glob("*.json"))


def test_hosts_check_with_one_host_down(netns_hosts, tmp_path: Path) -> None:
    group = netns_hosts(3)
    group[1].stop()
    # node1 gets Debian's /etc/hosts line for its own name (in its own mount namespace); the
    # namespace hosts otherwise share this machine's /etc/hosts, where their names do not resolve
    group[0].run(
        "printf '127.0.0.1 localhost\\n127.0.1.1 node1\\n' > /tmp/etc-hosts && mount --bind /tmp/etc-hosts /etc/hosts",
        check=True,
    )
    hostfile = group.write_hostfile(tmp_path / "hosts")
    res = run(["hosts", "check", "-H", str(hostfile), *ssh_flags(group), "--connect-timeout", "2", "--json"])
    assert res.returncode == 1
    rows = {r["host"]: r for r in json.loads(res.stdout)}
    assert (
        rows[group[0].hostfile_line()]["reachable"] and rows[group[0].hostfile_line()]["hostname"] == "node1"
    )
    assert rows[group[2].hostfile_line()]["cpus"] >= 1 and rows[group[2].hostfile_line()]["mem_bytes"] > 0
    assert not rows[group[1].hostfile_line()]["reachable"] and rows[group[1].hostfile_line()]["error"]
    table = run(["hosts", "check", "-H", str(hostfile), *ssh_flags(group), "--connect-timeout", "2"])
    assert "2 of 3 host(s) reachable" in table.stdout and "unreachable" in table.stdout
    # node1's name resolves to 127.0.1.1 there: flagged; node3's does not resolve: not (issue 40)
    said = " ".join(table.stderr.split())
    assert f"{group[0].hostfile_line()}: its host name node1 resolves to 127.0.1.1 there" in said, said
    assert "node3" not in said, said
    assert rows[group[0].hostfile_line()]["name_address"] == "127.0.1.1"
    assert rows[group[2].hostfile_line()]["name_address"] is None


def test_loopback_sshd_launch_and_strict_host_keys(sshd_loopback, tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(sshd_loopback.hostfile_line() + "\n")
    known = tmp_path / "known_hosts"
    base = [
        "launch",
        "-H",
        str(hostfile),
        "-i",
        str(sshd_loopback.identity),
        "--known-hosts",
        str(known),
        "-n",
        "1",
        "-s",
        "1",
    ]
    res = run([*base, "--strict-host-keys", "hostname"], cwd="/")
    assert res.returncode == 1 and "not found in known_hosts" in res.stderr.replace(
        "known hosts", "known_hosts"
    )
    res = run([*base, "hostname"], cwd="/")
    assert res.returncode == 0, res.stderr
    assert known.read_text().count("ssh-ed25519") == 1  # accept-new recorded the key once
    res = run([*base, "--strict-host-keys", "hostname"], cwd="/")
    assert res.returncode == 0, res.stderr
    # a changed key (another valid key for the same host) is refused
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    name = known.read_text().split()[0]
    other = (tmp_path / "other.pub").read_text().split()
    known.write_text(f"{name} {other[0]} {other[1]}\n")
    res = run([*base, "hostname"], cwd="/")
    assert res.returncode == 1 and "host key does not match" in res.stderr


def test_interface_is_resolved_on_each_host(netns_hosts, jobdir: Path) -> None:
    group = netns_hosts(2)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    # the namespace hosts' interface is eth0; this machine's side is a bridge, so the scheduler's
    # address is given explicitly
    res = run(
        launch_args(
            group,
            hostfile,
            "--interface",
            "eth0",
            "--scheduler-ip",
            group.bridge_address,
            "-n",
            "2",
            "-s",
            "0",
            "python3",
            PROG_NAME,
            "env",
        ),
        cwd=jobdir,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    envs = parse_prefixed(res.stdout)
    for rank in (0, 1):
        assert envs[("worker", rank)]["DMLC_INTERFACE"] == "eth0"
        assert envs[("worker", rank)]["DMLC_NODE_HOST"] == group[rank].address
        # without servers no scheduler process: --scheduler-ip names worker 0's rendezvous address
        assert envs[("worker", rank)]["DMLC_PS_ROOT_URI"] == group.bridge_address
    assert ("scheduler", 0) not in envs


def test_secret_never_on_a_command_line(netns_hosts, jobdir: Path, launchkit_home) -> None:
    group = netns_hosts(2)
    hostfile = group.write_hostfile(jobdir.parent / "hosts")
    proc = start(launch_args(group, hostfile, "-n", "2", "-s", "1", "python3", PROG_NAME, "wait"), cwd=jobdir)
    try:
        job = wait_for_job(launchkit_home, timeout=30)
        assert wait_until(lambda: all(len(p) >= 1 for p in job_pids_on(group, job).values()), 15)

        def scheduler_entry() -> dict | None:
            # the record lists each process once it is started: wait for the scheduler's entry
            return next(
                (p for p in record(launchkit_home, job)["processes"] if p["role"] == "scheduler"), None
            )

        assert wait_until(lambda: scheduler_entry() is not None, 15), record(launchkit_home, job)
        scheduler = scheduler_entry()
        assert scheduler is not None
        env = Path(f"/proc/{scheduler['pid']}/environ").read_bytes().split(b"\0")
        secret = next(e for e in env if e.startswith(b"LAUNCHKIT_JOB_SECRET=")).split(b"=", 1)[1].decode()
        assert len(secret) == 64
        for h in group:
            cmdlines = h.run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").stdout
            assert "jobprog" in cmdlines and secret not in cmdlines
        assert secret not in Path(f"/proc/{proc.pid}/cmdline").read_text()
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def test_ssh_config_alias_and_default_cwd(sshd_loopback, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host trainer-box\n  HostName 127.0.0.1\n  Port {sshd_loopback.port}\n  User root\n"
        f"  IdentityFile {sshd_loopback.identity}\n"
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text("trainer-box\n")
    env = {**os.environ, "HOME": str(home)}
    res = run(
        [
            "launch",
            "-H",
            str(hostfile),
            "-n",
            "1",
            "-s",
            "0",
            "python3",
            "-c",
            "import os; print(os.getcwd())",
        ],
        cwd="/usr",
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "[worker 0] /usr" in res.stdout  # without --sync-dst-dir: the launcher's own path
    assert f"[127.0.0.1]:{sshd_loopback.port} ssh-ed25519" in (home / ".ssh" / "known_hosts").read_text()


def test_ssh_agent_is_used(sshd_loopback, tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        assert wait_until(sock.exists, 5)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock), "HOME": str(tmp_path)}
        subprocess.run(["ssh-add", str(sshd_loopback.identity)], env=env, check=True, capture_output=True)
        hostfile = tmp_path / "hosts"
        hostfile.write_text(sshd_loopback.hostfile_line() + "\n")
        res = run(["launch", "-H", str(hostfile), "-n", "1", "-s", "0", "true"], cwd="/", env=env)
        assert res.returncode == 0, res.stderr
        env.pop("SSH_AUTH_SOCK")
        res = run(["launch", "-H", str(hostfile), "-n", "1", "-s", "0", "true"], cwd="/", env=env)
        assert res.returncode == 1 and "unreachable" in res.stderr  # no key without the agent
    finally:
        agent.terminate()
        agent.wait(timeout=5)


# worker 0's port probe runs first with or without servers (torch's MASTER_PORT is asked of worker
# 0's host in every job); the watchdog's own message is tests/launchkit/test_ssh_start.py's
@pytest.mark.parametrize("servers", ["1", "0"])
def test_a_program_that_does_not_answer_within_the_start_timeout_is_named_with_the_wait(
    netns_hosts, tmp_path: Path, servers: str
) -> None:
    """--start-timeout bounds the python3 the launcher runs on a host once its session is open
    (issue 40); one that does not answer in time stops the launch naming the host and the wait.
    Run from / : without --sync-dst-dir the host starts the command in the launcher's directory,
    and the namespace hosts do not see this test's /tmp."""
    group = netns_hosts(1)
    hostfile = group.write_hostfile(tmp_path / "hosts")
    args = ["launch", "-H", str(hostfile), *ssh_flags(group), "--start-timeout", "0.001"]
    res = run([*args, "-n", "1", "-s", servers, "true"], cwd="/", timeout=60)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    said = " ".join(res.stderr.split())
    assert "the port probe (python3 -c) did not answer within 0.001 s (--start-timeout" in said, said
    ok = run([*args[:-1], "30", "-n", "1", "-s", servers, "true"], cwd="/", timeout=60)
    assert ok.returncode == 0, ok.stderr[-3000:]
