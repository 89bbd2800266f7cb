"""``--sync-dst-dir``'s rsync, in-process, against fake ``rsync`` programs on PATH: every host ends
with a result (synced, failed with rsync's own message, timed out, could not run), whatever rsync
does, and any failure is one BackendError naming each host. The real rsync over real sshd is in
tests/cluster/test_ssh_launch.py."""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from launchkit.backends.ssh.options import SshOptions
from launchkit.backends.ssh.sync import sync_all
from launchkit.core.spec import Host
from launchkit.errors import BackendError
from tests.launchkit.procs import wait_until

HOSTS = [Host("h1"), Host("h2")]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


CAUSE = 'rsync: [Receiver] mkdir "/d" failed: Permission denied (13)'
SUMMARY = "rsync error: some files/attrs were not transferred (see previous errors) (code 23) at main.c(1338)"


def fake_rsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, *, only: bool = False) -> Path:
    """Put an ``rsync`` running ``body`` (sh) first on PATH (alone on it with ``only``)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    path = bindir / "rsync"
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) if only else f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return path


def sync_in_thread(tmp_path: Path, limit: float, **kw) -> BaseException | None:
    """sync_all to HOSTS in a thread that must end within ``limit`` seconds; returns what it raised."""
    out: list[BaseException | None] = []

    def target() -> None:
        try:
            sync_all(HOSTS, str(tmp_path), "/d", SshOptions(), (), Console(file=io.StringIO()), **kw)
            out.append(None)
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit)
    assert out, f"sync_all did not return within {limit} s"
    return out[0]


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_more_stderr_than_a_pipe_holds_does_not_deadlock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # about 190 KiB of errors, while stdout stays open: reading stdout to its end first blocks both
    fake_rsync(
        tmp_path,
        monkeypatch,
        f"""#!/bin/sh
echo '{CAUSE}' >&2
yes 'rsync: send_files failed to open "some/file": Permission denied (13)' | head -n 3000 >&2
echo '{SUMMARY}' >&2
exit 23
""",
    )
    exc = sync_in_thread(tmp_path, 30)
    assert isinstance(exc, BackendError), exc
    msg = exc.message
    assert msg.startswith("ssh: sync to 2 of 2 host(s) failed, nothing started: ")
    for h in ("h1", "h2"):
        assert (
            f"{h}: rsync exited with code 23 (partial transfer due to error): {CAUSE} (and 3001 more line(s))"
            in msg
        )
    assert "main.c" not in msg


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_hanging_rsync_times_out_and_its_children_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    fake_rsync(
        tmp_path,
        monkeypatch,
        f"""#!/bin/sh
