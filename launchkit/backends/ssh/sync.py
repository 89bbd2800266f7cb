"""``--sync-dst-dir``: rsync the working directory to every host in parallel, with progress.

One ``rsync -az`` per host (at most 32 at a time) over the same ssh options as the launch. Every
host ends with a result: synced, failed (with rsync's own message), timed out (``--sync-timeout``)
or could not run rsync. Any failure is fatal: a launch never starts with half-synced hosts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from launchkit.backends.ssh.options import SshOptions
from launchkit.core.spec import Host
from launchkit.errors import BackendError

_PROGRESS = re.compile(rb"^\s*([\d,]+)\s+(\d+)%")
_KEEP_ERR = 64 * 1024  # bytes of rsync's stderr kept (the first ones: the cause comes first)
DEFAULT_SYNC_TIMEOUT = 900.0  # seconds for one host's whole rsync (--sync-timeout)


# rsync(1)'s EXIT VALUES (255: ssh itself failed), for a failure rsync says nothing about: it can
# lose the receiver's own message when the far side closes first
RSYNC_CODES = {
    1: "syntax or usage error", 2: "protocol incompatibility", 3: "errors selecting input/output files, dirs",
    5: "error starting client-server protocol", 10: "error in socket I/O", 11: "error in file I/O",
    12: "error in rsync protocol data stream", 14: "error in IPC code", 20: "received SIGUSR1 or SIGINT",
    22: "error allocating core memory buffers", 23: "partial transfer due to error",
    24: "partial transfer due to vanished source files", 30: "timeout in data send/receive", 255: "ssh failed",
}  # fmt: skip


def rsync_argv(src: str, host: Host, dst: str, opts: SshOptions, excludes: Sequence[str] = ()) -> list[str]:
    """The rsync command for one host (pure). ``src`` is synced as a directory's contents."""
    target = f"{host.address}:{dst.rstrip('/')}/"
    if ":" in host.name:  # IPv6: rsync wants brackets
        target = f"{host.user + '@' if host.user else ''}[{host.name}]:{dst.rstrip('/')}/"
    argv = ["rsync", "-az", "--mkpath", "--info=progress2", "--no-inc-recursive"]
    argv += [f"--exclude={pat}" for pat in excludes]
    argv += ["-e", shlex.join(opts.ssh_command(host)), src.rstrip("/") + "/", target]
    return argv


@dataclass
class SyncResult:
    """How one host's sync ended: ``code`` is rsync's exit code (None when it did not exit by
    itself: timed out or never ran); ``error`` what went wrong, for the user."""

    host: Host
    code: int | None
    error: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out


def rsync_message(stderr: str, total_lines: int | None = None) -> str:
    """The line of rsync's stderr that says what went wrong, with how many more there were
    (``total_lines``: all of them, when only the start of a long stderr was kept). rsync's own
    messages first (``rsync: [Receiver] mkdir ... failed: ...``), then others (ssh's ``Permission
    denied``), then the generic ones (``connection unexpectedly closed``, the closing ``rsync
    error: ... at main.c``); never ssh's ``Warning: Permanently added ...``."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]

    def rank(line: str) -> int:
        if line.startswith("rsync error:") or "connection unexpectedly closed" in line:
            return 2
        if line.startswith("Warning: Permanently added"):
            return 3
        return 0 if line.startswith("rsync:") else 1

    if not lines:
        return "it said nothing"
    cause = min(lines, key=rank)  # the first line of the best rank
    more = max(len(lines), total_lines or 0) - 1
    return cause + (f" (and {more} more line(s))" if more > 0 else "")


@dataclass
class _Kept:
    """The start of a stream (at most _KEEP_ERR bytes) and how many lines it had in all."""

    data: bytearray
    lines: int = 0


def _drain(stream: IO[bytes], keep: _Kept | None, on_line: Callable[[bytes], None] | None) -> None:
    """Read ``stream`` to its end (in its own thread, so neither pipe can fill and block rsync)."""
    buf = b""
    with contextlib.suppress(OSError, ValueError):
        while chunk := os.read(stream.fileno(), 65536):
            if keep is not None:
                keep.data += chunk[: max(0, _KEEP_ERR - len(keep.data))]
                keep.lines += chunk.count(b"\n")
            if on_line is not None:
                buf += chunk
                *parts, buf = re.split(rb"[\r\n]", buf)
                for part in parts:
                    on_line(part)


class Running:
    """The rsyncs under way, each in its own session (so that a timeout ends its ssh too): the
    terminal's Ctrl-C does not reach them, so ``kill_all`` ends them when the launcher stops."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen[bytes]] = set()
        self.stopped = False

    def start(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        with self.lock:
            if self.stopped:
                raise InterruptedError("the launch is stopping")
            proc = subprocess.Popen(
                dies_with_launcher(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.procs.add(proc)
            return proc

    def done(self, proc: subprocess.Popen[bytes]) -> None:
        with self.lock:
            self.procs.discard(proc)

    def kill_all(self) -> None:
        with self.lock:
            self.stopped = True
            for proc in self.procs:
                _kill_group(proc)


def dies_with_launcher(argv: Sequence[str]) -> list[str]:
    """``argv`` under ``setpriv --pdeathsig KILL`` (util-linux) where there is one: the kernel kills it
    when the thread that started it ends, so a launcher killed by SIGKILL (before its reaper runs,
    which starts with the job) leaves no rsync copying on. Raises FileNotFoundError for a missing
    ``argv[0]`` itself, as running it would."""
    program = shutil.which(argv[0])
    if program is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv)
    guard = [setpriv, "--pdeathsig", "KILL", "--"]
    out = [*guard, program, *argv[1:]]
    if "-e" in out:  # its ssh too, when rsync itself ends (rsync splits -e's words as a shell would)
        at = out.index("-e") + 1
        out[at] = f"{shlex.join(guard)} {out[at]}"
    return out


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_rsync(
    argv: Sequence[str], timeout: float, on_percent: Callable[[int], None], running: Running | None = None
) -> tuple[int | None, str, bool]:
    """Run one rsync to its end or ``timeout`` (then its whole process group, ssh included, is
    killed). Returns (exit code or None, what rsync said, timed out); raises OSError if it cannot
    start."""
    running = running or Running()
    proc = running.start(argv)
    try:
        return _follow(proc, timeout, on_percent)
    finally:
        running.done(proc)


def _follow(
    proc: subprocess.Popen[bytes], timeout: float, on_percent: Callable[[int], None]
) -> tuple[int | None, str, bool]:
    assert proc.stdout is not None and proc.stderr is not None
    err = _Kept(bytearray())

    def progress_line(line: bytes) -> None:
        m = _PROGRESS.match(line)
        if m:
            with contextlib.suppress(Exception):  # the bar is cosmetic: keep draining the pipe
                on_percent(int(m.group(2)))

    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, None, progress_line), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err, None), daemon=True),
    ]
    for t in readers:
        t.start()
    timed_out = False
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out, code = True, None
        _kill_group(proc)
        proc.wait()
    for t in readers:
        t.join(5.0)  # a child that kept the pipes open (outside the group) must not hold us
    proc.stdout.close()
    proc.stderr.close()
    return code, rsync_message(bytes(err.data).decode(errors="replace"), err.lines), timed_out


