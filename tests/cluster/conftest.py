"""Real-host fixtures for the ssh backend: an sshd on loopback, and namespace hosts on 10.231.N.0/24
(N: the pytest-xdist worker's number, else 0; tests/cluster/subnets.py).

    def test_three_hosts(netns_hosts, tmp_path):
        hosts = netns_hosts(3)                    # node1..node3 at 10.231.N.11..13, sshd on :22
        hosts.bridge_address, hosts.cidr          # 10.231.N.1 (this machine), 10.231.N.0/24
        hostfile = hosts.write_hostfile(tmp_path / "hosts")
        out = hosts[0].ssh("hostname").stdout     # 'node1\\n'
        hosts[1].run("ls /srv")                   # a command inside node2's namespaces

    def test_loopback(sshd_loopback):
        subprocess.run(["ssh", *sshd_loopback.ssh_options(), "root@127.0.0.1", "true"], check=True)

    def test_slurm(slurm_local):                  # real Slurm: one node "localhost", CPUs=2
        slurm_local.run(["srun", "-n2", "hostname"])  # SLURM_CONF added (slurm_local.env)

Tests in other directories can use them by importing the fixtures into their module or conftest
(netns_hosts and slurm_netns need netns_session beside them):
`from tests.cluster.conftest import netns_hosts, netns_session, sshd_loopback  # noqa: F401`.
slurm_netns holds the subnet's lock for its whole module, so a module using it must not use
netns_hosts.
A machine that cannot host them (not root, packages missing, no namespace support) fails the
tests that use them with the reason; they are never skipped. See docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from .groups import MARK_HELP, regroup
from .netns import HostGroup, preflight
from .slurm import SlurmCluster
from .sshd import ClusterSetupError, LoopbackSshd
from .subnets import sweep_if_idle

MakeHosts = Callable[..., HostGroup]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARK_HELP)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's --dist loadgroup, each cluster and compat test goes to the worker of
    what it holds (the namespace hosts' subnet, Grid Engine, the session's Slurm), or to any
    (tests/cluster/groups.py)."""
    regroup(items, loadgroup=bool(config.getoption("loadgroup", default=False)))


@pytest.fixture(scope="session")
def sshd_loopback() -> Iterator[LoopbackSshd]:
    """A real sshd on 127.0.0.1:PORT for the whole session (key login as root only, no AcceptEnv)."""
    try:
        server = LoopbackSshd.start()
    except ClusterSetupError as e:
        pytest.fail(f"sshd_loopback: {e}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def netns_session() -> None:
    """Once per session: check privileges and tools, and sweep what a crashed earlier run left."""
    try:
        preflight()
    except ClusterSetupError as e:
        pytest.fail(f"netns_hosts: {e}", pytrace=False)
    sweep_if_idle()


@pytest.fixture
def netns_hosts(netns_session: None) -> Iterator[MakeHosts]:
    """Factory: `netns_hosts(n, private_tmp=True)` builds n namespace hosts and returns a HostGroup.

    One group per test (a worker's groups all use its subnet, and the subnet's lock allows one at a
    time); it is torn down after the test, whether it passed or not.
    """
    groups: list[HostGroup] = []

    def make_hosts(n: int = 3, *, private_tmp: bool = True) -> HostGroup:
        if any(not g.closed for g in groups):
            raise RuntimeError("netns_hosts: one host group per test; close() the previous one first")
        try:
            group = HostGroup.create(n, private_tmp=private_tmp)
        except ClusterSetupError as e:
            pytest.fail(f"netns_hosts: {e}", pytrace=False)
        groups.append(group)
        return group

    yield make_hosts
    for group in groups:
        group.close()


@pytest.fixture(scope="session")
def slurm_local() -> Iterator[SlurmCluster]:
    """A real Slurm cluster for the whole session: one node `localhost` (CPUs=2) on this machine.

    Run clients with `slurm_local.run([...])` or with `slurm_local.env` (SLURM_CONF) added.
    """
    try:
        cluster = SlurmCluster.start_local()
    except ClusterSetupError as e:
        pytest.fail(f"slurm_local: {e}", pytrace=False)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def slurm_netns(netns_session: None) -> Iterator[SlurmCluster]:
    """A real Slurm cluster of three namespace hosts node1..node3 (10.231.N.11-13, CPUs=2 each)
    for one module; slurmctld at 10.231.N.1. Holds the subnet's lock while alive."""
    try:
        cluster = SlurmCluster.start_netns(3)
    except ClusterSetupError as e:
        pytest.fail(f"slurm_netns: {e}", pytrace=False)
    yield cluster
    cluster.stop()


from .sge import sge_local  # noqa: E402, F401  (a real Grid Engine, session scope)


@pytest.fixture(scope="session")
def node_python() -> Iterator[list[str]]:
    """launch flags that make namespace hosts run launchkit's shim: Debian's python3 with a copy
    of the launchkit package in /var/tmp, the one place they share with this machine (the
    checkout may be under /root or /tmp, private to each host)."""
    import secrets
    import shutil
    from pathlib import Path

    root = Path(f"/var/tmp/launchkit-test-node-{secrets.token_hex(4)}")
    checkout = Path(__file__).resolve().parents[2]
    for package in ("launchkit", "dmlc_env"):
        shutil.copytree(checkout / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    yield ["--node-python", "/usr/bin/python3", "--env", f"PYTHONPATH:{root}"]
    shutil.rmtree(root, ignore_errors=True)