case "$*" in *h1:*) exit 0 ;; esac
sleep 600 &
echo $$ $! > {pids}
wait
""",
    )
    t0 = time.monotonic()
    exc = sync_in_thread(tmp_path, 20, timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert isinstance(exc, BackendError), exc
    assert (
        exc.message
        == "ssh: sync to 1 of 2 host(s) failed, nothing started: h2: timed out after 1 s (--sync-timeout)"
    )
    for pid in map(int, pids.read_text().split()):
        assert wait_until(lambda pid=pid: not alive(pid), 5), pid


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, -15), (signal.SIGHUP, -1)])
def test_a_signal_during_the_sync_ends_every_rsync_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int, code: int
) -> None:
    # the rsyncs run in their own sessions (for the timeout's kill), out of the terminal's reach
    pids = tmp_path / "pids"
    fake_rsync(tmp_path, monkeypatch, f"#!/bin/sh\nsleep 600 &\necho $$ $! >> {pids}\nwait\n")
    script = (
        "import io, sys\n"
        "from rich.console import Console\n"
        "from launchkit.backends.ssh.options import SshOptions\n"
        "from launchkit.backends.ssh.sync import sync_all\n"
        "from launchkit.core.spec import Host\n"
        "try:\n"
        f"    sync_all([Host('h1'), Host('h2')], {str(tmp_path)!r}, '/d', SshOptions(), (), Console(file=io.StringIO()))\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n"
    )
    # each signal as a terminal leaves it (a test run under nohup would otherwise ignore SIGHUP)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parents[2],
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),
    )
    try:
        assert wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 4, 10)
        proc.send_signal(sig)
        assert proc.wait(10) == code  # Ctrl-C: KeyboardInterrupt; SIGTERM, SIGHUP: as before, dies of it
    finally:
        proc.kill()
    for pid in map(int, pids.read_text().split()):
        assert wait_until(lambda pid=pid: not alive(pid), 5), pid


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_an_rsync_that_cannot_run_is_a_result_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_rsync(tmp_path, monkeypatch, "this is not a program\n", only=True)  # no '#!': exec fails (ENOEXEC)
    exc = sync_in_thread(tmp_path, 20)
    assert isinstance(exc, BackendError), repr(exc)
    assert "sync to 2 of 2 host(s) failed, nothing started" in exc.message
    assert "h1: cannot run rsync: Exec format error" in exc.message
    assert "h2: cannot run rsync: Exec format error" in exc.message


def test_no_rsync_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    exc = sync_in_thread(tmp_path, 20)
    assert isinstance(exc, BackendError)
    assert "h1: rsync is not installed on this machine (needed for --sync-dst-dir)" in exc.message


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_an_exception_in_one_host_still_gives_every_host_a_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launchkit.backends.ssh import sync

    fake_rsync(tmp_path, monkeypatch, "#!/bin/sh\nexit 0\n")
    real = sync.rsync_argv

    def argv(src, host, *a, **kw):  # type: ignore[no-untyped-def]
        if host.name == "h2":
            raise RuntimeError("boom")
        return real(src, host, *a, **kw)

    monkeypatch.setattr(sync, "rsync_argv", argv)
    exc = sync_in_thread(tmp_path, 20)
    assert isinstance(exc, BackendError), repr(exc)
    assert exc.message == "ssh: sync to 1 of 2 host(s) failed, nothing started: h2: RuntimeError: boom"


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_success_returns_a_result_per_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_rsync(
        tmp_path, monkeypatch, "#!/bin/sh\nprintf '      1,024 100%%   1.00MB/s    0:00:00\\r'\nexit 0\n"
    )
    results = sync_all(HOSTS, str(tmp_path), "/d", SshOptions(), (), Console(file=io.StringIO()), timeout=10)
    assert [(r.host.name, r.ok, r.error) for r in results] == [("h1", True, ""), ("h2", True, "")]


def test_rsync_message_picks_the_cause() -> None:
    from launchkit.backends.ssh.sync import rsync_message

    assert rsync_message(f"{CAUSE}\n{SUMMARY}\n") == f"{CAUSE} (and 1 more line(s))"
    assert rsync_message(SUMMARY) == SUMMARY
    assert rsync_message("") == "it said nothing"
    ssh_warning = "Warning: Permanently added '[127.0.0.1]:46409' (ED25519) to the list of known hosts."
    closed = "rsync: connection unexpectedly closed (0 bytes received so far) [sender]"
    denied = "root@node2: Permission denied (publickey)."
    assert rsync_message(f"{ssh_warning}\n{CAUSE}\n{SUMMARY}") == f"{CAUSE} (and 2 more line(s))"
    assert rsync_message(f"{ssh_warning}\n{denied}\n{closed}\n{SUMMARY}") == f"{denied} (and 3 more line(s))"
    assert rsync_message(f"{closed}\n{SUMMARY}") == f"{closed} (and 1 more line(s))"


# -- the real rsync, over a real sshd ----------------------------------------------------------

from tests.cluster.conftest import sshd_loopback  # noqa: E402, F401
from tests.launchkit.procs import run  # noqa: E402


def loopback_launch(server, tmp_path: Path, *flags: str) -> list[str]:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(server.hostfile_line() + "\n")
    return [
        "launch",
        "-H",
        str(hostfile),
        "-i",
        str(server.identity),
        "--known-hosts",
        str(tmp_path / "known_hosts"),
        *flags,
        "-n",
        "1",
        "-s",
        "0",
        "hostname",
    ]


def test_real_rsync_failure_says_why_and_starts_nothing(sshd_loopback, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "job").mkdir()
    res = run(
        loopback_launch(sshd_loopback, tmp_path, "--sync-dst-dir", "/proc/lk-not-writable/job"),
        cwd=tmp_path / "job",
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    err = " ".join(res.stderr.split())
    assert "sync to 1 of 1 host(s) failed, nothing started" in err
    assert "rsync exited with code 11 (error in file I/O): " in err
    # rsync's own cause; now and then rsync loses it (its receiver's message; plain rsync too)
    assert 'mkdir "/proc/lk-not-writable/job/" failed' in err or "it said nothing" in err
    assert "main.c" not in err and "Traceback" not in err
    assert "[worker" not in res.stdout and "job " not in err.split("failed")[0]


def test_real_rsync_timeout(sshd_loopback, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "job").mkdir()
    dst = str(tmp_path / "dst")
    res = run(
        loopback_launch(sshd_loopback, tmp_path, "--sync-dst-dir", dst, "--sync-timeout", "0.05"),
        cwd=tmp_path / "job",
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    assert "timed out after 0.05 s (--sync-timeout)" in " ".join(res.stderr.split())
    assert "[worker" not in res.stdout
