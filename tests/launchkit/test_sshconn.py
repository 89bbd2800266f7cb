"""The ssh plumbing without a server: how a hostfile entry, the flags and ~/.ssh/config resolve
into a fabric Connection (nothing is opened), and command rendering."""

from __future__ import annotations

import shlex
from pathlib import Path

import fabric
import paramiko
import pytest

from launchkit.backends.ssh.connection import connection
from launchkit.backends.ssh.options import SshOptions
from launchkit.backends.ssh.sync import rsync_argv
from launchkit.core.spec import Host
from launchkit.errors import BackendError


def test_ssh_config_alias_resolves_but_hostfile_and_flags_win(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host gpu*\n  HostName 10.9.9.9\n  User alice\n  Port 2200\n  IdentityFile ~/keys/gpu\n")
    c = connection(Host("gpu1"), SshOptions(config_file=str(cfg)))
    assert (c.host, c.user, c.port, c.gateway) == ("10.9.9.9", "alice", 2200, None)
    assert c.connect_kwargs["key_filename"] == [str(Path("~/keys/gpu").expanduser())]
    assert c.connect_kwargs["look_for_keys"] is False and c.connect_kwargs["allow_agent"] is True
    # -i comes first (ssh tries it first), the config's IdentityFile after it
    key = tmp_path / "k"
    key.write_text("")
    c = connection(Host("gpu1", port=22, user="bob"), SshOptions(config_file=str(cfg), identity=str(key)))
    assert (c.user, c.port, c.connect_kwargs["key_filename"]) == (
        "bob",
        22,
        [str(key), str(Path("~/keys/gpu").expanduser())],
    )
    c = connection(Host("other"), SshOptions(config_file=str(cfg), port=2022, connect_timeout=2.5))
    assert (c.host, c.port, c.connect_kwargs["key_filename"], c.connect_kwargs["look_for_keys"]) == (
        "other",
        2022,
        [],
        True,
    )
    assert c.connect_kwargs["timeout"] == c.connect_kwargs["auth_timeout"] == 2.5 and not c.connect_timeout


def test_proxy_jump_hops_get_the_same_host_key_policy_and_identity(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(
        "Host inner\n  HostName 10.0.0.5\n  ProxyJump ops@bastion:2222,hop2\nHost hop2\n  User j\n"
        "Host pc\n  ProxyCommand nc %h %p\n"
    )
    known = tmp_path / "kh"
    key = tmp_path / "k"
    key.write_text("")
    c = connection(Host("inner"), SshOptions(config_file=str(cfg), identity=str(key), known_hosts=str(known)))
    hops = []
    hop = c
    while isinstance(hop, fabric.Connection):
        hops.append(hop)
        hop = hop.gateway
    assert [(h.host, h.user, h.port) for h in hops[1:]] == [("hop2", "j", 22), ("bastion", "ops", 2222)]
    for h in hops:
        assert h.connect_kwargs["key_filename"] == [str(key)]
        assert h.client._policy.__class__.__name__ == "_AcceptNew" and h.client._policy.path == known
    strict = connection(Host("inner"), SshOptions(config_file=str(cfg), strict_host_keys=True))
    assert isinstance(strict.gateway.client._policy, paramiko.RejectPolicy)
    assert connection(Host("pc"), SshOptions(config_file=str(cfg))).gateway == "nc pc 22"


def test_unreadable_ssh_config_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host x\n  ProxyCommand\n")
    with pytest.raises(BackendError) as err:
        connection(Host("x"), SshOptions(config_file=str(cfg)))
    assert err.value.exit_code == 2 and str(cfg) in err.value.message


def test_a_key_file_that_cannot_be_read_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    """Was exit 1 'cannot connect: No such file or directory' for every host."""
    for given, why in (("/nonexistent/key", "no such file"), (str(tmp_path), "is a directory")):
        with pytest.raises(BackendError) as err:
            connection(Host("x"), SshOptions(identity=given, config_file=str(tmp_path / "none")))
        assert err.value.exit_code == 2
        assert err.value.message == f"ssh: -i {given}: cannot read the key file {given}: {why}"


def test_system_ssh_command_mirrors_the_options() -> None:
    opts = SshOptions(port=2200, identity="/keys/id", known_hosts="/kh", strict_host_keys=True)
    argv = opts.ssh_command(Host("n1"))
    assert argv[:1] == ["ssh"]
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/kh" in argv
    assert argv[argv.index("-p") + 1] == "2200" and argv[argv.index("-i") + 1] == "/keys/id"
    argv = SshOptions().ssh_command(Host("n1", port=22))
    assert (
        argv[argv.index("-p") + 1] == "22" and f"UserKnownHostsFile={SshOptions().known_hosts_path()}" in argv
    )
    assert "StrictHostKeyChecking=accept-new" in SshOptions().ssh_command(Host("n1"))


def test_rsync_argv_quotes_and_targets() -> None:
    opts = SshOptions(identity="/my keys/id")
    argv = rsync_argv("/src dir", Host("n1", user="al", port=2222), "/srv/job/", opts, ["*.ckpt", "data/"])
    assert argv[0] == "rsync" and "--mkpath" in argv
    assert "--exclude=*.ckpt" in argv and "--exclude=data/" in argv
    assert argv[-2:] == ["/src dir/", "al@n1:/srv/job/"]
    rsh = shlex.split(argv[argv.index("-e") + 1])
    assert rsh[rsh.index("-i") + 1] == "/my keys/id" and rsh[rsh.index("-p") + 1] == "2222"
    assert rsync_argv("/s", Host("fe80::1"), "/d", opts)[-1] == "[fe80::1]:/d/"


def test_known_hosts_are_parsed_once_for_every_connection_of_a_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 128 hosts every connection parsed the known-hosts file again (128 x 128 lines, each line
    checked against those before it): 0.8 s of the launcher's CPU during the handshakes."""
    from launchkit.backends.ssh.connection import fabric_config

    line = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"10.0.{i // 250}.{i % 250} ssh-ed25519 {line}\n" for i in range(64)))
    parsed = []
    real = paramiko.hostkeys.HostKeyEntry.from_line

    def counted(*args: object, **kwargs: object) -> object:
        parsed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(paramiko.hostkeys.HostKeyEntry, "from_line", counted)
    opts = SshOptions(known_hosts=str(known), config_file=str(tmp_path / "none"))
    config = fabric_config(opts)
    conns = [connection(Host(f"10.0.0.{i}"), opts, config) for i in range(64)]
    assert len(parsed) == 64  # the file, once (64 x 64 before)
    for i, c in enumerate(conns):  # every connection still knows every host's key
        assert c.client.get_host_keys().lookup(f"10.0.0.{i}") is not None
        assert c.client.get_host_keys() is conns[0].client.get_host_keys()
