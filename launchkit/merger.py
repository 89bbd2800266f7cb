"""The merged output of a job: one thread reads every process's stdout and stderr in large
chunks and writes them, prefixed, with few system calls.

- each read takes at most ``CHUNK`` bytes from one stream, and streams are served in turn, so
  one process's flood never starves another's lines;
- a chunk is split at its last newline: the complete lines are prefixed at once (``bytes.replace``
  on ``b"\\n"``) and the partial last line is carried over until its newline arrives (or the
  stream ends, when it gets one), so lines of different processes never mix and each process's
  bytes keep their order;
- everything read in one round goes out in one write per target (stdout, stderr);
- ``--log-dir`` files and the kept output (``launchkit.jobs.keptoutput``) get each stream's raw bytes
  through a large buffer, flushed whenever the merger has nothing to read and, while output keeps
  coming, at least every ``FLUSH_EVERY`` seconds: the files stay within a second of the console
  whatever the line rate, and a launcher killed outright (SIGKILL) loses at most that much; a
  failed log write (disk full, read-only) is reported once through ``on_log_error`` and stops the
  log files, never the merged output;
- when a round brings little, the merger lingers a moment so that the next read finds more
  (the pipes are widened to ``PIPE_SIZE`` where the kernel allows it, so the writers do not wait).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Protocol

CHUNK = 1 << 16  # at most this much from one stream per turn
PIPE_SIZE = 1 << 20  # what a pipe is widened to (the default limit for unprivileged users)
LINGER = 0.002  # seconds to wait after a round that brought less than SMALL bytes
SMALL = 1 << 14
LOG_BUFFER = 1 << 18
FLUSH_EVERY = 0.25  # seconds at most between two flushes of the files while output keeps coming
DRAIN_MOST = 30.0  # seconds a drain reads streams that keep coming (a grandchild printing on)
REPORT_LINE = 300  # characters of one line in a failure report
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def widen_pipe(fd: int, size: int = PIPE_SIZE) -> None:
    """Give a pipe a larger buffer (Linux); silently keep the default where it is not allowed."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, size)


def _escape(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def printable(line: str, limit: int = REPORT_LINE) -> str:
    """A line fit for a report on a terminal: control characters escaped (``\\x1b``, ``\\t``...)
    and cut to ``limit`` characters, saying how much was left out."""
    text = _escape(line[: limit * 4 + 1])
    if len(text) <= limit and len(line) <= limit * 4:
        return text
    return text[:limit] + f" ... [{len(line)} characters in all]"


def clip(line: bytes) -> str:
    """One line of a process's output as the failure report and the dashboard show it: the
    first ``REPORT_LINE`` bytes, control characters and invalid UTF-8 escaped."""
    text = _escape(line[:REPORT_LINE].decode(errors="backslashreplace"))
    if len(text) > REPORT_LINE or len(line) > REPORT_LINE:
        return text[:REPORT_LINE] + f" ... [{len(line)} bytes in all]"
    return text


class Sink(Protocol):
    """Where complete lines go: the console writer, or the dashboard's log panel."""

    def prefix(self, role: str, rank: int, stream: str) -> bytes: ...

    def add(self, prefix: bytes, lines: bytes, stream: str) -> None:
        """Complete lines (each ending in a newline) of one process, to be written at ``flush``."""
        ...

    def flush(self) -> None: ...


class Kept(Protocol):
    """The launcher's own copy of a stream (``launchkit.jobs.keptoutput``): never raises."""

    def write(self, data: bytes) -> None: ...
    def flush(self) -> None: ...
    def create(self) -> bool: ...  # its file exists (made when the merger has nothing to read)
    def close(self) -> None: ...


class Source:
    """One stream of one process."""

    def __init__(
        self,
        fd: int,
        stream: str,
        prefix: bytes,
        tail: deque[str],
        log: IO[bytes] | None,
        kept: Kept | None = None,
    ) -> None:
        self.kept = kept
        self.fd = fd
        self.stream = stream
        self.prefix = prefix
        self.tail = tail
        self.log = log
        self.carry = b""
        self.done = threading.Event()

    def take(self, data: bytes) -> bytes:
        """The complete lines now available (carry-over first); keeps the partial last line."""
        cut = data.rfind(b"\n")
        if cut < 0:
            self.carry += data
            return b""
        lines = self.carry + data[: cut + 1] if self.carry else data[: cut + 1]
        self.carry = data[cut + 1 :]
        return lines


def _through_pipe(stream: IO[bytes]) -> int:
    """A pipe fed from ``stream`` by a thread of its own, for streams epoll cannot watch."""
    r, w = os.pipe()

    def copy() -> None:
        try:
            for chunk in iter(lambda: stream.read(CHUNK), b""):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(w, view) :]
        except (OSError, ValueError):
            pass
        finally:
            os.close(w)
            with contextlib.suppress(OSError):
                stream.close()

    threading.Thread(target=copy, daemon=True, name="output-copy").start()
    return r


