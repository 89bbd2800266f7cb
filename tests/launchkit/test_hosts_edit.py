"""``launchkit hosts add`` / ``remove`` on files of every kind: a link stays a link and its target
is edited, the mode is kept, and every file that cannot be a hostfile is a clean exit 2 that
names it and changes nothing (the real CLI in a subprocess)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.launchkit.procs import run


def test_a_link_stays_a_link_and_its_target_is_edited(tmp_path: Path) -> None:
    """The link was replaced by a regular file and its target left unchanged."""
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "hosts"
    target.write_text("# cluster\nnode1\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    res = run(["hosts", "add", "node2", "-H", str(link)])
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "# cluster\nnode1\nnode2\n"
    res = run(["hosts", "remove", "node1", "-H", str(link)])
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and target.read_text() == "# cluster\nnode2\n"
    assert sorted(p.name for p in real_dir.iterdir()) == ["hosts"]  # no temporary file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


@pytest.mark.parametrize("mode", [0o444, 0o600, 0o640])
def test_the_mode_is_kept(tmp_path: Path, mode: int) -> None:
    """A mode-444 file came back 644."""
    hf = tmp_path / "hosts"
    hf.write_text("node1\n")
    hf.chmod(mode)
    assert run(["hosts", "add", "node2", "-H", str(hf)]).returncode == 0
    assert stat.S_IMODE(hf.stat().st_mode) == mode and hf.read_text() == "node1\nnode2\n"
    assert run(["hosts", "remove", "node1", "-H", str(hf)]).returncode == 0
    assert stat.S_IMODE(hf.stat().st_mode) == mode and hf.read_text() == "node2\n"


def test_a_file_of_comments_only_can_be_added_to(tmp_path: Path) -> None:
    hf = tmp_path / "hosts"
    hf.write_text("# to fill\n")
    assert run(["hosts", "add", "node1", "-H", str(hf)]).returncode == 0
    assert hf.read_text() == "# to fill\nnode1\n"


def _kind(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A path of ``kind`` and the message that names it."""
    if kind == "directory":
        (tmp_path / "d").mkdir()
        return tmp_path / "d", "is a directory, expected a hostfile"
    if kind == "missing parent":
        return tmp_path / "no" / "dir" / "f", f"no such file, and no directory {tmp_path / 'no' / 'dir'}"
    if kind == "not UTF-8":
        (tmp_path / "bin").write_bytes(b"node1\n\xff\xfe\n")
        return tmp_path / "bin", "bin:2: not UTF-8 text"
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo", "is a fifo: hosts add and remove rewrite a regular file"
    if kind == "unreadable":
        return Path("/proc/self/mem"), "cannot read"  # EIO, for root too
    if kind == "link loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        return tmp_path / "a", "Too many levels of symbolic links"
    (tmp_path / "bad").write_text("node1\nnode2 slots=0\n")
    return tmp_path / "bad", "bad:2: bad slots '0'"


KINDS = ["directory", "missing parent", "not UTF-8", "fifo", "unreadable", "link loop", "does not parse"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["add", "remove"])
def test_a_file_that_cannot_be_a_hostfile_is_a_clean_error(tmp_path: Path, kind: str, command: str) -> None:
    """hosts add -H DIR, -H /nonexistent/dir/f and a non-UTF-8 file ended in 'internal error:
    IsADirectoryError / FileNotFoundError / UnicodeDecodeError', exit 1."""
    path, message = _kind(tmp_path, kind)
    before = sorted(tmp_path.iterdir())
    res = run(["hosts", command, "node3", "-H", str(path)])
    assert res.returncode == 2, (res.stdout, res.stderr)
    if kind == "missing parent" and command == "remove":
        message = "no such file"
    assert message in res.stderr and "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert sorted(tmp_path.iterdir()) == before


def test_a_directory_that_cannot_be_written_is_a_clean_error(tmp_path: Path) -> None:
    res = run(["hosts", "add", "node3", "-H", "/proc/self/hosts"])  # no file can be made there, even as root
    assert res.returncode == 2 and "/proc/self/hosts: cannot write" in res.stderr, res.stderr


def test_hosts_check_needs_a_positive_timeout(tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("node1\n")
    res = run(["hosts", "check", "-H", str(tmp_path / "hf"), "--connect-timeout", "0"])
    assert res.returncode == 2 and "--connect-timeout must be more than 0, got 0" in res.stderr, res.stderr


@pytest.mark.parametrize("eol", ["\r\n", "\n"])
def test_every_other_line_is_kept_byte_for_byte(tmp_path: Path, eol: str) -> None:
    """A CRLF hostfile came back with LF line ends, and a comment with a form feed or U+2028 in
    it (str.splitlines splits there) came back as two lines."""
    hf = tmp_path / "hosts"
    before = eol.join(["# my cluster \x0c page", "node1 slots=2  # caf\u2028e", "", "\tnode2", ""])
    hf.write_bytes(before.encode())
    res = run(["hosts", "add", "node3", "-H", str(hf)])
    assert res.returncode == 0, res.stderr
    assert hf.read_bytes() == (before + "node3" + eol).encode()
    res = run(["hosts", "remove", "node3", "-H", str(hf)])
    assert res.returncode == 0, res.stderr
    assert hf.read_bytes() == before.encode()


def test_hosts_check_flags_a_host_name_that_resolves_to_loopback() -> None:
    """issue 40: Debian's 127.0.1.1 for the host's own name made gloo unreachable; hosts check said nothing."""
    from launchkit.backends.ssh.commands import HostResult
    from launchkit.cli.hosts import loopback_names
    from launchkit.core.spec import Host

    results = [
        HostResult(Host("a"), True, data={"hostname": "node1", "name_address": "127.0.1.1"}),
        HostResult(Host("b"), True, data={"hostname": "node2", "name_address": "10.0.0.2"}),
        HostResult(Host("c"), False, error="down"),
        HostResult(Host("d"), True, data={"hostname": "node4", "name_address": None}),
    ]
    (line,) = loopback_names(results)
    assert line.startswith("a: its host name node1 resolves to 127.0.1.1 there, a loopback address")
    assert "GLOO_SOCKET_IFNAME" in line and "/etc/hosts" in line
