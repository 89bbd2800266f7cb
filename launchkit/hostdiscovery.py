"""Where an elastic job's hosts come from while it runs: its hostfile, read again when it changes,
or ``--host-discovery-script`` (Horovod's contract: an executable that prints ``host:slots``
lines), run again every second. The effects only (a file's time and text, a process); what the
lines mean is ``launchkit.core.elastic``'s and ``core.hostfile``'s."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from launchkit.core.elastic import parse_discovered
from launchkit.core.hostfile import parse_hostfile, read_text
from launchkit.core.spec import Host
from launchkit.errors import LaunchkitError, UsageError

SCRIPT_TIMEOUT = 10.0  # seconds one run of the discovery script may take


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
