"""Worker 0's host on ssh: its address and two free ports there, for a job whose worker 0 serves
the rendezvous (``-s 0``: the node layer's scheduler in worker 0's process) and torch's TCP store
(``MASTER_PORT``). Asked through the launcher's open connection before the job is planned, as
torchrun's launcher picks ``MASTER_PORT``: the ports are free when asked (the kernel's choice),
not held until worker 0 binds them. The address is ``--interface``'s there, else the one the
host was reached at (as its watchdog publishes for ``DMLC_NODE_HOST``)."""

from __future__ import annotations

import contextlib
import shlex
import time
from typing import Any

from launchkit.core.spec import Host
from launchkit.errors import BackendError

#: run with ``python3 -c``; argv[1] the interface ("" for none); prints ``ADDRESS PORT PORT``
PROBE = r"""
import fcntl, os, socket, struct, sys
addr = ""
if sys.argv[1]:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", sys.argv[1].encode()[:15])
            addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
    except OSError:
        pass
parts = os.environ.get("SSH_CONNECTION", "").split()
addr = addr or (parts[2] if len(parts) == 4 else "-")
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("", 0))
print(addr, *(s.getsockname()[1] for s in socks))
"""


def parse(host: Host, text: str, stderr: str = "") -> tuple[str, int, int]:
    """``ADDRESS PORT PORT`` -> (address, rendezvous port, torch's port); ``-``: the host's name."""
    words = text.split()
    if len(words) != 3 or not words[1].isdigit() or not words[2].isdigit():
        err = f"; its stderr: {stderr.strip()[-300:]}" if stderr.strip() else ""
        raise BackendError(
            "ssh",
            f"{host}: cannot pick worker 0's ports there (the port probe printed {text.strip()[:200]!r}{err})",
        )
    address = host.name if words[0] == "-" else words[0]
    return address, int(words[1]), int(words[2])


def _stderr_so_far(chan: Any) -> str:
    """What the probe wrote to stderr until now, without waiting for more."""
    got = b""
    with contextlib.suppress(Exception):
        while len(got) < 65536 and chan.recv_stderr_ready():
            piece = chan.recv_stderr(4096)
            if not piece:
                break
            got += piece
    return got.decode(errors="replace")


def probe(
    conn: Any,
    host: Host,
    interface: str | None,
    timeout: float,
    python: str = "python3",
    start_timeout: float | None = None,
) -> tuple[str, int, int]:
    """(address, rendezvous port, torch's port) on ``host``, through its open connection: a
    session opened within ``timeout`` (``--connect-timeout``), then ``python3 -c`` given
    ``start_timeout`` (``--start-timeout``; a loaded host starts python3 slowly) to answer."""
    bound = timeout if start_timeout is None else start_timeout
    try:
        chan = conn.transport.open_session(timeout=timeout)
    except Exception as exc:  # paramiko raises SSHException, EOFError, socket errors...
        why = str(exc) or type(exc).__name__
        raise BackendError("ssh", f"{host}: cannot open a session to pick worker 0's ports: {why}") from None
    began = time.monotonic()
    try:
        chan.settimeout(bound)
        chan.exec_command(shlex.join([python, "-c", PROBE, interface or ""]))
        out = chan.makefile("rb").read().decode(errors="replace")
    except TimeoutError:
        err = _stderr_so_far(chan).strip()
        saw = f"its stderr: {err[-300:]}" if err else "no output and nothing on its stderr"
        with contextlib.suppress(Exception):
            chan.close()
        raise BackendError(
            "ssh",
            f"{host}: cannot pick worker 0's ports there: the port probe ({python} -c) did not answer "
            f"within {bound:g} s (--start-timeout; waited {time.monotonic() - began:.1f} s): {saw}",
        ) from None
    except Exception as exc:
        why = str(exc) or type(exc).__name__
        with contextlib.suppress(Exception):
            chan.close()
        raise BackendError(
            "ssh", f"{host}: cannot pick worker 0's ports there ({python} -c): {why}"
        ) from None
    err = _stderr_so_far(chan)
    with contextlib.suppress(Exception):
        chan.close()
    return parse(host, out, err)
