"""Test helpers: run the real `launchkit` CLI, and find a job's processes independently of
launchkit's own code (by scanning every process's environment for the job id)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

PROG = str(Path(__file__).with_name("jobprog.py"))
LAUNCHKIT = [sys.executable, "-m", "launchkit"]


def pids_with_job(job_id: str) -> list[int]:
    return pids_with_env(f"LAUNCHKIT_JOB_ID={job_id}")


def pids_with_env(entry: str) -> list[int]:
    """Live processes of the whole machine (all PID namespaces) with the environment entry ``entry``."""
    needle = entry.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def parse_prefixed(stdout: str) -> dict[tuple[str, int], dict]:
    """``[role rank] {json}`` output lines -> {(role, rank): object}."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("[") and "] {" in line:
            label, _, body = line.partition("] ")
            role, rank = label[1:].split()
            out[(role, int(rank))] = json.loads(body)
    return out


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def until_exists_sh(path: Path) -> str:
    """A shell loop that waits until ``path`` exists (a job's step the test lets go of)."""
    return f"while [ ! -e {shlex.quote(str(path))} ]; do sleep 0.05; done"


def fake_engine(bin_dir: Path, name: str, stderr: str) -> dict[str, str]:
    """An environment whose ``name`` fails as the real one does with no controller (exit 1, its
    words on stderr), whatever engine runs on this machine; outside any allocation."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\ncat >/dev/null\nprintf '%s' {shlex.quote(stderr)} >&2\nexit 1\n")
    tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SGE_", "JOB_ID"))}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


def run(args: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        LAUNCHKIT + args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw
    )


def start(args: list[str], **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        LAUNCHKIT + args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        **kw,
    )


def job_ids(home: Path) -> list[str]:
    return sorted(p.stem for p in (home / "jobs").glob("*.json"))


def wait_for_job(home: Path, timeout: float = 10) -> str:
    assert wait_until(lambda: bool(job_ids(home)), timeout), "no job record appeared"
    return job_ids(home)[-1]


def record(home: Path, job_id: str) -> dict:
    return json.loads((home / "jobs" / f"{job_id}.json").read_text())
