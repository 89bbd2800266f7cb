"""Where an elastic job's hosts come from while it runs: its hostfile, read again when it changes,
or ``--host-discovery-script`` (Horovod's contract: an executable that prints ``host:slots``
lines), run again every second. The effects only (a file's time and text, a process); what the
lines mean is ``launchkit.core.elastic``'s and ``core.hostfile``'s."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from pathlib import Path

from launchkit.core.elastic import parse_discovered
from launchkit.core.hostfile import parse_hostfile, read_text
from launchkit.core.spec import Host
from launchkit.errors import LaunchkitError, UsageError

SCRIPT_TIMEOUT = 10.0  # seconds one run of the discovery script may take
POLL = 1.0  # seconds between two looks at the hosts


class DiscoveryError(LaunchkitError):
    """The hosts could not be read this time (the script failed, the hostfile is broken)."""


def run_script(path: str, timeout: float = SCRIPT_TIMEOUT) -> list[Host]:
    """The hosts ``path`` prints now; DiscoveryError naming what went wrong."""
    try:
        done = subprocess.run(
            [path], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"{path}: no answer within {timeout:g} s") from None
    except OSError as exc:
        raise DiscoveryError(f"{path}: cannot run it: {exc.strerror or exc}") from None
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise DiscoveryError(f"{path} exited {done.returncode}" + (f": {last[0]}" if last[0] else ""))
    try:
        return parse_discovered(done.stdout.decode(errors="replace"))
    except ValueError as exc:
        raise DiscoveryError(f"{path}: {exc}") from None


def first_hosts(path: str) -> list[Host]:
    """The script's hosts at the start of the job: a failure there is the user's (UsageError),
    and so is an empty list."""
    try:
        hosts = run_script(path)
    except DiscoveryError as exc:
        raise UsageError(f"--host-discovery-script {exc.message}") from None
    if not hosts:
        raise UsageError(f"--host-discovery-script {path} printed no host: expected host:slots lines")
    return hosts


class HostSource:
    """The hosts an elastic job may use now: ``poll()`` returns the new list when it changed
    (the hostfile's time or the script's output), None when not; DiscoveryError when it cannot
    be read this time (the caller says so and keeps the last list)."""

    def __init__(self, hostfile: str | None, script: str | None) -> None:
        self.hostfile = hostfile
        self.script = script
        self._mtime: float | None = self._stamp()
        self._last: tuple[Host, ...] | None = None

    def _stamp(self) -> float | None:
        if self.hostfile is None:
            return None
        try:
            return os.stat(self.hostfile).st_mtime
        except OSError:
            return None

    def poll(self) -> tuple[Host, ...] | None:
        if self.script is not None:
            hosts = tuple(run_script(self.script))
        elif self.hostfile is not None:
            stamp = self._stamp()
            if stamp is None or stamp == self._mtime:
                return None
            self._mtime = stamp
            try:
                hosts = tuple(parse_hostfile(read_text(Path(self.hostfile)), self.hostfile, allow_empty=True))
            except (LaunchkitError, OSError) as exc:
                raise DiscoveryError(getattr(exc, "message", str(exc))) from None
        else:
            return None
        if hosts == self._last:
            return None
        self._last = hosts
        return hosts


class HostPoller:
    """``source`` polled every ``every`` seconds on a thread of its own (a discovery script may
    take seconds: the supervisor's loop never waits for it); ``take`` returns what came since:
    each new list of hosts, or what went wrong (a DiscoveryError's message)."""

    def __init__(self, source: HostSource, every: float = POLL) -> None:
        self.source = source
        self.every = every
        self._found: queue.SimpleQueue[tuple[tuple[Host, ...] | None, str | None]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="launchkit-hosts", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                hosts = self.source.poll()
            except DiscoveryError as exc:
                self._found.put((None, exc.message))
                continue
            if hosts is not None:
                self._found.put((hosts, None))

    def take(self) -> list[tuple[tuple[Host, ...] | None, str | None]]:
        found = []
        while not self._found.empty():
            found.append(self._found.get_nowait())
        return found

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(SCRIPT_TIMEOUT + 1.0)
