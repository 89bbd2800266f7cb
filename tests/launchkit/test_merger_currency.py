"""The files the merger writes (``--log-dir`` and the kept output that ``launchkit logs`` reads)
stay current within about a second of the console whatever the line rate, and a launcher killed
outright (SIGKILL) loses at most the last second of them (docs/launch.md, "Output files")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from launchkit.console import OutputWriter
from launchkit.jobs import keptoutput
from launchkit.merger import LOG_BUFFER, Merger
from tests.launchkit.procs import LAUNCHKIT, pids_with_job, run, wait_for_job, wait_until

BOUND = 1.0  # what docs/launch.md promises
SLACK = 1.5  # on top of it, for a loaded 2-core test machine (measured lag: ~0.25 s)


def last_number(path: Path) -> int:
    """The number on the last complete line of ``path`` (-1 when it has none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            data = f.read()
    except FileNotFoundError:
        return -1
    lines = data[: data.rfind(b"\n")].rsplit(b"\n", 1)
    try:
        return int(lines[-1].split()[-1])
    except (ValueError, IndexError):
        return -1


@pytest.mark.parametrize("every", [0.1, 0.02, 0.001, 0.0], ids=["0.1s", "0.02s", "1ms", "flood"])
def test_the_files_stay_current_whatever_the_line_rate(every: float, tmp_path: Path, launchkit_home) -> None:
    keeper = keptoutput.Keeper("lk-currency", lambda message: pytest.fail(message))
    kept = keeper.open("worker", 0, "out")
    assert kept is not None
    log_path = tmp_path / "worker-0.stdout"
    with open(os.devnull, "wb") as null:
        merger = Merger(OutputWriter(null, null))
        r, w = os.pipe()
        log = open(log_path, "ab", buffering=LOG_BUFFER)  # noqa: SIM115 (as the supervisor opens it)
        merger.add(os.fdopen(r, "rb"), "out", b"[worker 0] ", deque(maxlen=20), log, kept)
        merger.start()
        printed = -1
        stop = threading.Event()

        def writer() -> None:
            nonlocal printed
            i = 0
            while not stop.is_set():
                burst = 200 if every == 0.0 else 1
                os.write(w, b"".join(b"line %d\n" % n for n in range(i, i + burst)))
                printed = i + burst - 1
                i += burst
                if every:
                    time.sleep(every)
            os.close(w)

        t = threading.Thread(target=writer)
        t.start()
        lags = []
        try:
            assert wait_until(lambda: printed >= 0, 5)
            for _ in range(3):  # the files keep up with a writer that goes on
                n, since = printed, time.monotonic()
                for p in (kept.path, log_path):
                    assert wait_until(lambda p=p, n=n: last_number(p) >= n, BOUND + SLACK, 0.01), (
                        f"{p.name} still at line {last_number(p)} {time.monotonic() - since:.1f} s "
                        f"after line {n} was written"
                    )
                lags.append(time.monotonic() - since)
        finally:
            stop.set()
            t.join()
            assert merger.drain(10.0)
            merger.close()
        print(f"every {every}: lags {[round(x, 3) for x in lags]}")


SLOW = "import time\nfor i in range(10**6): print(i, flush=True); time.sleep({every})"


def launch(args: list[str], every: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *LAUNCHKIT,
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--launcher",
            "local",
            "--no-dashboard",
            *args,
            "--",
            sys.executable,
            "-u",
            "-c",
            SLOW.format(every=every),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


class Console:
    """The launcher's console (stdout), read line by line with the time each line came."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("[worker 0] "):
                self.lines.append((time.monotonic(), int(line.split()[-1])))

    def last(self, before: float | None = None) -> int:
        seen = [n for at, n in self.lines if before is None or at <= before]
        return seen[-1] if seen else -1


def end_job(proc: subprocess.Popen[str], job: str | None) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=15)
    if job is not None:
        for pid in pids_with_job(job):
            os.kill(pid, signal.SIGKILL)


def test_logs_and_the_log_dir_keep_up_with_a_slow_job(launchkit_home, tmp_path: Path) -> None:
    proc = launch(["--log-dir", str(tmp_path)], every=0.1)
    console, job = Console(proc), None
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: console.last() >= 5, 15)
        for _ in range(2):
            n = console.last()

            def kept_shows_it(n: int = n) -> bool:
                res = run(["logs", job, "--role", "worker", "--tail", "1"])
                return (
                    res.returncode == 0
                    and res.stdout.startswith("[worker 0] ")
                    and int(res.stdout.split()[-1]) >= n
                )

            assert wait_until(kept_shows_it, BOUND + SLACK + 2, 0.1)
            assert wait_until(lambda n=n: last_number(tmp_path / "worker-0.stdout") >= n, BOUND + SLACK, 0.01)
    finally:
        end_job(proc, job)


def test_a_launcher_killed_outright_loses_at_most_the_last_second(launchkit_home, tmp_path: Path) -> None:
    proc = launch(["--log-dir", str(tmp_path)], every=0.02)
    console, job = Console(proc), None
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: console.last() >= 150, 20)  # 3 s of output at least
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        # every line the console showed a second before the kill is in both files
        n = console.last(before=killed_at - BOUND)
        assert n >= 0
        kept = {k.stream: k.paths[-1] for k in keptoutput.kept(job) if k.role == "worker"}
        assert last_number(kept["stdout"]) >= n, (last_number(kept["stdout"]), n, console.last())
        assert last_number(tmp_path / "worker-0.stdout") >= n
    finally:
        end_job(proc, job)
