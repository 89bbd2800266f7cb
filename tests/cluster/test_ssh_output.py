"""Over ssh, a slow reader of launchkit's own output slows the output and never kills the job:
launchkit's stdout is a pipe nobody reads for three times the heartbeat timeout, then is read.
The host must not be declared lost, nothing may be lost, and one process's flood on a host must
not hold up another process's line on the same host."""

from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

from tests.launchkit.procs import LAUNCHKIT

HB_TIMEOUT = 2.0

# worker 0 floods until the file `stop` exists, numbering its lines; after its first 10000 lines it
# creates `flooded`. worker 1 waits for `flooded` (so that its line comes while everything is
# full of worker 0's output), prints one line and exits.
PROG = textwrap.dedent(
    """
    import os, sys, time
    rank, d = os.environ["LAUNCHKIT_ROLE_RANK"], sys.argv[1]
    if os.environ["DMLC_ROLE"] != "worker":
        sys.exit(0)
    if rank == "0":
        out = sys.stdout.buffer
        i = 0
        while not os.path.exists(os.path.join(d, "stop")):
            out.write(b"".join(b"flood %09d %s\\n" % (i + k, b"x" * 50) for k in range(100)))
            out.flush()
            i += 100
            if i == 10000:
                open(os.path.join(d, "flooded"), "w").close()
        print(f"flood done {i}", flush=True)
    else:
        while not os.path.exists(os.path.join(d, "flooded")):
            time.sleep(0.01)
        print("worker 1 was heard", flush=True)
    """
)


def test_a_stalled_reader_slows_the_output_and_the_job_survives(sshd_loopback, tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROG)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(sshd_loopback.hostfile_line() + "\n")
    args = [
        "launch",
        "-H",
        str(hostfile),
        "-i",
        str(sshd_loopback.identity),
        "--known-hosts",
        str(tmp_path / "known_hosts"),
        "--heartbeat-timeout",
        str(HB_TIMEOUT),
        "-n",
        "2",
        "-s",
        "0",
        "python3",
        str(tmp_path / "prog.py"),
        str(tmp_path),
    ]
    err = open(tmp_path / "stderr", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        LAUNCHKIT + args,
        stdout=subprocess.PIPE,
        stderr=err,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        # nobody reads launchkit's stdout for three heartbeat timeouts, once the flood is on
        deadline = time.monotonic() + 60
        while not (tmp_path / "flooded").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "flooded").exists(), (tmp_path / "stderr").read_text()[-3000:]
        time.sleep(3 * HB_TIMEOUT)
        # then read: worker 1's line must come while worker 0 still floods (`stop` not there yet)
        flood: list[bytes] = []
        for line in proc.stdout:
            if line == b"[worker 1] worker 1 was heard\n":
                (tmp_path / "stop").touch()
                break
            assert line.startswith(b"[worker 0] flood "), line[:200]
            flood.append(line)
        else:
            raise AssertionError("worker 1's line never came: " + (tmp_path / "stderr").read_text()[-3000:])
        rest = proc.stdout.read().splitlines(keepends=True)
        assert proc.wait(timeout=60) == 0, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    assert "stopped answering" not in (tmp_path / "stderr").read_text()
    flood += [line for line in rest if line != b"[worker 1] worker 1 was heard\n"]
    done = flood.pop()
    total = int(done.split()[-1])
    assert done == b"[worker 0] flood done %d\n" % total
    assert total > 10000
    assert flood == [b"[worker 0] flood %09d %s\n" % (i, b"x" * 50) for i in range(total)]
