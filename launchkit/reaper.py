"""The reaper: a tiny process that outlives the launcher just long enough to clean up.

The launcher starts it first, in a session of its own, holding the write end of a pipe whose
read end is the reaper's stdin. The launcher never writes to it; when the launcher exits for
any reason (including SIGKILL), the kernel closes the pipe, the reaper reads EOF and ends every
process that still carries the job's id in its environment, then removes the job's
shared-memory segments. Usage: ``python -m launchkit.reaper JOB_ID GRACE_SECONDS``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from launchkit.procscan import remove_shm, sweep_job


def start(job_id: str, grace: float) -> tuple[subprocess.Popen[bytes], int]:
    """Start the reaper; returns it and the pipe's write end, which the caller must keep open
    (it is not inheritable, so the job's processes do not hold it)."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "LAUNCHKIT_JOB_ID"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "launchkit.reaper", job_id, str(grace)],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
        close_fds=True,
    )
    os.close(read_end)
    return proc, write_end


def main(argv: list[str]) -> int:
    job_id, grace = argv[0], float(argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    sweep_job(job_id, grace)
    remove_shm(job_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
