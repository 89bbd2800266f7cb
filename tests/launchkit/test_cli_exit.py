"""The ``launchkit`` process's exit (``launchkit.cli.run``): at once after the command, with the
exit handlers run and the output flushed, and the status ``main`` gave; Python's teardown of the
interpreter (0.3-1 s on a loaded machine, after every command) is skipped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launchkit.cli import exit_status

# a program that runs the CLI's entry point with an object whose finalizer would speak at the
# interpreter's teardown, an exit handler, and output left in stdout's buffer
PROGRAM = """
import atexit, sys
from launchkit.cli import run

class Noisy:
    def __del__(self):
        print("teardown ran", flush=True)

noisy = Noisy()
atexit.register(lambda: print("exit handler ran"))
print("buffered", end="")
sys.argv = ["launchkit", *sys.argv[1:]]
run()
"""


@pytest.mark.proc
def test_the_entry_point_exits_without_the_teardown_but_with_handlers_output_and_status() -> None:
    res = subprocess.run(
        [sys.executable, "-c", PROGRAM, "ps", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2, res.stderr  # the usage error's status, from main
    assert "no such option" in res.stderr.lower()
    assert res.stdout.startswith("buffered") and "exit handler ran" in res.stdout
    assert "teardown ran" not in res.stdout


@pytest.mark.proc
def test_python_dash_m_launchkit_is_that_entry_point() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "launchkit", "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and "launch" in res.stdout


def test_exit_status_is_pythons() -> None:
    assert exit_status(None) == 0
    assert exit_status(0) == 0 and exit_status(2) == 2 and exit_status(130) == 130
    assert exit_status(True) == 1 and exit_status(256 + 3) == 3 and exit_status(-1) == 255
    assert exit_status("a message") == 1
