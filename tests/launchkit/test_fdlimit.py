"""The launcher's open-file limit (launchkit.fdlimit): a launch of more processes than a low soft
limit once held (issue 28)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

from launchkit.fdlimit import raise_open_files
from tests.launchkit.procs import LAUNCHKIT


def low_soft_limit() -> None:  # pragma: no cover - runs in the child before exec
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_a_launch_of_120_processes_under_a_soft_limit_of_256(launchkit_home: Path) -> None:
    """Failed on the old code: "cannot start 'sleep': Too many open files" from the 60th worker
    (about 4 descriptors a process); with a common soft limit of 1024, about 250 processes."""
    res = subprocess.run(
        [*LAUNCHKIT, "launch", "-n", "120", "-s", "0", "--no-dashboard", "sleep", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        preexec_fn=low_soft_limit,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "all 120 processes succeeded" in res.stderr  # workers only (-s 0)


def test_the_soft_limit_goes_up_to_the_hard_one() -> None:
    code = "import resource; from launchkit.fdlimit import raise_open_files; print(raise_open_files(), resource.getrlimit(resource.RLIMIT_NOFILE)[1])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=low_soft_limit,
        check=True,
    ).stdout.split()
    assert out[0] == out[1] != "256"
    assert raise_open_files() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
