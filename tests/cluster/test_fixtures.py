"""Tests of the real-host fixtures themselves: they must give real, separate hosts and clean up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.launchkit.procs import pids_with_env, wait_until

from .netns import STATE_ROOT, HostGroup
from .sshd import ClusterSetupError, LoopbackSshd, port_open
from .subnets import MAX_SUBNETS, ClusterLock, Subnet, sweep_stale

ROOT = Path(__file__).resolve().parents[2]
# What the previous test's fixture teardown should have removed (tag, netns, links).
_LAST_GROUP: dict[str, object] = {}


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


def _pids_with_cmdline(fragment: str) -> list[int]:
    """Processes of the real machine whose command line contains `fragment`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if fragment in cmdline and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"


def _assert_group_gone(tag: str, netns: list[str], links: list[str]) -> None:
    left_netns = set(netns) & set(_netns_list())
    assert not left_netns, f"namespaces left: {left_netns}"
    listing = _link_names()
    left_links = [link for link in links if f" {link}:" in listing or f" {link}@" in listing]
    assert not left_links, f"links left: {left_links}"
    left_pids = _pids_with_cmdline(f"/run/lkcluster/{tag}/")
    assert not left_pids, f"processes left: {[_cmdline(p) for p in left_pids]}"
    assert not (STATE_ROOT / tag).exists()


def _remember(group: HostGroup) -> None:
    _LAST_GROUP.update(
        tag=group.tag, netns=[h.netns for h in group], links=[group.bridge, *(h.veth for h in group)]
    )


