"""The output and the ends of a watchdog's processes, all in one thread.

Each process had three threads of the watchdog (one per output stream, one waiting for its end):
at 8 processes a host, 24 threads started on each host while the launch was starting them.
One thread now waits on every stream and on each process's end (a pidfd, Linux 5.3
and Python 3.9 or later; where there is none, a thread per process still waits for its end).

Each stream goes to the launcher in chunks of at most ``CHUNK`` bytes. With a window, a stream
is not read (its process blocks on a full pipe) while the launcher has not acknowledged
``window`` bytes of it: a slow reader of the launcher's output slows that process, never the
channel (heartbeats, the other processes' output). After a round that read only small chunks
the thread waits ``LINGER``, so that the next round finds more. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable

TYPE_CHECKING = False  # (as in watchdog.py)

if TYPE_CHECKING:
    from typing import Any

CHUNK = 1 << 16  # at most this much output of one stream per message
SMALL = CHUNK  # after a round of reads of less than a full chunk, wait LINGER so that the next finds more
LINGER = 0.005
PIPE_SIZE = 1 << 20

Write = Callable[[bytes], None]


def encode(msg: dict[str, Any], payload: bytes = b"") -> bytes:
    """One message as the launcher reads it: a JSON line, then ``payload``'s raw bytes."""
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode() + payload


class ChildIO:
    def __init__(self, write: Write) -> None:
        self.write = write  # what one round of the thread sends, in one write (one ssh packet)
        self._out: list[bytes] = []  # this round's messages
        self.window: int | None = None  # bytes of output a stream may have unacknowledged
        self.stopping = False  # the job ends: every stream is read to its end, window or not
        self._lock = threading.Lock()
        self._credit: dict[tuple[int, str], int] = {}
        self._paused: dict[tuple[int, str], int] = {}  # streams waiting for credit: their fd
        self._added: list[tuple[int, subprocess.Popen[bytes]]] = []
        self._resumed: list[tuple[tuple[int, str], int]] = []
        self._unended: set[tuple[int, str]] = set()  # the ends (``exit``, ``eof``) not yet written
        self._ended_now: list[tuple[int, str]] = []  # (the thread's) ends in this round's messages
        self._all_ended = threading.Condition(self._lock)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None

    # -- from other threads -----------------------------------------------------------------
    def add(self, ident: int, proc: subprocess.Popen[bytes]) -> None:
        """Send ``proc``'s output and its end (``exit``) to the launcher."""
        with self._lock:
            if self.window is not None:
                self._credit[(ident, "o")] = self._credit[(ident, "e")] = self.window
            self._added.append((ident, proc))
            self._unended.update(((ident, "o"), (ident, "e"), (ident, "x")))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="childio")
                self._thread.start()
        self._wake()

    def ack(self, ident: int, name: str, n: int) -> None:
        """The launcher has delivered ``n`` more bytes of that stream."""
        key = (ident, name)
        with self._lock:
            self._credit[key] = self._credit.get(key, 0) + n
            fd = self._paused.pop(key, None) if self._credit[key] > 0 else None
            if fd is not None:
                self._resumed.append((key, fd))
        if fd is not None:
            self._wake()

    def stop(self) -> None:
        """The job ends: streams waiting for acknowledgements are read again, to their end."""
        with self._lock:
            self.stopping = True
            self._resumed.extend(self._paused.items())
            self._paused.clear()
        self._wake()

    def drain(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until the end of every added process and of both its
        streams (``exit``, ``eof``) has been written, and with it all their output: the watchdog
        says ``bye`` after its teardown, and nothing is written after ``bye``. True if none is
        left unsent."""
        with self._all_ended:
            return self._all_ended.wait_for(lambda: not self._unended, timeout)

    def _written(self, ends: list[tuple[int, str]]) -> None:
        with self._all_ended:
            self._unended.difference_update(ends)
            self._all_ended.notify_all()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # (full: a wake-up is pending anyway)
            os.write(self._wake_w, b"\0")

    # -- the thread ---------------------------------------------------------------------------
    def send(self, msg: dict[str, Any], payload: bytes = b"") -> None:
        self._out.append(encode(msg, payload))

    def _run(self) -> None:
        while True:
            ready = self._sel.select()
            read_any, small = False, True
            for key, _ in ready:
                if key.data is None:
                    self._take_wake()
                elif key.data[1] == "x":
                    self._ended(key.fd, *key.data)
                else:
                    got = self._read(key.fd, *key.data)
                    read_any = read_any or got > 0
                    small = small and got < SMALL
            if self._out:  # the round's messages in one write: several processes' lines, one packet
                out, self._out = b"".join(self._out), []
                self.write(out)
            if self._ended_now:
                ended, self._ended_now = self._ended_now, []
                self._written(ended)
            if read_any and small:
                time.sleep(LINGER)

    def _take_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        with self._lock:
            added, self._added = self._added, []
            resumed, self._resumed = self._resumed, []
        for ident, proc in added:
            assert proc.stdout is not None and proc.stderr is not None
            for stream, name in ((proc.stdout, "o"), (proc.stderr, "e")):
                fd = stream.fileno()
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
                self._sel.register(fd, selectors.EVENT_READ, (ident, name))
            self._watch_end(ident, proc)
        for (ident, name), fd in resumed:
            self._sel.register(fd, selectors.EVENT_READ, (ident, name))

    def _watch_end(self, ident: int, proc: subprocess.Popen[bytes]) -> None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfd here: a thread waits for this one
            threading.Thread(target=self._wait, args=(ident, proc), daemon=True).start()
            return
        self._sel.register(pidfd, selectors.EVENT_READ, (ident, "x", proc))

    def _wait(self, ident: int, proc: subprocess.Popen[bytes]) -> None:
        self.write(encode({"ev": "exit", "id": ident, "rc": proc.wait()}))  # (its own thread)
        self._written([(ident, "x")])

    def _ended(self, pidfd: int, ident: int, _x: str, proc: subprocess.Popen[bytes]) -> None:
        self._sel.unregister(pidfd)
        os.close(pidfd)
        self.send({"ev": "exit", "id": ident, "rc": proc.wait()})
        self._ended_now.append((ident, "x"))

    def _read(self, fd: int, ident: int, name: str) -> int:
        """One chunk of a stream to the launcher; at its end, ``eof``. Returns the bytes read."""
        try:
            chunk = os.read(fd, CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            self._sel.unregister(fd)
            self.send({"ev": "eof", "id": ident, "s": name})
            self._ended_now.append((ident, name))
            return 0
        key = (ident, name)
        with self._lock:  # (an acknowledgement may come before the send below returns)
            if self.window is not None:
                self._credit[key] = self._credit.get(key, 0) - len(chunk)
                if self._credit[key] <= 0 and not self.stopping:
                    self._paused[key] = fd
                    self._sel.unregister(fd)
        self.send({"ev": "out", "id": ident, "s": name, "n": len(chunk)}, chunk)
        return len(chunk)
