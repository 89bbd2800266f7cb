"""The reaper: a tiny process that outlives the launcher just long enough to clean up.

The launcher starts it first, in a session of its own, holding the write end of a pipe whose
read end is the reaper's stdin. When the launcher exits for any reason (including SIGKILL), the
kernel closes the pipe, the reaper reads EOF, runs the cleanup commands the launcher sent it
(``Cleanups.add``: e.g. ``scancel JOB`` for a job a cluster engine runs), ends every process that
still carries the job's id in its environment, then removes the job's shared-memory segments.
A launcher that ends its job itself says so first (``Cleanups.close``); when it died instead
(the pipe ended without that word) and its record still says ``running``, the reaper also sweeps
the job's ssh hosts and, when every step is known to have succeeded (each cleanup command exited
0, each host's sweep answered), records when (``reaped_at``): ``ps`` then shows the lost job as
``ended (lost)`` on any backend.
Usage: ``python -m launchkit.jobs.reaper JOB_ID GRACE_SECONDS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

from launchkit.hostside.procscan import remove_shm, sweep_job
from launchkit.jobs import records as jobs

#: the line ``Cleanups.close`` writes: the launcher ends the job itself (it did not die)
CLOSED = b'{"closed": true}'


def start(job_id: str, grace: float) -> tuple[subprocess.Popen[bytes], int]:
    """Start the reaper; returns it and the pipe's write end, which the caller must keep open
    (it is not inheritable, so the job's processes do not hold it)."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "LAUNCHKIT_JOB_ID"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "launchkit.jobs.reaper", job_id, str(grace)],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
        close_fds=True,
    )
    os.close(read_end)
    return proc, write_end


class Cleanups:
    """The launcher's end of the pipe to its reaper. ``add`` may be called from any thread (an
    engine's reader); after ``close`` it does nothing, so it never writes to a descriptor number
    that was given back (and may belong to another file by then)."""

    def __init__(self, pipe: int) -> None:
        self._pipe: int | None = pipe
        self._lock = threading.Lock()

    def add(self, argv: list[str]) -> None:
        """Tell the reaper to run ``argv`` (no shell) when the launcher is gone."""
        with self._lock:
            if self._pipe is not None:
                with contextlib.suppress(OSError):
                    os.write(self._pipe, json.dumps(argv).encode() + b"\n")

    def close(self) -> None:
        """The reaper sweeps once more and exits."""
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                os.write(pipe, CLOSED + b"\n")
            os.close(pipe)


def run_cleanups(data: bytes, timeout: float = 20.0) -> bool:
    """Run each command in ``data`` (a JSON argv a line); True when each one exited 0."""
    ok = True
    for line in data.splitlines():
        try:
            argv = json.loads(line)
        except ValueError:
            continue
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            try:
                done = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=timeout,
                    check=False,
                )
            except (OSError, subprocess.SubprocessError):
                ok = False
            else:
                ok = ok and done.returncode == 0
    return ok


def record_reaped(job_id: str, grace: float, cleaned: bool) -> jobs.JobRecord | None:
    """After a launcher died: sweep the job's ssh hosts (those its record names, ``jobs.kill``'s
    sweep), and when that and the cleanups before it (``cleaned``) all succeeded, record the time
    in the record (``reaped_at``). Nothing when there is no record, or it is no longer ``running``
    (a launcher recorded the end after all); returns the record written."""
    record = jobs.load(job_id)
    if record is None or record.state != "running":
        return None
    if (record.remote or {}).get("hosts"):
        from launchkit.jobs.kill import sweep_hosts  # (paramiko: only for a lost ssh job)

        cleaned = all(h.ok for h in sweep_hosts(record, grace, ended=False)) and cleaned
    if not cleaned:
        return None
    now = jobs.load(job_id)  # (not finished meanwhile by another launcher's kill)
    if now is None or now.state != "running":
        return None
    reaped = replace(now, reaped_at=time.time())
    jobs.save(reaped)
    return reaped


def main(argv: list[str]) -> int:
    job_id, grace = argv[0], float(argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    received = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        received += chunk
    cleaned = run_cleanups(received)
    sweep_job(job_id, grace)
    remove_shm(job_id)
    if CLOSED not in received.splitlines():  # the launcher died: say what is known of the job's end
        with contextlib.suppress(Exception):  # (an unreadable home, an ssh failure: nothing is claimed)
            record_reaped(job_id, grace, cleaned)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