class Merger:
    def __init__(
        self, sink: Sink, on_log_error: Callable[[OSError], None] | None = None, tail_lines: int = 20
    ) -> None:
        self.sink = sink
        self.on_log_error = on_log_error
        self.tail_lines = tail_lines
        self.log_error: OSError | None = None
        self._sources: dict[int, Source] = {}
        self._poll = select.epoll()
        self._lock = threading.Lock()
        self._stop = False
        self._writing_since: float | None = None
        self._progress = 0.0  # when a round last read something
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name="output")
        self._started = False
        self._logs: list[IO[bytes]] = []
        self._flushed_at = 0.0  # when the files were last flushed

    def add(
        self,
        stream: IO[bytes],
        name: str,
        prefix: bytes,
        tail: deque[str],
        log: IO[bytes] | None = None,
        kept: Kept | None = None,
    ) -> Source:
        try:
            fd = os.dup(stream.fileno())  # ours to close, whatever the handle does with its own
            self._poll.register(fd, select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR)
        except (OSError, ValueError):  # not a pipe or socket (a file, an in-memory stream)
            fd = _through_pipe(stream)
            self._poll.register(fd, select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR)
        else:
            with contextlib.suppress(OSError):
                stream.close()
        widen_pipe(fd)
        src = Source(fd, name, prefix, tail, log, kept)
        with self._lock:
            self._sources[fd] = src
            if log is not None:
                self._logs.append(log)
        return src

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    # -- the loop ----------------------------------------------------------------------------------
    def _run(self) -> None:
        order: deque[int] = deque()
        while not self._stop:
            try:
                ready = self._poll.poll(0.1)
            except OSError:
                break
            if not ready:
                self._flush_files(create=True)
                continue
            fds = {fd for fd, _ in ready}
            # serve in turn: streams that were served last go to the back
            for fd in fds:
                if fd not in order:
                    order.append(fd)
            got = 0
            ended: list[Source] = []
            for fd in list(order):
                if fd not in fds:
                    continue
                order.remove(fd)
                order.append(fd)
                src = self._sources.get(fd)
                if src is None:
                    continue
                try:
                    data = os.read(fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                got += len(data)
                if data:
                    self._take(src, data)
                else:
                    self._end(src)
                    ended.append(src)
                    order.remove(fd)
            if got:
                self._progress = time.monotonic()
            try:
                self._write()
            finally:
                for src in ended:  # only now: a drain that sees no streams left has their lines out
                    self._forget(src)
            if time.monotonic() - self._flushed_at >= FLUSH_EVERY:  # output that never pauses
                self._flush_files()
            if got < SMALL and not self._stop:
                time.sleep(LINGER)

    def _take(self, src: Source, data: bytes) -> None:
        if src.kept is not None:
            src.kept.write(data)
        if src.log is not None and self.log_error is None:
            try:
                src.log.write(data)
            except OSError as exc:
                self.log_failed(exc)
        lines = src.take(data)
        if lines:
            self.sink.add(src.prefix, lines, src.stream)
            cut = lines.rsplit(b"\n", self.tail_lines + 1)
            if len(cut) > self.tail_lines + 1 and b"dmlc_env: " in cut[0]:
                # the tail keeps the last lines only, but must see a node's line saying it ends
                # because another failed however far back it came (rootcause.Tail)
                src.tail.extend(clip(line) for line in cut[0].split(b"\n") if b"dmlc_env: " in line)
            src.tail.extend(clip(line) for line in cut[-self.tail_lines - 1 : -1])

    def _end(self, src: Source) -> None:
        if src.carry:
            line, src.carry = src.carry + b"\n", b""
            self.sink.add(src.prefix, line, src.stream)
            src.tail.append(clip(line[:-1]))
        with contextlib.suppress(OSError, ValueError):
            self._poll.unregister(src.fd)
        with contextlib.suppress(OSError):
            os.close(src.fd)
        if src.log is not None:
            self._close_log(src.log)
        if src.kept is not None:
            src.kept.close()

    def _forget(self, src: Source) -> None:
        """After ``_end`` and the write of its lines: the stream is done."""
        with self._lock:
            # its number was given back in _end: a stream added since may hold it (a process
            # started as this one ended), and that one stays
            if self._sources.get(src.fd) is src:
                del self._sources[src.fd]
        src.done.set()
        with self._idle:
            self._idle.notify_all()

    def _take_rest(self, src: Source) -> None:
        """What a stream not yet ended already holds (its writer may live on): read without
        waiting, so that nothing already written is lost when reading stops."""
        try:
            os.set_blocking(src.fd, False)
        except OSError:
            return
        for _ in range(64):  # at most 64 chunks: a writer that never stops cannot hold us here
            try:
                data = os.read(src.fd, CHUNK)
            except OSError:  # BlockingIOError: nothing more now
                return
            if not data:
                return
            self._take(src, data)

    def _write(self) -> None:
        self._writing_since = time.monotonic()
        try:
            self.sink.flush()
        finally:
            self._writing_since = None

    # -- log files -----------------------------------------------------------------------------
    def log_failed(self, exc: OSError) -> None:
        """A ``--log-dir`` file could not be opened or written: said once (``on_log_error``), and
        the log files stop; the merged output goes on."""
        if self.log_error is not None:
            return
        self.log_error = exc
        with self._lock:
            logs, self._logs = self._logs, []
        for log in logs:
            with contextlib.suppress(OSError, ValueError):
                log.close()
        if self.on_log_error is not None:
            self.on_log_error(exc)

    def _flush_files(self, create: bool = False) -> None:
        """Every file the merger writes flushed to the kernel; ``create``: the kept files not made yet too."""
        self._flushed_at = time.monotonic()
        self._flush_logs()
        with self._lock:
            kept = [src.kept for src in self._sources.values() if src.kept is not None]
        for k in kept:
            k.flush()
            _ = create and k.create()  # when there is nothing to read, not at each start (KeptFile)

    def _flush_logs(self) -> None:
        if self.log_error is not None:
            return
        with self._lock:
            logs = list(self._logs)
        for log in logs:
            try:
                log.flush()
            except ValueError:
                continue
            except OSError as exc:
                self.log_failed(exc)
                return

    def _close_log(self, log: IO[bytes]) -> None:
        with self._lock:
            if log not in self._logs:
                return
            self._logs.remove(log)
        try:
            log.close()
        except OSError as exc:
            self.log_failed(exc)

    # -- the end -------------------------------------------------------------------------------
    def drain(self, timeout: float, most: float = DRAIN_MOST) -> bool:
        """Wait until every stream has ended and its lines are out. ``timeout`` counts only time
        in which nothing was read or written: output still arriving (a remote process's last
        lines) and a slow reader of ours (a pager, a full pipe) are waited for, and lose nothing.
        Streams that stay silent and open (a grandchild holding one) are given up after
        ``timeout``, and streams that never end at all after ``most`` seconds of reading (time
        spent writing to a slow reader not counted). Returns whether every stream ended."""
        quiet_since = time.monotonic()
        reading = 0.0
        with self._idle:
            while True:
                with self._lock:
                    if not self._sources:
                        break
                now = time.monotonic()
                if self._writing_since is not None or self._progress > quiet_since:
                    quiet_since = now
                elif now - quiet_since >= timeout:
                    break
                if reading >= most:
                    break
                self._idle.wait(0.05)
                if self._writing_since is None:
                    reading += time.monotonic() - now
        with self._lock:
            return not self._sources

    def close(self) -> None:
        """Stop reading (after ``drain``); streams not ended are closed, their carry written."""
        self._stop = True
        if self._started:
            self._thread.join(timeout=1.0)
        if self._thread.is_alive():  # stuck writing to a reader that never reads: a daemon thread
            # what the files of the streams left hold is written out now: the process ends
            # without Python's teardown, which did it (launchkit.cli.run)
            self._flush_logs()
            with self._lock:
                kept = [src.kept for src in self._sources.values() if src.kept is not None]
            for k in kept:
                k.flush()
            return
        with self._lock:
            left = list(self._sources.values())
        for src in left:
            self._take_rest(src)
            self._end(src)
            self._forget(src)
        with contextlib.suppress(Exception):
            self.sink.flush()
        self._flush_logs()
        with self._lock:
            logs, self._logs = self._logs, []
        for log in logs:
            with contextlib.suppress(OSError, ValueError):
                log.close()
        self._poll.close()
