"""The reaper: a tiny process that outlives the launcher just long enough to clean up.

The launcher starts it first, in a session of its own, holding the write end of a pipe whose
read end is the reaper's stdin. When the launcher exits for any reason (including SIGKILL), the
kernel closes the pipe, the reaper reads EOF, runs the cleanup commands the launcher sent it
(``Cleanups.add``: e.g. ``scancel JOB`` for a job a cluster engine runs), ends every process that
still carries the job's id in its environment, then removes the job's shared-memory segments.
A launcher that ends its job itself says so first (``Cleanups.close``); when it died instead
(the pipe ended without that word) and its record still says ``running``, the reaper also sweeps
the job's ssh hosts and, when every step is known to have succeeded (each cleanup command exited
0, each host's sweep answered, the engine's cancel of its job ran), records when (``reaped_at``):
``ps`` then shows the lost job as ``ended (lost)`` on those backends too.
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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from launchkit.hostside.procscan import remove_shm, sweep_job

if TYPE_CHECKING:
    from launchkit.jobs.records import JobRecord

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

    def add(self, argv: list[str], *, ends_job: bool = False) -> None:
        """Tell the reaper to run ``argv`` (no shell) when the launcher is gone; ``ends_job``: it
        ends the job's processes where they run (an engine's cancel: a line ``{"ends_job": argv}``)."""
        line = json.dumps({"ends_job": argv} if ends_job else argv).encode() + b"\n"
        with self._lock:
            if self._pipe is not None:
                with contextlib.suppress(OSError):
                    os.write(self._pipe, line)

    def close(self) -> None:
        """The reaper sweeps once more and exits."""
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                os.write(pipe, CLOSED + b"\n")
            os.close(pipe)


@dataclass(frozen=True)
class Cleaned:
    """What the cleanup commands did: ``ok``, each one ran and exited 0; ``ended_job``, one of
    them was the engine's own end of the job (``Cleanups.add(..., ends_job=True)``)."""

    ok: bool = True
    ended_job: bool = False


def run_cleanups(data: bytes, timeout: float = 20.0) -> Cleaned:
    """Run each command in ``data`` (a JSON argv a line, or ``{"ends_job": argv}``)."""
    ok, ended = True, False
    for line in data.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        ends = isinstance(item, dict) and "ends_job" in item
        argv = item.get("ends_job") if isinstance(item, dict) else item
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
                ended = ended or (ends and done.returncode == 0)
    return Cleaned(ok, ended)


def record_reaped(job_id: str, grace: float, cleaned: Cleaned) -> JobRecord | None:
    """After a launcher died, with this machine swept: record the time in the job's record
    (``reaped_at``) when the end of every process of it is known, by its backend: an ssh job's
    hosts each answered the sweep the reaper asks of them (``jobs.kill``'s, as ``launchkit kill``
    does), a job whose processes all ran here needs nothing more, and an engine's job needs the
    engine's own end of it (its cancel) to have succeeded; in every case each cleanup command
    must have exited 0. Nothing when there is no record, or it is no longer ``running`` (a
    launcher recorded the end after all), or an end is not known (an mpirun's remote ranks,
    which Open MPI's daemons end; an engine job whose id the launcher never learned); returns
    the record written. (Its imports are here: the reaper starts with each attempt, beside the
    launch, and needs them only after a launcher died.)"""
    from launchkit import backends
    from launchkit.jobs import records as jobs

    record = jobs.load(job_id)
    if record is None or record.state != "running" or not cleaned.ok:
        return None
    if (record.remote or {}).get("hosts"):
        from launchkit.jobs.kill import sweep_hosts  # (paramiko: only for a lost ssh job)

        known = all(h.ok for h in sweep_hosts(record, grace, ended=False))
    else:
        known = cleaned.ended_job or (
            record.backend in backends.names() and backends.capabilities(record.backend).here
        )
    now = jobs.load(job_id)  # (not finished meanwhile by another launcher's kill)
    if not known or now is None or now.state != "running":
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
