"""A launchkit job under fault injection: the real launcher as a child process, its output read
live, the job's processes found by their environment (never through launchkit's own code), and
the checks every case ends with (nothing of the job left running, no shared-memory segment)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.launchkit.procs import LAUNCHKIT, pids_with_job, wait_until

ROOT = Path(__file__).resolve().parents[2]
TRAINPROG = str(Path(__file__).with_name("trainprog.py"))
# ps-lite's liveness knobs, short: a stopped node is noticed within about 2 s
FAST_LIVENESS = ["--env", "PS_HEARTBEAT_INTERVAL:0.5", "--env", "PS_HEARTBEAT_TIMEOUT:2"]


def node_pids(job_id: str, role: str, rank: int | None = None) -> list[int]:
    """Live processes of ``job_id`` that run ``role`` (rank ``rank`` when given): the program
    the launcher started, not a child of it, since both carry the same environment."""
    want = {f"LAUNCHKIT_JOB_ID={job_id}".encode(), f"DMLC_ROLE={role}".encode()}
    if rank is not None:
        want.add(f"LAUNCHKIT_ROLE_RANK={rank}".encode())
    found = []
    for pid in pids_with_job(job_id):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
            ppid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            parent_env = set(Path(f"/proc/{ppid}/environ").read_bytes().split(b"\0"))
        except (OSError, ValueError):
            continue
        if want <= env and not want <= parent_env:
            found.append(pid)
    return found


def shm_segments(job_id: str, shm_dir: Path = Path("/dev/shm")) -> list[str]:
    return sorted(p.name for p in shm_dir.glob(f"launchkit-{job_id}-*"))


class Job:
    """``launchkit ARGS`` running in its own session; ``out`` is stdout and stderr as read so far."""

    def __init__(self, args: Sequence[str], home: Path, cwd: Path | None = None) -> None:
        self.home = home
        self.proc = subprocess.Popen(
            [*LAUNCHKIT, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.started = time.monotonic()
        self.fault_at: float | None = None
        self._job_id: str | None = None
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self._lines)

    def wait_for(self, text: str, timeout: float = 20) -> None:
        """Wait until ``text`` appears in the output (fails with the output so far)."""
        ok = wait_until(lambda: text in self.out or self.proc.poll() is not None, timeout)
        assert ok and text in self.out, f"{text!r} not seen within {timeout} s:\n{self.out[-4000:]}"

    @property
    def job_id(self) -> str:
        """The job's id, from its record (written as the launch begins)."""
        if self._job_id is None:
            jobs = self.home / "jobs"
            wait_until(lambda: any(jobs.glob("*.json")), 10)
            ids = sorted(p.stem for p in jobs.glob("*.json"))
            assert ids, f"no job record:\n{self.out[-2000:]}"
            self._job_id = ids[-1]
        return self._job_id

    def pid(self, role: str, rank: int = 0, timeout: float = 10) -> int:
        found: list[int] = []

        def look() -> bool:
            found[:] = node_pids(self.job_id, role, rank)
            return len(found) == 1

        assert wait_until(look, timeout), f"{role} {rank} of {self.job_id}: {found}\n{self.out[-2000:]}"
        return found[0]

    def inject(self, pid: int, sig: int) -> None:
        """Send ``sig`` to ``pid`` and start the clock the case is measured by."""
        os.kill(pid, sig)
        self.fault_at = time.monotonic()

    def finish(self, timeout: float = 30) -> tuple[int, float]:
        """The launcher's exit code and the seconds from the fault (or the start) to its exit; a
        launcher still running after ``timeout`` seconds fails the case, its whole session killed."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"the launcher hung for {timeout} s:\n{self.out[-4000:]}") from None
        elapsed = time.monotonic() - (self.fault_at or self.started)
        self._reader.join(5)
        return code, elapsed


def assert_nothing_left(job_id: str, timeout: float = 10) -> None:
    """No process of the job on this machine (all PID namespaces), no /dev/shm segment of it."""
    assert wait_until(lambda: not pids_with_job(job_id), timeout), (
        f"processes of {job_id} left: {[_cmdline(p) for p in pids_with_job(job_id)]}"
    )
    assert not shm_segments(job_id), shm_segments(job_id)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"pid {pid} (gone)"


def launch_args(*extra: str, workers: int = 2, servers: int = 1) -> list[str]:
    return [
        "launch",
        "-n",
        str(workers),
        "-s",
        str(servers),
        "--launcher",
        "local",
        "--grace-period",
        "1",
        *FAST_LIVENESS,
        *extra,
    ]


def trainer(*args: str) -> list[str]:
    return [sys.executable, TRAINPROG, *args]


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) mounted at ``path`` for the block: a disk that fills
    up. Needs root, as the namespace hosts do; fails the test with the reason otherwise."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "lkfull", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs at {path} (needs root): {res.stderr.strip()}", pytrace=False)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
