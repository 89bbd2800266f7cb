"""How the launcher reaches hosts, on real sshd servers: ``~/.ssh/config`` aliases and ProxyJump
through a jump host (fabric's Connection underneath), with launchkit's host-key policy on every hop."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from launchkit.backends.ssh.commands import on_hosts
from launchkit.backends.ssh.options import SshOptions
from launchkit.core.spec import Host
from tests.launchkit.procs import run

# on the host: the ssh client's address and port, the server's address and port; the scheduler's address
WHERE = "import os; print(os.environ.get('SSH_CONNECTION', '-'), os.environ['DMLC_PS_ROOT_URI'])"


def home_with_config(tmp_path: Path, config: str) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(config)
    return {**os.environ, "HOME": str(home)}


def test_proxy_jump_reaches_a_host_through_another(netns_hosts, tmp_path: Path) -> None:
    group = netns_hosts(2)
    jump, target = group[0], group[1]
    env = home_with_config(
        tmp_path,
        f"Host trainer\n  HostName {target.address}\n  User root\n  IdentityFile {group.identity}\n"
        f"  ProxyJump root@{jump.address}\n",
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text("trainer\n")
    known = tmp_path / "known_hosts"
    # -i names the key for the jump host too; both hosts' keys are new (accept-new records both)
    flags = ["-H", str(hostfile), "-i", str(group.identity), "--known-hosts", str(known)]
    res = run(["launch", *flags, "-n", "1", "-s", "1", "python3", "-c", WHERE], cwd="/", env=env)
    assert res.returncode == 0, res.stderr
    line = next(line for line in res.stdout.splitlines() if line.startswith("[worker 0] "))
    client, _, server, _, root = line.removeprefix("[worker 0] ").split()
    assert (client, server) == (jump.address, target.address)  # a direct connection comes from the bridge
    assert root == group.bridge_address  # no socket of ours reaches the host: the route toward it
    assert {line.split()[0] for line in known.read_text().splitlines()} == {jump.address, target.address}
    check = run(["hosts", "check", *flags, "--json"], env=env)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)[0]["hostname"] == "node2"
    # a changed key on the jump host is refused like any other
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    kind, key = (tmp_path / "other.pub").read_text().split()[:2]
    lines = [line for line in known.read_text().splitlines() if not line.startswith(f"{jump.address} ")]
    known.write_text("\n".join([*lines, f"{jump.address} {kind} {key}"]) + "\n")
    res = run(["launch", *flags, "-n", "1", "-s", "0", "true"], cwd="/", env=env)
    assert res.returncode == 1
    assert f"trainer: jump host {jump.address}: host key does not match" in " ".join(res.stderr.split())
    # a host the jump host cannot reach (no such address on its network)
    nowhere = f"{group.subnet.prefix}.77"
    lost = home_with_config(
        tmp_path / "lost", f"Host trainer\n  HostName {nowhere}\n  ProxyJump root@{jump.address}\n"
    )
    known.unlink()
    res = run(["hosts", "check", *flags, "--connect-timeout", "5", "--json"], env=lost)
    assert res.returncode == 1
    error = json.loads(res.stdout)[0]["error"]
    assert error.startswith(f"trainer: jump host {jump.address} cannot reach {nowhere}:22"), error
    # the jump host down: the error says which hop failed
    jump.stop()
    res = run(["hosts", "check", *flags, "--connect-timeout", "2", "--json"], env=env)
    assert res.returncode == 1
    error = json.loads(res.stdout)[0]["error"]
    assert error.startswith(f"trainer: jump host {jump.address}: cannot connect"), error


def test_ssh_config_alias_with_hostname_port_user_and_identity(sshd_loopback, tmp_path: Path) -> None:
    env = home_with_config(
        tmp_path,
        f"Host box\n  HostName {sshd_loopback.host}\n  Port {sshd_loopback.port}\n  User root\n"
        f"  IdentityFile {sshd_loopback.identity}\n",
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text("box\n")
    res = run(["hosts", "check", "-H", str(hostfile), "--json"], env=env)
    assert res.returncode == 0, res.stderr
    row = json.loads(res.stdout)[0]
    assert row["host"] == "box" and row["reachable"] and row["rtt_ms"] > 0 and row["connect_ms"] > 0
    known = Path(env["HOME"]) / ".ssh" / "known_hosts"
    assert known.read_text().startswith(f"[{sshd_loopback.host}]:{sshd_loopback.port} ssh-ed25519 ")
    # the hostfile's port wins over the alias's: nothing listens on port 1
    hostfile.write_text("box:1\n")
    res = run(["hosts", "check", "-H", str(hostfile), "--connect-timeout", "2", "--json"], env=env)
    assert res.returncode == 1 and "cannot connect" in json.loads(res.stdout)[0]["error"]


def test_one_shot_commands_give_one_result_per_host(sshd_loopback, tmp_path: Path) -> None:
    """The fabric group's GroupResult, turned into HostResults: output, a non-zero exit, a timeout,
    an unreachable host, and two entries naming one login (the command runs there once)."""
    config = tmp_path / "config"
    config.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {sshd_loopback.port}\n  User root\n")
    opts = SshOptions(
        identity=str(sshd_loopback.identity),
        known_hosts=str(tmp_path / "kh"),
        connect_timeout=2,
        config_file=str(config),
    )
    direct = Host("127.0.0.1", port=sshd_loopback.port, user="root")
    hosts = [Host("box"), Host("127.0.0.1", port=1), direct]
    mark = tmp_path / "ran"
    count = ["sh", "-c", f"echo x >> {mark}; wc -l < {mark}"]
    results = on_hosts(hosts, opts, count, lambda out: {"n": int(out)}, timeout=10, what="count")
    assert [r.host for r in results] == hosts
    assert [r.ok for r in results] == [True, False, True]
    assert results[0].data["n"] == results[2].data["n"] == 1 and mark.read_text() == "x\n"
    assert results[0].latency_ms and results[0].data["rtt_ms"] > 0
    assert results[1].error.startswith("127.0.0.1:1: cannot connect")
    failing = on_hosts([direct], opts, ["sh", "-c", "echo oops >&2; exit 3"], dict, timeout=10, what="test")
    assert failing[0].error == f"{direct}: test failed (3): oops"
    slow = on_hosts([direct], opts, ["sleep", "5"], dict, timeout=1, what="sleep")
    assert not slow[0].ok and "did not complete within 1 seconds" in slow[0].error
