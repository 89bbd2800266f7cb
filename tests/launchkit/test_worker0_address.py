"""Worker 0's address for torch's rendezvous is one the other hosts reach (issue 40: an mpi job
with -s 0 across hosts got MASTER_ADDR=127.0.0.1 and sat in init_process_group): where the
launcher's machine is, worker 0 publishes the address it reaches it through; a loopback address
that another host would get is refused, naming the flag; gloo and NCCL bind to the interface
toward MASTER_ADDR unless the user set them."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launchkit.backends.mpi import MpiOptions, mpi_env
from launchkit.backends.ssh.agent import HostAgent
from launchkit.core.spec import Host, LaunchSpec
from launchkit.errors import UsageError
from launchkit.hostside import netif, rendezvous
from launchkit.roots import check_reachable
from tests.launchkit.plans import make_plan
from tests.launchkit.test_remote import _PipeConnection, _task


def test_loopback_and_the_interface_toward_an_address() -> None:
    assert netif.is_loopback("127.0.0.1") and netif.is_loopback("127.0.1.1") and netif.is_loopback("::1")
    assert not netif.is_loopback("10.0.0.1") and not netif.is_loopback("node1")
    assert netif.interface_toward("127.0.0.1") == "lo" and netif.interface_of("127.0.0.1") == "lo"
    assert netif.interface_toward("no-such-host.invalid") is None


def test_gloo_and_nccl_bind_toward_master_addr_unless_the_user_said() -> None:
    env = {"DMLC_ROLE": "worker", "MASTER_ADDR": "127.0.0.1"}
    netif.socket_ifnames(env)
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    own = {"DMLC_ROLE": "worker", "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "eth1"}
    netif.socket_ifnames(own)
    assert (own["GLOO_SOCKET_IFNAME"], own["NCCL_SOCKET_IFNAME"]) == ("eth1", "lo")
    for env in (
        {"DMLC_ROLE": "server", "MASTER_ADDR": "127.0.0.1"},
        {"DMLC_ROLE": "worker", "MASTER_ADDR": ""},
    ):
        netif.socket_ifnames(env)
        assert "GLOO_SOCKET_IFNAME" not in env


def test_worker_0_aims_at_the_launchers_machine_before_the_submit_hosts(monkeypatch, tmp_path) -> None:
    """mpi with -s 0 has no scheduler's address and no submit host: the launcher's address toward
    the hosts (LAUNCHKIT_RENDEZVOUS_TOWARD) is where worker 0 looks, not its own name's."""
    aimed: list[str | None] = []

    def local_address(env, toward):
        aimed.append(toward)
        return "127.0.0.1"

    monkeypatch.setattr(rendezvous, "local_address", local_address)
    env = {
        rendezvous.WORKER0_VAR: str(tmp_path / "worker0"),
        rendezvous.TOWARD_VAR: "10.0.0.9",
        "SGE_O_HOST": "submit",
        "DMLC_ROLE": "worker",
        "LAUNCHKIT_ROLE_RANK": "0",
        "LAUNCHKIT_ROOT_SERVER": "worker 0",
        "DMLC_PS_ROOT_URI": "",
        "MASTER_ADDR": "",
        "MASTER_PORT": "0",
    }
    rendezvous.resolve(env)
    assert aimed == ["10.0.0.9"]
    assert (tmp_path / "worker0").read_text().split()[3] == socket.gethostname()  # its host, for the others


def test_mpi_gives_the_ranks_the_launchers_address_toward_the_hosts() -> None:
    spec = LaunchSpec(
        num_workers=2, num_servers=0, command=("true",), backend="mpi", hosts=(Host("n1"), Host("n2"))
    )
    plan = make_plan(spec, job_id="j", secret="s", root_uri="", root_port=0)
    assert mpi_env(plan, MpiOptions(toward="10.0.0.9"))[rendezvous.TOWARD_VAR] == "10.0.0.9"
    assert rendezvous.TOWARD_VAR not in mpi_env(plan, MpiOptions())


def _published(tmp_path: Path, text: str, serves: bool) -> dict[str, str]:
    path = tmp_path / "worker0"
    path.write_text(text)
    return {
        rendezvous.WORKER0_VAR: str(path),
        "DMLC_ROLE": "worker",
        "LAUNCHKIT_ROLE_RANK": "1",
        "LAUNCHKIT_ROOT_SERVER": "worker 0" if serves else "",
        "DMLC_PS_ROOT_URI": "" if serves else "10.0.0.9",
        "MASTER_ADDR": "",
        "MASTER_PORT": "0",
        "PS_START_TIMEOUT": "5",
    }


