"""The remote watchdog cut off from its launcher while its channel takes nothing more: what a cut
link does to a host whose processes write (the ssh window and the pipe to sshd fill up, and every
write of the watchdog then waits). The launcher's silence still ends the job there, and the
watchdog itself ends. Driven over pipes as the launcher drives it over ssh (``test_remote.Dog``)."""

from __future__ import annotations

import sys

from launchkit.backends.ssh.agent import WINDOW
from tests.launchkit.procs import pids_with_job, wait_until
from tests.launchkit.test_remote import Dog

CHATTY = "import sys\nwhile True:\n    sys.stdout.write('x' * 4095 + '\\n')\n"


def test_silence_ends_the_job_while_output_jams_the_channel() -> None:
    job = "wd-test-jam"
    dog = Dog(job, hb_timeout=1.0, window=WINDOW)
    try:
        dog.until("ready")
        proc = {"id": 0, "argv": [sys.executable, "-c", CHATTY], "env": {"LAUNCHKIT_JOB_ID": job}, "cwd": "/"}
        dog.send({"op": "spawns", "procs": [proc]})
        dog.until("started", id=0)
        assert pids_with_job(job)
        # from here nothing is read from the watchdog (its writes wait on a full pipe) and nothing
        # is sent to it (no heartbeat): its process ends, and so does the watchdog
        assert wait_until(lambda: not pids_with_job(job), 20), pids_with_job(job)
        assert dog.p.wait(timeout=20) == 0
    finally:
        dog.p.kill()
        dog.p.wait()