def test_loopback_sshd_accepts_the_system_ssh_client(sshd_loopback: LoopbackSshd, tmp_path: Path) -> None:
    s = sshd_loopback
    assert (s.host, s.user) == ("127.0.0.1", "root")
    assert s.hostfile_line() == f"root@127.0.0.1:{s.port}"
    assert "AcceptEnv" not in s.config.read_text()
    proc = subprocess.run(
        ["ssh", *s.ssh_options(), "root@127.0.0.1", "-p", str(s.port), "true"],
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    # accept-new recorded the host key (Debian's ssh_config hashes known_hosts entries)
    found = subprocess.run(
        ["ssh-keygen", "-F", f"[127.0.0.1]:{s.port}", "-f", str(s.known_hosts)], capture_output=True
    )
    assert found.returncode == 0
    # rsync over the same options (the ssh backend's code sync)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hello")
    dst = tmp_path / "dst"
    ssh_cmd = " ".join(["ssh", *s.ssh_options()])
    subprocess.run(
        ["rsync", "-a", "-e", ssh_cmd, f"{tmp_path / 'src'}/", f"root@127.0.0.1:{dst}/"],
        check=True,
        capture_output=True,
        timeout=20,
    )
    assert (dst / "a.txt").read_text() == "hello"


def test_three_netns_hosts_are_separate_hosts(netns_hosts) -> None:
    hosts = netns_hosts(3)
    _remember(hosts)
    assert [h.name for h in hosts] == ["node1", "node2", "node3"]
    net = f"10.231.{Subnet.of_process().index}"  # this worker's subnet (gwN: 10.231.N.0/24)
    assert (hosts.cidr, hosts.bridge_address) == (f"{net}.0/24", f"{net}.1")
    assert [h.address for h in hosts] == [f"{net}.11", f"{net}.12", f"{net}.13"]
    assert hosts.hostfile_lines() == [f"root@{net}.11:22", f"root@{net}.12:22", f"root@{net}.13:22"]
    for h in hosts:
        assert "AcceptEnv" not in (h.dir / "sshd_config").read_text()

    # Each reports its own hostname and address over ssh.
    for h in hosts:
        proc = h.ssh("hostname; ip -4 -o addr show dev eth0")
        assert proc.returncode == 0, proc.stderr
        name, addr_line = proc.stdout.splitlines()
        assert name == h.name
        assert f"inet {h.address}/24" in addr_line
    node1, node2, node3 = hosts

    # Hosts reach each other (ssh from node1 to node2) and the launcher's side of the bridge.
    proc = node1.run(["ssh", *hosts.ssh_options(), f"root@{node2.address}", "hostname"])
    assert (proc.returncode, proc.stdout) == (0, "node2\n"), proc.stderr
    with socket.create_server((hosts.bridge_address, 0)) as server:
        port = server.getsockname()[1]
        proc = node3.run(["bash", "-c", f"echo hello > /dev/tcp/{hosts.bridge_address}/{port}"])
        assert proc.returncode == 0, proc.stderr
        conn, (peer, _) = server.accept()
        with conn:
            assert (peer, conn.recv(16)) == (node3.address, b"hello\n")

    # Private filesystems: /srv (and /tmp) written on node1 is seen neither on node2 nor here.
    marker = f"lk-{uuid.uuid4().hex}"
    assert node1.ssh(f"echo hi > /srv/{marker} && echo hi > /tmp/{marker}").returncode == 0
    assert node1.run(f"cat /srv/{marker}").stdout == "hi\n"
    assert node2.ssh(f"test -e /srv/{marker} || test -e /tmp/{marker}").returncode == 1
    assert node2.run(f"test -e /srv/{marker}").returncode == 1
    assert not Path(f"/srv/{marker}").exists()
    assert not Path(f"/tmp/{marker}").exists()

    # Own process tables: sshd is PID 1, and a process on node1 is visible only there.
    assert node1.run("cat /proc/1/comm").stdout.strip() == "sshd"
    needle = f"LK_FIXTURE_MARK={marker}"
    for h in (node1, node3):
        proc = h.ssh(f"{needle} nohup sleep 60 >/dev/null 2>&1 < /dev/null &")
        assert proc.returncode == 0, proc.stderr
    # (ssh may return before the backgrounded child has exec'd with the variable set, and through
    # nohup before it is `sleep`)

    def started(h) -> bool:
        pids = h.pids_with_env(needle)
        return len(pids) == 1 and h.run(f"cat /proc/{pids[0]}/comm").stdout.strip() == "sleep"

    assert wait_until(lambda: started(node1) and started(node3), 5)
    pids = node1.pids_with_env(needle)
    assert node2.pids_with_env(needle) == []

    # stop() powers a host off: its sshd and every process in it end; the others keep running.
    assert node3.pids_with_env(needle)
    assert len(pids_with_env(needle)) == 2  # the real machine sees both sleeps
    node3.stop()
    assert not node3.alive()
    assert not port_open(node3.address, 22)
    assert node1.pids_with_env(needle) == pids
    assert len(pids_with_env(needle)) == 1  # only node1's is left

    # Cutting the root-side veth makes the host unreachable; setting it up again restores it.
    subprocess.run(["ip", "link", "set", node2.veth, "down"], check=True)
    assert not port_open(node2.address, 22)
    subprocess.run(["ip", "link", "set", node2.veth, "up"], check=True)
    deadline = time.monotonic() + 5
    while not port_open(node2.address, 22) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert port_open(node2.address, 22)


def test_teardown_leaves_nothing_and_twelve_hosts_start(netns_hosts, tmp_path: Path) -> None:
    # The previous test's group was torn down by the fixture.
    if _LAST_GROUP:
        _assert_group_gone(**_LAST_GROUP)  # type: ignore[arg-type]

    hosts = netns_hosts(12)
    hostfile = hosts.write_hostfile(tmp_path / "hosts", slots=2)
    assert hostfile.read_text().splitlines()[-1] == f"root@{hosts.subnet.prefix}.22:22 slots=2"
    # Every host answers over ssh, contacted in parallel.
    procs = [
        subprocess.Popen(
            ["ssh", *hosts.ssh_options(), f"root@{h.address}", "hostname"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for h in hosts
    ]
    answers = [p.communicate(timeout=30) for p in procs]
    assert [out.strip() for out, _ in answers] == [f"node{i}" for i in range(1, 13)], answers

    tag, netns = hosts.tag, [h.netns for h in hosts]
    links = [hosts.bridge, *(h.veth for h in hosts)]
    hosts.close()
    _assert_group_gone(tag, netns, links)


def test_clusters_on_two_subnets_run_side_by_side_and_each_sweeps_only_its_own(netns_hosts) -> None:
    """What lets the xdist workers make namespace hosts at once: each cluster has its subnet, bridge
    and lock; a sweep of one subnet (what creating a cluster does) leaves the other's alone, and
    the hosts of one cannot reach the other's."""
    mine = netns_hosts(1)
    other = HostGroup.create(1, subnet=Subnet(MAX_SUBNETS - 1), lock_timeout=5)  # (no worker's)
    try:
        assert mine.subnet != other.subnet and mine.bridge != other.bridge
        with pytest.raises(ClusterSetupError, match=r"holds the netns cluster on 10\.231\.99\.0/24"):
            HostGroup.create(1, subnet=other.subnet, lock_timeout=0.2)
        assert mine[0].ssh("hostname").stdout == other[0].ssh("hostname").stdout == "node1\n"
        reach = mine[0].run(["bash", "-c", f"echo > /dev/tcp/{other[0].address}/22"], timeout=10)
        assert reach.returncode != 0, reach
        removed = sweep_stale(mine.subnet, keep_tag=mine.tag)  # (the fixture holds mine's lock)
        assert not [r for r in removed if other.tag in r], removed
        assert other[0].alive() and port_open(other[0].address, 22)
        assert other[0].ssh("hostname").returncode == 0
    finally:
        other.close()
    _assert_group_gone(other.tag, [h.netns for h in other], [other.bridge, *(h.veth for h in other)])


@pytest.mark.holds("netns")  # (namespace hosts made by a child process)
def test_a_failing_test_still_tears_down_its_hosts(tmp_path: Path) -> None:
    """Run a failing test in a separate pytest that imports the fixtures (as other test dirs may)."""
    tag_file = tmp_path / "tag"
    (tmp_path / "test_failing.py").write_text(
        "from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401\n"
        "def test_fails(netns_hosts):\n"
        "    hosts = netns_hosts(2)\n"
        f"    open({str(tag_file)!r}, 'w').write(hosts.tag)\n"
        "    assert hosts[0].run('hostname').stdout == 'node1\\n'\n"
        "    raise AssertionError('this test fails on purpose')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_failing.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "this test fails on purpose" in proc.stdout
    tag = tag_file.read_text()
    _assert_group_gone(tag, [f"lkns-{tag}-1", f"lkns-{tag}-2"], [f"lkbr{tag}", f"lkv{tag}h1", f"lkv{tag}h2"])


@pytest.mark.holds("netns")  # (namespace hosts made by a child process)
def test_a_killed_test_run_leaves_no_hosts_running_and_is_swept(tmp_path: Path) -> None:
    """A test process killed with SIGKILL: its sshds die with it; the next run sweeps the rest."""
    code = (
        "import sys, time\n"
        "from tests.cluster.netns import HostGroup\n"
        "g = HostGroup.create(2)\n"
        "print(g.tag, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        tag = child.stdout.readline().strip()
        assert tag, child.stderr.read() if child.stderr else ""
        assert len(_pids_with_cmdline(f"/run/lkcluster/{tag}/")) == 4  # unshare + sshd per host
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    deadline = time.monotonic() + 5
    while _pids_with_cmdline(f"/run/lkcluster/{tag}/") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pids_with_cmdline(f"/run/lkcluster/{tag}/")
    netns = [f"lkns-{tag}-1", f"lkns-{tag}-2"]
    links = [f"lkbr{tag}", f"lkv{tag}h1", f"lkv{tag}h2"]
    # The crash left namespaces and links behind (unless a concurrent test run swept them already).
    left_behind = set(netns) <= set(_netns_list())

    subnet = Subnet.of_process()  # (the child's too: it inherited PYTEST_XDIST_WORKER)
    lock = ClusterLock(subnet)
    assert lock.acquire(timeout=30)
    try:
        removed = sweep_stale(subnet)
    finally:
        lock.release()
    if left_behind:
        assert f"netns lkns-{tag}-1" in removed
    _assert_group_gone(tag, netns, links)


def test_loopback_sshd_stops_cleanly() -> None:
    server = LoopbackSshd.start()
    assert port_open(server.host, server.port)
    proc = server.proc
    server.stop()
    assert proc is not None and proc.poll() is not None
    assert not port_open(server.host, server.port)
    assert not server.dir.exists()