def test_a_loopback_address_from_worker_0_on_another_host_is_refused_naming_the_flag(
    tmp_path, capsys
) -> None:
    env = _published(tmp_path, "127.0.1.1 4001 4002 some-other-node\n", serves=True)
    with pytest.raises(rendezvous.Unreachable) as err:
        rendezvous.resolve(env)
    said = str(err.value)
    assert "worker 0 on some-other-node published 127.0.1.1, a loopback address" in said
    assert f"this worker on {socket.gethostname()} cannot reach" in said and "--interface IFACE" in said
    # with a scheduler, torch's variables are optional: said, and left unset
    env = _published(tmp_path, "127.0.1.1 4001 4002 some-other-node\n", serves=False)
    rendezvous.resolve(env)
    assert env["MASTER_ADDR"] == "" and "cannot reach" in capsys.readouterr().err
    # the same host, or an address that is not loopback: taken
    for text in (f"127.0.0.1 4001 4002 {socket.gethostname()}\n", "10.0.0.5 4001 4002 some-other-node\n"):
        env = _published(tmp_path, text, serves=True)
        rendezvous.resolve(env)
        assert env["MASTER_PORT"] == "4002" and env["DMLC_PS_ROOT_PORT"] == "4001"


def test_the_shim_ends_the_job_with_the_reason(tmp_path) -> None:
    """On an engine, the worker's shim says why and fails, rather than the job waiting in
    init_process_group for a store it cannot reach."""
    import json

    from launchkit.hostside import shim

    env = _published(tmp_path, "127.0.1.1 4001 4002 some-other-node\n", serves=True)
    table = json.dumps({"v": 1, "tasks": [{"i": 0, "env": env}]})
    res = subprocess.run(
        [sys.executable, "-m", "launchkit.hostside.shim", "--", "true"],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": ":".join(sys.path),
            shim.TASKS_VAR: table,
            "PMI_RANK": "0",
        },
        capture_output=True,
        timeout=30,
    )
    assert res.returncode == 1
    assert b"published 127.0.1.1, a loopback address" in res.stderr and b"--interface IFACE" in res.stderr


def test_the_launch_refuses_a_loopback_worker_0_in_a_job_that_spans_machines() -> None:
    spread = LaunchSpec(
        num_workers=2,
        num_servers=0,
        command=("true",),
        backend="ssh",
        hosts=(Host("localhost"), Host("10.0.0.2")),
    )
    with pytest.raises(UsageError) as err:
        check_reachable(spread, "127.0.0.1")
    said = err.value.message if hasattr(err.value, "message") else str(err.value)
    assert "worker 0's host localhost is reached at 127.0.0.1, a loopback address" in said
    assert "10.0.0.2" in said and "--interface IFACE" in said and "--scheduler-ip ADDRESS" in said
    check_reachable(spread, "10.0.0.1")  # an address the others reach
    here = dataclasses.replace(spread, hosts=(Host("localhost", port=2222), Host("127.0.0.1", port=2223)))
    check_reachable(here, "127.0.0.1")  # every worker on this machine (sshd on loopback, twice)


def test_an_ssh_hosts_watchdog_gives_its_workers_the_interface_toward_master_addr(tmp_path) -> None:
    conn = _PipeConnection()
    agent = HostAgent(
        Host("h1"), conn, "job-ifname", hb_interval=5.0, hb_timeout=30.0, grace=1.0, interface=None
    )
    agent.start(10.0)
    task = _task(tmp_path)
    env = {**task.env, "LAUNCHKIT_JOB_ID": "job-ifname", "MASTER_ADDR": "127.0.0.1"}
    say = 'echo "$GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME"'
    proc = agent.spawn(0, dataclasses.replace(task, argv=("sh", "-c", say), env=env))
    try:
        assert proc.wait() == 0
        assert proc.stdout.read() == b"lo lo\n"
    finally:
        agent.close(2.0)
        assert conn.chan.p is not None
        conn.chan.p.kill()
        conn.chan.p.wait()


def test_an_ssh_config_alias_is_judged_by_the_host_it_names() -> None:
    """A hostfile of ssh config aliases (trainer-box -> HostName 127.0.0.1): every worker is on
    this machine, so a loopback worker 0 is no fault; the alias itself does not resolve here."""
    spec = LaunchSpec(
        num_workers=2,
        num_servers=0,
        command=("true",),
        backend="ssh",
        hosts=(Host("trainer-box.invalid"), Host("trainer-box.invalid", port=2223)),
    )
    with pytest.raises(UsageError):
        check_reachable(spec, "127.0.0.1")  # by the alias alone: another machine, perhaps
    check_reachable(spec, "127.0.0.1", lambda h: "127.0.0.1")
