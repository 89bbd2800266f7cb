"""Pure parts of the ssh plumbing: option resolution and command rendering."""

from __future__ import annotations

import shlex
from pathlib import Path

from launchkit.backends.ssh.connection import SshOptions, resolve
from launchkit.backends.ssh.sync import rsync_argv
from launchkit.core.spec import Host


def test_resolve_uses_ssh_config_but_hostfile_and_flags_win(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host gpu*\n  HostName 10.9.9.9\n  User alice\n  Port 2200\n  IdentityFile ~/keys/gpu\n")
    opts = SshOptions(config_file=str(cfg))
    r = resolve(Host("gpu1"), opts)
    assert (r.hostname, r.user, r.port) == ("10.9.9.9", "alice", 2200)
    assert r.identities == (str(Path("~/keys/gpu").expanduser()),)
    r = resolve(Host("gpu1", port=22, user="bob"), SshOptions(config_file=str(cfg), identity="/k"))
    assert (r.user, r.port, r.identities) == ("bob", 22, ("/k",))
    r = resolve(Host("other"), SshOptions(config_file=str(cfg), port=2022))
    assert (r.hostname, r.port) == ("other", 2022)


def test_system_ssh_command_mirrors_the_options() -> None:
    opts = SshOptions(port=2200, identity="/keys/id", known_hosts="/kh", strict_host_keys=True)
    argv = opts.ssh_command(Host("n1"))
    assert argv[:1] == ["ssh"]
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/kh" in argv
    assert argv[argv.index("-p") + 1] == "2200" and argv[argv.index("-i") + 1] == "/keys/id"
    assert SshOptions().ssh_command(Host("n1", port=22))[-2:] == ["-p", "22"]
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
