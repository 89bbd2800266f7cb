"""A host cut off while its process writes a lot, on one namespace host over ssh: the output fills
the ssh channel toward the launcher (which no longer acknowledges anything) and every write of the
host's watchdog then waits for good. The launcher's silence must still end the job there: the
process ends, and so does the watchdog (docs/ssh.md, "Nothing outlives the job")."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.launchkit.procs import LAUNCHKIT, wait_for_job, wait_until

# Once the flag file exists (after the cut), 64 KiB at a time to stdout and stderr, for good.
CHATTY = """
import os, sys, time
flag = sys.argv[1]
print("ready", flush=True)
while not os.path.exists(flag):
    time.sleep(0.05)
block = b"x" * 65535 + b"\\n"
while True:
    sys.stdout.buffer.write(block)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(block)
    sys.stderr.buffer.flush()
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory that the test and the host both see (the host's /tmp and /root are private)."""
    d = Path(f"/var/tmp/launchkit-test-cutoff-{secrets.token_hex(4)}")
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def left_on(host, job_id: str) -> list[str]:
    """The job's processes on ``host`` (by job id), and a launchkit watchdog, seen from inside it."""
    found = [f"pid {p}" for p in host.pids_with_env(f"LAUNCHKIT_JOB_ID={job_id}")]
    ps = host.run(["ps", "-wweo", "pid=,args="]).stdout
    return found + [line.strip()[:80] for line in ps.splitlines() if "launchkit.hostside.watchdog" in line]


@pytest.mark.timeout(180)
def test_a_chatty_host_cut_off_ends_its_processes_and_its_watchdog(
    netns_hosts,  # noqa: F811
    shared_dir: Path,
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    group = netns_hosts(1)
    host = group[0]
    hostfile = group.write_hostfile(tmp_path / "hosts")
    flag = shared_dir / "flood"
    args = ["launch", "--launcher", "ssh", "-H", str(hostfile), "-i", str(group.identity)]
    args += ["--known-hosts", str(group.known_hosts), "--heartbeat-timeout", "2", "--grace-period", "1"]
    args += ["--no-dashboard", "-n", "1", "-s", "0", "/usr/bin/python3", "-c", CHATTY, str(flag)]
    with open(tmp_path / "stdout", "wb") as out, open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen(LAUNCHKIT + args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd="/")
        try:
            job = wait_for_job(launchkit_home, timeout=60)
            started = wait_until(lambda: b"ready" in (tmp_path / "stdout").read_bytes(), 60)
            assert started, (tmp_path / "stderr").read_text()[-3000:]
            assert host.pids_with_env(f"LAUNCHKIT_JOB_ID={job}")
            subprocess.run(["ip", "link", "set", host.veth, "down"], check=True)
            flag.write_text("")  # the flood starts once nothing reaches the launcher any more
            code = proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.wait()
    said = (tmp_path / "stderr").read_bytes().decode(errors="replace")[-3000:]
    assert code == 255, said
    assert f"host {host.hostfile_line()} stopped answering" in said, said
    # the host, cut off: its watchdog heard no launcher for 2 s and, though its channel takes no
    # more output, ended the process and then itself
    assert wait_until(lambda: not left_on(host, job), 30, 0.5), left_on(host, job)
