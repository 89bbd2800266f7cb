"""The merged output (launchkit.merger): chunks prefixed whole, partial lines carried over, order
kept per process, fairness between processes; the failure report's escaping and cutting; the
--log-dir checks (before the start, and a disk that fills up during the job)."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest
from rich.console import Console

from launchkit.backends.local import LocalBackend
from launchkit.console import OutputWriter, Ui
from launchkit.core.spec import LaunchSpec
from launchkit.merger import CHUNK, Merger, printable, widen_pipe
from launchkit.supervisor import Supervisor
from tests.launchkit.plans import make_plan
from tests.launchkit.procs import LAUNCHKIT, run

PY = sys.executable


def merge(*writes: tuple[int, bytes], streams: int = 2) -> tuple[bytes, list[deque[str]]]:
    """Feed ``writes`` (stream index, bytes) through pipes into a Merger; the merged stdout."""
    out = io.BytesIO()
    writer = OutputWriter(out, io.BytesIO())
    merger = Merger(writer)
    pipes = [os.pipe() for _ in range(streams)]
    tails: list[deque[str]] = [deque(maxlen=20) for _ in range(streams)]
    for i, (r, _) in enumerate(pipes):
        merger.add(os.fdopen(r, "rb"), "out", f"[p {i}] ".encode(), tails[i])
    merger.start()

    def feed() -> None:
        for i, data in writes:
            os.write(pipes[i][1], data)
        for _, w in pipes:
            os.close(w)

    t = threading.Thread(target=feed)
    t.start()
    assert merger.drain(30.0)
    merger.close()
    t.join()
    return out.getvalue(), tails


def test_lines_are_prefixed_whole_and_partial_lines_carried_over() -> None:
    out, tails = merge((0, b"one\ntw"), (1, b"x"), (0, b"o\nthr"), (1, b"y\n"), (0, b"ee"))
    lines = out.splitlines()
    assert sorted(lines) == [b"[p 0] one", b"[p 0] three", b"[p 0] two", b"[p 1] xy"]
    assert [x for x in lines if x.startswith(b"[p 0]")] == [b"[p 0] one", b"[p 0] two", b"[p 0] three"]
    assert out.endswith(b"\n")  # the unfinished last line got its newline at the end of the stream
    assert list(tails[0]) == ["one", "two", "three"] and list(tails[1]) == ["xy"]


def test_bytes_are_exact_and_in_order_per_process() -> None:
    blob = bytes(range(256)).replace(b"\n", b"") * 50
    writes = []
    for n in range(400):
        writes.append((n % 2, b"%d:" % n + blob[: n * 7 % 5000] + b"\r\x1b[0m\n"))
    out, _ = merge(*writes)
    for i in (0, 1):
        got = [
            line[len(b"[p 0] ") :] + b"\n"
            for line in out.split(b"\n")[:-1]
            if line.startswith(b"[p %d] " % i)
        ]
        assert got == [data for j, data in writes if j == i]


def test_a_flood_does_not_starve_another_process() -> None:
    """Stream 0 has a full 1 MiB pipe (and more coming); stream 1 one line: that line is out
    within the first two turns, not after the flood."""
    out = io.BytesIO()
    merger = Merger(OutputWriter(out, io.BytesIO()))
    r0, w0 = os.pipe()
    r1, w1 = os.pipe()
    widen_pipe(w0)
    os.set_blocking(w0, False)
    line = b"x" * 99 + b"\n"
    sent = 0
    try:
        while True:
            sent += os.write(w0, line * 64)
    except BlockingIOError:
        pass
    assert sent >= 4 * CHUNK
    os.write(w1, b"hello\n")
    merger.add(os.fdopen(r0, "rb"), "out", b"[flood] ", deque())
    merger.add(os.fdopen(r1, "rb"), "out", b"[quiet] ", deque())
    merger.start()
    for w in (w0, w1):
        os.close(w)
    assert merger.drain(30.0)
    merger.close()
    merged = out.getvalue()
    assert merged.count(b"[flood] ") == sent // len(line)
    assert merged.index(b"[quiet] hello\n") < 2 * (CHUNK + CHUNK // 100 * len(b"[flood] "))


def test_report_lines_are_escaped_and_cut() -> None:
    assert printable("loss \x1b[31m0.5\x1b[0m\tok\x00") == "loss \\x1b[31m0.5\\x1b[0m\\tok\\x00"
    long = printable("y" * 10_000_000)
    assert long.startswith("y" * 300) and long.endswith("[10000000 characters in all]") and len(long) < 400
    err = io.StringIO()
    Ui(Console(file=io.StringIO()), Console(file=err, width=100_000)).lines(["a\x1b[2Jb" + "z" * 5000])
    assert "\x1b" not in err.getvalue() and "a\\x1b[2Jb" in err.getvalue() and len(err.getvalue()) < 500


def test_failure_report_of_a_huge_binary_last_line(tmp_path: Path) -> None:
    """A process that fails after printing a 10 MB line of control bytes: the merged output is
    byte-exact, the report's tail is cut and escaped."""
    code = "import sys; sys.stdout.buffer.write(b'\\x1b[2J\\x07' * 3_400_000 + b'\\n'); sys.stdout.flush(); sys.exit(3)"
    spec = LaunchSpec(num_workers=1, num_servers=0, command=(PY, "-c", code), cwd=str(tmp_path))
    plan = make_plan(spec, job_id="t-tail", secret="s", root_uri="127.0.0.1", root_port=1)
    plan = dataclasses.replace(plan, tasks=tuple(t for t in plan.tasks if t.role == "worker"))
    out = io.BytesIO()
    ui = Ui(Console(file=io.StringIO()), Console(file=io.StringIO()))
    result = Supervisor(plan, LocalBackend(), ui, writer=OutputWriter(out, io.BytesIO()), grace=1).run()
    assert result.exit_code == 3 and result.root_cause is not None
    assert out.getvalue() == b"[worker 0] " + b"\x1b[2J\x07" * 3_400_000 + b"\n"
    (tail,) = result.root_cause.tail
    assert len(tail) < 400 and "\x1b" not in tail and "\x07" not in tail
    assert tail.startswith("\\x1b[2J\\x07") and tail.endswith("[17000000 bytes in all]")


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 64 KiB tmpfs (as root), unmounted after the test."""
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_read_only_log_dir_stops_the_launch_before_the_start(small_tmpfs: Path, tmp_path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    marker = tmp_path / "started"
    res = run(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--launcher",
            "local",
            "--log-dir",
            str(small_tmpfs / "logs"),
            "touch",
            str(marker),
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr
    assert f"--log-dir {small_tmpfs / 'logs'}: cannot write there" in " ".join(res.stderr.split())
    assert "internal error" not in res.stderr
    assert not marker.exists()


def test_disk_full_during_the_job_is_reported_once_and_the_output_goes_on(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    code = "for i in range(50000): print(f'line {i:06d} ' + 'x' * 40)"
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "0",
            "--launcher",
            "local",
            "--log-dir",
            str(small_tmpfs),
            PY,
            "-c",
            code,
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 74, res.stderr[-3000:]
    for rank in (0, 1):
        lines = [x for x in res.stdout.splitlines() if x.startswith(f"[worker {rank}] ")]
        assert lines == [f"[worker {rank}] line {i:06d} " + "x" * 40 for i in range(50000)]
    stderr = " ".join(res.stderr.split())
    assert stderr.count(f"cannot write to --log-dir {small_tmpfs}: No space left on device") == 1
    assert "its --log-dir files" in stderr and "are incomplete" in stderr and "exit 74" in stderr


def test_closing_takes_what_a_stream_still_open_already_holds() -> None:
    """A stream that never ends (a grandchild holds its pipe): when reading stops (the drain's
    bound passed), what was already written is merged, and the close does not wait for more."""
    out = io.BytesIO()
    merger = Merger(OutputWriter(out, io.BytesIO()))
    r, w = os.pipe()
    merger.add(os.fdopen(r, "rb"), "out", b"[g] ", deque())  # not started: nothing read yet
    os.write(w, b"written before the end\npartial")
    t0 = time.monotonic()
    merger.close()
    assert time.monotonic() - t0 < 2.0
    os.close(w)
    assert out.getvalue().splitlines() == [b"[g] written before the end", b"[g] partial"]


def test_a_stream_epoll_cannot_watch_is_merged_too(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"from a file\nno newline")
    out = io.BytesIO()
    merger = Merger(OutputWriter(out, io.BytesIO()))
    merger.add(open(f, "rb"), "out", b"[f] ", deque())  # noqa: SIM115 (the merger closes it)
    merger.add(io.BytesIO(b"in memory\n"), "out", b"[m] ", deque())
    merger.start()
    assert merger.drain(30.0)
    merger.close()
    assert sorted(out.getvalue().splitlines()) == [b"[f] from a file", b"[f] no newline", b"[m] in memory"]


def test_a_stalled_reader_of_the_output_loses_nothing_after_the_job_ends(tmp_path: Path) -> None:
    """launchkit's stdout is a pipe nobody reads until well after the job ended (twice the 2 s
    bound for streams that never end): the launcher waits for its reader, and every line comes."""
    code = "for i in range(3000): print(f'line {i:06d} ' + 'z' * 40)"
    err = open(tmp_path / "stderr", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*LAUNCHKIT, "launch", "-n", "2", "-s", "0", "--launcher", "local", PY, "-c", code],
        stdout=subprocess.PIPE,
        stderr=err,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        time.sleep(4.0)  # the job prints 300 KB and ends; nobody reads
        out = proc.stdout.read()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    lines = out.decode().splitlines()
    for who in ("worker 0", "worker 1"):
        assert [x for x in lines if x.startswith(f"[{who}] ")] == [
            f"[{who}] line {i:06d} " + "z" * 40 for i in range(3000)
        ]
    assert len(lines) == 6000


class SlowClose:
    """A ``Kept`` whose close takes a while (a full disk, a slow filesystem), and says when it began."""

    def __init__(self) -> None:
        self.closing = threading.Event()

    def write(self, data: bytes) -> None:
        pass

    def flush(self) -> None:
        pass

    def create(self) -> bool:
        return True

    def close(self) -> None:
        self.closing.set()
        time.sleep(0.3)


def test_a_stream_added_while_another_ends_keeps_its_output() -> None:
    """A process that ends while the next is being started: the next one's stream may get the
    descriptor number the ended one just gave back. The end of the first must not drop the
    second (its output would be lost, and the job still succeed)."""
    out = io.BytesIO()
    merger = Merger(OutputWriter(out, io.BytesIO()))
    first_r, first_w = os.pipe()
    second_r, second_w = os.pipe()  # made before the first ends: its dup takes the freed number
    kept = SlowClose()
    first = merger.add(os.fdopen(first_r, "rb"), "out", b"[first] ", deque(), kept=kept)
    merger.start()
    os.write(first_w, b"one\n")
    os.close(first_w)
    assert kept.closing.wait(10.0)  # the first stream's end is under way: its descriptor is closed
    fillers = []  # every lower free number taken, so that the next dup gets the one given back
    while (fd := os.open(os.devnull, os.O_RDONLY)) < first.fd:
        fillers.append(fd)
    os.close(fd)
    assert fd == first.fd
    second = merger.add(os.fdopen(second_r, "rb"), "out", b"[second] ", deque())
    for fd in fillers:
        os.close(fd)
    assert second.fd == first.fd  # the case in question
    os.write(second_w, b"two\n")
    os.close(second_w)
    assert merger.drain(10.0)
    merger.close()
    assert second.done.is_set()
    assert sorted(out.getvalue().splitlines()) == [b"[first] one", b"[second] two"]


def test_drain_waits_for_output_still_arriving_and_gives_up_on_silence() -> None:
    """A stream that keeps delivering (a remote process's last lines, after its exit) is waited
    for past ``timeout``; one that stays open and silent is given up after ``timeout``."""
    out = io.BytesIO()
    merger = Merger(OutputWriter(out, io.BytesIO()))
    flowing_r, flowing_w = os.pipe()
    merger.add(os.fdopen(flowing_r, "rb"), "out", b"[f] ", deque())
    merger.start()

    def trickle() -> None:  # 2 s of output, a line every 0.1 s, then the end
        for n in range(20):
            os.write(flowing_w, b"line %d\n" % n)
            time.sleep(0.1)
        os.close(flowing_w)

    t = threading.Thread(target=trickle)
    t.start()
    assert merger.drain(1.0)  # the bound is 1 s of silence, not 1 s in all
    t.join()
    assert out.getvalue().splitlines()[-1] == b"[f] line 19"

    silent_r, silent_w = os.pipe()
    merger.add(os.fdopen(silent_r, "rb"), "out", b"[s] ", deque())
    t0 = time.monotonic()
    assert not merger.drain(0.5)
    assert 0.4 < time.monotonic() - t0 < 5.0
    merger.close()
    os.close(silent_w)


def test_drain_gives_up_on_a_stream_that_never_ends_after_most() -> None:
    out = io.BytesIO()
    merger = Merger(OutputWriter(out, io.BytesIO()))
    r, w = os.pipe()
    merger.add(os.fdopen(r, "rb"), "out", b"[g] ", deque())
    merger.start()
    stop = threading.Event()

    def chatter() -> None:  # a grandchild that prints on and on
        while not stop.wait(0.05):
            os.write(w, b"still here\n")
        os.close(w)

    t = threading.Thread(target=chatter)
    t.start()
    t0 = time.monotonic()
    assert not merger.drain(1.0, most=1.5)
    assert time.monotonic() - t0 < 5.0
    merger.close()
    stop.set()
    t.join()


class SlowFlush(OutputWriter):
    """A console that takes a while to write (a slow terminal)."""

    def flush(self) -> None:
        time.sleep(0.05)
        super().flush()


def test_when_drain_says_every_stream_ended_their_lines_are_written() -> None:
    out = io.BytesIO()
    merger = Merger(SlowFlush(out, io.BytesIO()))
    pipes = [os.pipe() for _ in range(3)]
    for i, (r, _) in enumerate(pipes):
        merger.add(os.fdopen(r, "rb"), "out", b"[p %d] " % i, deque())
    merger.start()
    for i, (_, w) in enumerate(pipes):
        os.write(w, b"last words of %d" % i)  # no newline: the end gives it one
        os.close(w)
    assert merger.drain(10.0)
    # before close(): the last round's write is already done
    assert sorted(out.getvalue().splitlines()) == [b"[p %d] last words of %d" % (i, i) for i in range(3)]
    merger.close()


def test_a_log_file_that_cannot_be_opened_makes_the_job_exit_74(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "worker-1.stdout").mkdir(parents=True)  # the directory is writable, that file cannot be
    res = run(
        ["launch", "-n", "2", "-s", "0", "--launcher", "local", "--log-dir", str(logs), "echo", "hello"],
        cwd=tmp_path,
    )
    assert res.returncode == 74, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"[{p}] hello" for p in ("worker 0", "worker 1")]
    stderr = " ".join(res.stderr.split())
    assert stderr.count(f"cannot write to --log-dir {logs}") == 1 and "exit 74" in stderr
    assert "Traceback" not in res.stderr


class _StuckConsole(io.BytesIO):
    """A console whose reader never reads (a stopped pager): a write blocks until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.stuck = threading.Event()

    def write(self, data) -> int:  # type: ignore[override]
        self.stuck.set()
        self.release.wait()
        return len(data)


class _Kept:
    """The launcher's own copy of a stream (a ``Kept``), noting what it was given."""

    def __init__(self) -> None:
        self.data, self.flushed = b"", b""

    def write(self, data: bytes) -> None:
        self.data += data

    def flush(self) -> None:
        self.flushed = self.data

    def create(self) -> bool:
        return True

    def close(self) -> None:
        self.flush()


def test_a_console_that_never_reads_leaves_the_log_and_kept_files_written(tmp_path: Path) -> None:
    """The merger's thread stuck writing to the console: close gives up on it, and the process
    exits without Python's teardown (launchkit.cli.run), which had flushed the open files."""
    console = _StuckConsole()
    merger = Merger(OutputWriter(console, io.BytesIO()))
    r, w = os.pipe()
    log = open(tmp_path / "worker-0.stdout", "ab", buffering=1 << 18)  # noqa: SIM115 (the merger's)
    kept = _Kept()
    merger.add(os.fdopen(r, "rb"), "out", b"[worker 0] ", deque(maxlen=20), log, kept)
    merger.start()
    try:
        os.write(w, b"a line the console never takes\n")
        assert console.stuck.wait(10)
        merger.close()
        assert (tmp_path / "worker-0.stdout").read_bytes() == b"a line the console never takes\n"
        assert kept.flushed == b"a line the console never takes\n"
    finally:
        console.release.set()
        os.close(w)
