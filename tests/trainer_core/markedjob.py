"""A ``launchkit launch --launcher local`` job whose every process carries a unique marker in its
environment (``--env``), so that a test can check that none is left once the launch returned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def marked_processes(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def run_marked(
    launch_args: Sequence[str],
    command: Sequence[str],
    name: str,
    timeout: float,
    env: Sequence[str] = (),
    launcher: str = "local",
) -> tuple[int, str]:
    """Launch ``command`` with ``launch_args`` (and ``--env`` each of ``env``) from the repository
    and a marker ``name=...``; its exit status and combined output, once nothing marked is left
    (a leftover is SIGKILLed and fails the test, as does a launch past ``timeout`` seconds)."""
    marker = f"{name}={uuid.uuid4().hex}"
    cmd = [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        *launch_args,
        "--launcher",
        launcher,
        "--env",
        marker.replace("=", ":"),
        *[a for e in env for a in ("--env", e)],
        *command,
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out:\n{out}")
    finally:
        left = marked_processes(marker)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes left behind:\n{out}"
    return proc.returncode, out
