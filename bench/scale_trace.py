"""A launch's timeline: ``launchkit launch ARGS`` with the launcher's steps timed.

    python -m bench.scale_trace [launch ARGS...]

Runs the launchkit CLI in this process with its steps wrapped (nothing in launchkit changes):
each step's start and end, in seconds since the interpreter started (``LK_TRACE_T0``, the
caller's clock when it sets it), and this process's CPU seconds at its end, written to stderr
as ``TRACE name start end cpu machine`` (machine: the whole machine's busy CPU seconds since
boot, ``/proc/stat``). With ``LK_TRACE_PROFILE=FILE`` the supervisor's start of the
processes (``Supervisor._start_all``, the thread that runs it) also runs under cProfile, its
statistics written to FILE.
"""

from __future__ import annotations

import cProfile
import functools
import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

T0 = float(os.environ.get("LK_TRACE_T0") or time.time())

#: (module, attribute path) of the steps timed
STEPS = (
    ("launchkit.backends.ssh.backend", "SshBackend.connect"),
    ("launchkit.backends.ssh.backend", "SshBackend.worker0_ports"),
    ("launchkit.backends.ssh.backend", "SshBackend.prepare"),
    ("launchkit.backends.ssh.backend", "SshBackend.record_info"),
    ("launchkit.backends.ssh.backend", "SshBackend.close"),
    ("launchkit.launching", "make_plan"),
    ("launchkit.launching", "serve"),
    ("launchkit.supervisor", "Supervisor._start_all"),
    ("launchkit.jobs.records", "started_here"),
)

PROFILED = "Supervisor._start_all"


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _line(name: str, start: float, end: float) -> str:
    return f"TRACE {name} {start:.3f} {end:.3f} {time.process_time():.3f} {machine_busy():.2f}\n"


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.time() - T0
        out = os.environ.get("LK_TRACE_PROFILE") if name == PROFILED else None
        prof = cProfile.Profile() if out else None
        try:
            return prof.runcall(fn, *args, **kwargs) if prof else fn(*args, **kwargs)
        finally:
            if prof and out:
                prof.dump_stats(out)
            end = time.time() - T0
            sys.stderr.write(_line(name, start, end))

    return timed


def install() -> None:
    for module, path in STEPS:
        owner: Any = importlib.import_module(module)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        setattr(owner, attr, _wrap(path, getattr(owner, attr)))


def main() -> None:
    sys.stderr.write(_line("python-started", 0, time.time() - T0))
    from launchkit.cli import main as cli_main

    install()
    sys.stderr.write(_line("imported", 0, time.time() - T0))
    sys.argv = ["launchkit", *sys.argv[1:]]
    cli_main()


if __name__ == "__main__":
    main()
