"""How a stop reaches an mpirun job (launchkit.backends.mpi.MpirunRun), with real processes: a
stand-in for mpirun that reports the signals it got, and a stand-in for a rank's shim (a process
whose command line names ``launchkit.hostside.shim``) with a command under it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from launchkit.backends.mpi import MpirunRun

# the engine: every handled signal is noted; SIGWINCH (numbered after the stops, so handled after
# one sent before it) prints the notes. It reads nothing and ends only by SIGKILL. Its "ready" line
# lists the signals that were blocked when it started (it unblocks them).
ENGINE = """
import signal, sys
seen = []
def note(sig, _frame):
    seen.append(sig)
def report(_sig, _frame):
    print("seen", *seen, flush=True)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
    signal.signal(sig, note)
signal.signal(signal.SIGWINCH, report)
# (a signal mask is inherited: one blocked in the process that started this one would never come)
blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2, signal.SIGWINCH])
print("ready", *sorted(int(s) for s in blocked), flush=True)
while True:
    signal.pause()
"""

# the shim: starts its command, says the command's pid, then each signal it gets
SHIM = """
import signal, subprocess
def note(sig, _frame):
    print("got", sig, flush=True)
signal.signal(signal.SIGTERM, note)
child = subprocess.Popen(["sleep", "60"])
print("child", child.pid, flush=True)
while True:
    signal.pause()
"""


class Lines:
    """What the engine printed, line by line, and a wait for one that starts with a word."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()

    def feed(self, data: bytes) -> None:
        with self.cond:
            self.lines.append(data.decode().strip())
            self.cond.notify_all()

    def wait_for(self, word: str) -> str:
        with self.cond:
            assert self.cond.wait_for(lambda: any(x.split()[0] == word for x in self.lines), 20), self.lines
            return next(x for x in self.lines if x.split()[0] == word)


@pytest.fixture
def shim() -> Iterator[tuple[int, Lines]]:
    """(the command's pid, what the shim says)."""
    said = Lines()
    proc = subprocess.Popen([sys.executable, "-c", SHIM, "launchkit.hostside.shim"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [said.feed(line) for line in proc.stdout or ()], daemon=True)
    reader.start()
    child = int(said.wait_for("child").split()[1])
    yield child, said
    for pid in (child, proc.pid):
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    reader.join(10)


def start(flavor: str, ranks: list[int] | None) -> tuple[MpirunRun, Lines]:
    lines = Lines()
    run = MpirunRun(
        [sys.executable, "-c", ENGINE],
        dict(os.environ),
        "/",
        flavor,
        None if ranks is None else lambda: ranks,
    )
    run.start(lines.feed, lines.feed)
    lines.wait_for("ready")
    return run, lines


def engine_got(run: MpirunRun, lines: Lines) -> list[int]:
    """The signals the engine got before now (SIGWINCH asks it; signals come in order of number)."""
    run.signal(signal.SIGWINCH)
    seen = [int(x) for x in lines.wait_for("seen").split()[1:]]
    run.signal(signal.SIGKILL)
    assert run.wait() == 128 + signal.SIGKILL
    return seen


def shim_got(said: Lines) -> list[int]:
    return [int(x.split()[1]) for x in said.lines if x.startswith("got")]


def test_hydra_is_not_told_of_a_stop_when_every_rank_is_here_their_shims_are(shim) -> None:
    child, said = shim
    run, lines = start("mpich", [child])
    run.signal(signal.SIGTERM)
    said.wait_for("got")
    assert shim_got(said) == [signal.SIGTERM]
    assert engine_got(run, lines) == []  # Hydra would SIGKILL the ranks at once


def test_open_mpi_gets_sigusr2_and_the_shims_here_sigterm_first(shim) -> None:
    child, said = shim
    run, lines = start("openmpi", [child])
    run.signal(signal.SIGINT)
    said.wait_for("got")
    assert shim_got(said) == [signal.SIGTERM]
    assert engine_got(run, lines) == [signal.SIGUSR2]


def test_with_ranks_on_other_hosts_the_stop_goes_to_mpiexec_alone(shim) -> None:
    _, said = shim
    run, lines = start("mpich", None)
    run.signal(signal.SIGTERM)
    assert engine_got(run, lines) == [signal.SIGTERM]
    assert shim_got(said) == []  # (it would have been signalled before mpiexec)