def sync_one(
    argv: Sequence[str],
    host: Host,
    timeout: float,
    on_percent: Callable[[int], None],
    running: Running | None = None,
) -> SyncResult:
    """One host's sync; always a result, never an exception."""
    try:
        code, err, timed_out = run_rsync(argv, timeout, on_percent, running)
    except FileNotFoundError:
        return SyncResult(host, None, "rsync is not installed on this machine (needed for --sync-dst-dir)")
    except OSError as exc:
        return SyncResult(host, None, f"cannot run {argv[0]}: {exc.strerror or exc}")
    except Exception as exc:  # every host must end with a result
        return SyncResult(host, None, f"rsync failed: {type(exc).__name__}: {exc}")
    if timed_out:
        return SyncResult(host, None, f"timed out after {timeout:g} s (--sync-timeout)", timed_out=True)
    if code != 0:
        meaning = f" ({RSYNC_CODES[code]})" if code in RSYNC_CODES else ""
        return SyncResult(host, code, f"rsync exited with code {code}{meaning}: {err}")
    return SyncResult(host, 0)


def sync_all(
    hosts: Sequence[Host],
    src: str,
    dst: str,
    opts: SshOptions,
    excludes: Sequence[str],
    console: Console,
    timeout: float = DEFAULT_SYNC_TIMEOUT,
) -> list[SyncResult]:
    """rsync ``src`` to ``dst`` on every host in parallel (at most MAX_PARALLEL at a time), each
    within ``timeout`` seconds; raises BackendError naming every host that failed. Interrupted
    (Ctrl-C), it ends every rsync under way before it raises."""
    from launchkit.backends.ssh.connection import on_each  # fabric: only when a sync runs

    running = Running()
    with Progress(
        TextColumn("sync {task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:

        def one(host: Host) -> SyncResult:
            try:
                bar = progress.add_task(str(host), total=100)
                res = sync_one(
                    rsync_argv(src, host, dst, opts, excludes),
                    host,
                    timeout,
                    lambda pct: progress.update(bar, completed=pct),
                    running,
                )
                if res.ok:
                    progress.update(bar, completed=100)
                return res
            except Exception as exc:  # every host must end with a result
                return SyncResult(host, None, f"{type(exc).__name__}: {exc}")

        results = _interruptible(lambda: on_each(one, hosts), running)
    failed = [r for r in results if not r.ok]
    if failed:
        lines = "; ".join(f"{r.host}: {r.error}" for r in failed)
        raise BackendError(
            "ssh", f"sync to {len(failed)} of {len(hosts)} host(s) failed, nothing started: {lines}"
        )
    return results


_FATAL_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _ending_rsyncs_on(signals: Sequence[int], running: Running) -> Iterator[None]:
    """While the sync runs: SIGTERM or SIGHUP (a closed terminal, which no longer reaches the
    rsyncs in their own sessions) first ends every rsync, then acts as it would have."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) or signal.SIG_DFL for sig in signals}  # None: set outside Python
    # a signal ignored when the launcher started (nohup: SIGHUP) stays ignored, the rsyncs go on
    previous = {sig: old for sig, old in previous.items() if old is not signal.SIG_IGN}

    def handler(sig: int, frame: object) -> None:
        running.kill_all()
        signal.signal(sig, previous[sig])
        os.kill(os.getpid(), sig)

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _interruptible(fn: Callable[[], list[SyncResult]], running: Running) -> list[SyncResult]:
    """``fn()`` in a thread, the calling (main) thread waiting where Ctrl-C can reach it: then
    every rsync is killed, so that the hosts' threads end now rather than at their timeout."""
    box: list[list[SyncResult]] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=target, name="launchkit-sync", daemon=True)
    worker.start()
    try:
        with _ending_rsyncs_on(_FATAL_SIGNALS, running):
            while worker.is_alive():
                worker.join(0.2)
    except BaseException:
        running.kill_all()
        worker.join(10.0)
        raise
    if failure:
        raise failure[0]
    return box[0]


def source_dir() -> str:
    return str(Path.cwd())
