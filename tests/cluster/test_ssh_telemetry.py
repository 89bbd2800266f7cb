"""The metrics endpoint gets an ssh host's figures and its processes' usage from the watchdog's
heartbeats (real sshd on loopback, in-process launch)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from launchkit import launching
from launchkit.backends.ssh.backend import SshBackend
from launchkit.backends.ssh.options import SshOptions
from launchkit.console import Ui
from launchkit.core.hostfile import read_hostfile
from launchkit.core.spec import Host, LaunchSpec
from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.cluster.test_trainer_core_ssh import ROOT, host_python  # noqa: F401

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 4: pass"


def test_remote_rows_get_host_figures_and_process_usage(
    sshd_loopback, tmp_path: Path, served_endpoints
) -> None:
    served = served_endpoints
    host = Host(sshd_loopback.host, port=sshd_loopback.port, user=sshd_loopback.user)
    backend = SshBackend(SshOptions(identity=str(sshd_loopback.identity), known_hosts=str(tmp_path / "kh")))
    spec = LaunchSpec(
        num_workers=1,
        num_servers=0,
        command=("python3", "-c", BUSY),
        hosts=(host,),
        backend="ssh",
        cwd="/tmp",
    )
    result = launching.run_job(spec, backend, Ui())
    assert result.exit_code == 0
    model = served[0].model
    remote = model.hosts[str(host)].latest
    assert remote["mem_total"] > 0 and "load1" in remote and "net_rx_bytes" in remote
    busy = [cpu for (h, _), (cpu, rss) in model.procs.items() if h == str(host) and cpu and rss > 0]
    # A busy loop gets a core's share of the machine: 18.9 % at load 17 on 2 cores (about 2/17 of a
    # core is its fair share there). Over 5 % still tells a busy process, in percent, from an idle
    # one (under 1 %) and from a fraction of one (0.19).
    assert busy and max(busy) > 5, model.procs
    assert "localhost" not in model.hosts  # -s 0: no scheduler process, nothing of the job runs here


@pytest.mark.timeout(480)
def test_node_reports_cross_hosts_and_every_host_has_the_same_columns(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch,
    served_endpoints,
) -> None:
    """trainer_core workers and a server on two namespace hosts report over UDP to the endpoint on
    the bridge; each host's watchdog sends the same figures the launcher's host gets."""
    served = served_endpoints
    group = netns_hosts(2)
    job = tmp_path / "job"
    job.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):
        shutil.copytree(ROOT / pkg, job / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tests" / "launchkit" / "metricsjob.py", job / "metricsjob.py")
    monkeypatch.chdir(job)  # what --sync-dst-dir copies
    hosts = tuple(read_hostfile(group.write_hostfile(tmp_path / "hosts")))
    backend = SshBackend(SshOptions(identity=str(group.identity), known_hosts=str(group.known_hosts)))
    spec = LaunchSpec(
        num_workers=2,
        num_servers=1,
        command=(host_python, "metricsjob.py"),
        hosts=hosts,
        backend="ssh",
        cwd=str(job),
        sync_dst_dir="/srv/metricsjob",
        env=(("HOLD_S", "2.5"),),
    )  # heartbeats come every second
    assert launching.run_job(spec, backend, Ui()).exit_code == 0
    t = served[0]
    assert not t.address.startswith("127.")  # the bridge: what the hosts reach the launcher at
    nodes = {k: s.latest for k, s in t.model.nodes.items()}
    for rank in (0, 1):
        assert nodes[("worker", rank)]["bytes_pushed"] == 5 * 4000 and nodes[("worker", rank)]["loss"] == 0.2
    assert nodes[("server", 0)]["registered"] == 1
    columns = set(t.model.hosts["localhost"].latest)
    for h in hosts:
        assert set(t.model.hosts[str(h)].latest) == columns, str(h)
