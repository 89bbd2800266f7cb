"""Helpers for real sshd servers in tests: keys, a private sshd_config, starting and stopping.

Nothing here touches the machine's own sshd setup: every key, config, pid file and log lives in
a directory the caller owns, and sshd runs as a child of the test process. See docs/testing.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
#: Commands the fixtures need, and the Debian package each comes from (scripts/test.sh installs them).
REQUIRED_COMMANDS = {
    SSHD: "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
}
_PR_SET_PDEATHSIG = 1


class ClusterSetupError(RuntimeError):
    """The test cluster could not be set up on this machine (missing package, privilege, kernel feature)."""


def require_commands(commands: dict[str, str]) -> None:
    """Fail with the package to install when one of `commands` (name -> Debian package) is missing."""
    missing = [f"{cmd} (Debian package {pkg})" for cmd, pkg in commands.items() if not shutil.which(cmd)]
    if missing:
        raise ClusterSetupError(
            "missing commands for the real-host test fixtures: "
            + ", ".join(missing)
            + "; run `bash scripts/test.sh`, which installs them"
        )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """preexec_fn: SIGKILL this child when the thread that started it dies (even by SIGKILL)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn_daemon(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a long-running child with stdout/stderr going to `log_path`.

    When called from the main thread the child gets PR_SET_PDEATHSIG=SIGKILL, so a test process
    killed outright does not leave it running. (The death signal follows the starting *thread*,
    so it is not set from other threads, where it would fire as soon as that thread ends.)
    """
    preexec = _die_with_parent if threading.current_thread() is threading.main_thread() else None
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec
        )


def keygen(path: Path, comment: str) -> Path:
    """Create an ed25519 key pair at `path` (and `path`.pub) without a passphrase."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return path


def write_sshd_config(
    path: Path,
    *,
    listen: str,
    port: int,
    host_key: Path,
    authorized_keys: Path,
    pid_file: Path,
) -> Path:
    """Write a private sshd_config for root logins by key only. Deliberately no `AcceptEnv`:
    a stock sshd passes only LANG/LC_*, and code under test must not rely on more."""
    lines = [
        f"ListenAddress {listen}",
        f"Port {port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {pid_file}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # Keys live in temp dirs whose owners/modes sshd's StrictModes would refuse.
        "StrictModes no",
        # Parallel tests open many connections at once; the default 10:30:100 drops some.
        "MaxStartups 100:30:200",
        "PrintMotd no",
        "UseDNS no",
        f"Subsystem sftp {SFTP_SERVER}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def ensure_privsep_dir() -> None:
    """sshd exits with "Missing privilege separation directory" without /run/sshd."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether a TCP connection to host:port succeeds (and the peer sends the ssh banner start)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout * 5)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def client_options(identity: Path, known_hosts: Path, port: int | None = None) -> list[str]:
    """Options for the system `ssh` client (also usable as rsync's `-e "ssh ..."`)."""
    opts = [] if port is None else ["-p", str(port)]
    return [
        *opts,
        "-i",
        str(identity),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "BatchMode=yes",
    ]


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; always reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout)


def tail(path: Path, limit: int = 2000) -> str:
    """The end of a log file, for error messages."""
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


@dataclass
class LoopbackSshd:
    """A real sshd on 127.0.0.1, running as a child of the test process.

    Attributes: `host`, `port`, `user`, `identity` (client private key), `known_hosts` (starts
    empty; accept-new fills it), `dir` (temp dir with config, keys, `sshd.log`), `config`.
    """

    dir: Path
    port: int
    host: str = "127.0.0.1"
    user: str = "root"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def identity(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    def ssh_options(self) -> list[str]:
        """`-p PORT -i KEY -o UserKnownHostsFile=... -o StrictHostKeyChecking=accept-new -o BatchMode=yes`."""
        return client_options(self.identity, self.known_hosts, self.port)

    def hostfile_line(self) -> str:
        """'root@127.0.0.1:PORT', as a launchkit hostfile line."""
        return f"{self.user}@{self.host}:{self.port}"

    def ssh(self, command: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """Run `command` (a remote shell line) over the system ssh client; output captured as text."""
        return subprocess.run(
            ["ssh", *self.ssh_options(), f"{self.user}@{self.host}", command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def start(cls, ready_timeout: float = 5.0) -> LoopbackSshd:
        """Create keys and config in a fresh temp dir, start sshd, wait until it accepts."""
        require_commands(REQUIRED_COMMANDS)
        ensure_privsep_dir()
        tmp = Path(tempfile.mkdtemp(prefix="lk-sshd-"))
        try:
            self = cls(dir=tmp, port=free_port())
            keygen(tmp / "ssh_host_ed25519_key", "launchkit-test-host")
            keygen(self.identity, "launchkit-test-client")
            authorized = tmp / "authorized_keys"
            shutil.copyfile(self.identity.with_suffix(".pub"), authorized)
            self.known_hosts.touch()
            write_sshd_config(
                self.config,
                listen=self.host,
                port=self.port,
                host_key=tmp / "ssh_host_ed25519_key",
                authorized_keys=authorized,
                pid_file=tmp / "sshd.pid",
            )
            self._run(ready_timeout)
            return self
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _run(self, ready_timeout: float) -> None:
        # The port was free a moment ago; if another process took it since, try a new one.
        for _attempt in range(3):
            self.proc = spawn_daemon([SSHD, "-D", "-e", "-f", str(self.config)], self.log)
            deadline = time.monotonic() + ready_timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if port_open(self.host, self.port):
                    return
                time.sleep(0.02)
            stop_process(self.proc)
            if "Address already in use" not in tail(self.log):
                break
            old = self.port
            self.port = free_port()
            self.config.write_text(self.config.read_text().replace(f"Port {old}\n", f"Port {self.port}\n"))
        raise ClusterSetupError(
            f"sshd on {self.host}:{self.port} did not accept connections within {ready_timeout:.0f}s "
            f"(exit status {self.proc.returncode if self.proc else None}); its log:\n{tail(self.log)}"
        )

    def stop(self) -> None:
        """Stop sshd and remove the temp dir. Sessions already open are not this helper's business."""
        if self.proc is not None:
            stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
