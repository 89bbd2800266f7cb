"""Starts a real KV-store job (scheduler, servers, workers as subprocesses) for tests.

Until the launcher runs these tests, this helper plays its part: it reserves the scheduler
port the way the launcher does (a bound, non-listening SO_REUSEADDR socket), builds each
process's environment with ``dmlc_env.build_env``, waits with a bound, and kills
every process and removes every ``/dev/shm/launchkit-<job>-*`` segment in a ``finally``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dmlc_env import JobEnv, TaskEnv, build_env

REPO = Path(__file__).resolve().parents[2]
FAST_LIVENESS = {"PS_HEARTBEAT_INTERVAL": "0.3", "PS_HEARTBEAT_TIMEOUT": "3"}
#: for a job that loads the compiled compression kernels and asserts no liveness bound: the
#: product's heartbeat timeout (10 s), not 3 s. While a worker loaded them from numba's cache
#: (12.5 s on a loaded machine) its heartbeats stopped for more than 3 s: the scheduler ended the job
KERNELS_LOADING = {"PS_HEARTBEAT_TIMEOUT": "10"}


@dataclass
class Proc:
    role: str
    rank: int
    popen: subprocess.Popen[bytes]
    log: Path
    text: str | None = None  # the whole output, kept once the job ended (the log file is then gone)

    @property
    def name(self) -> str:
        return f"{self.role} {self.rank}"

    def output(self) -> str:
        if self.text is not None:
            return self.text
        return self.log.read_text(errors="replace")

    def results(self) -> list[dict]:
        """Lines the worker printed as ``RESULT {json}``."""
        return [json.loads(line[7:]) for line in self.output().splitlines() if line.startswith("RESULT ")]


@dataclass
class Job:
    job_id: str
    port: int
    procs: list[Proc] = field(default_factory=list)
    leftover_shm: list[str] = field(default_factory=list)

    def of(self, role: str) -> list[Proc]:
        return [p for p in self.procs if p.role == role]

    @property
    def workers(self) -> list[Proc]:
        return self.of("worker")

    def codes(self) -> dict[str, int | None]:
        return {p.name: p.popen.returncode for p in self.procs}

    def outputs(self) -> str:
        return "\n".join(f"--- {p.name} (rc {p.popen.returncode})\n{p.output()}" for p in self.procs)


def reserve_port() -> socket.socket:
    """A bound, not listening SO_REUSEADDR socket on a free port (what the launcher holds)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def shm_segments(job_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/launchkit-{job_id}-*")


def run_job(
    worker_code: str,
    num_workers: int,
    num_servers: int,
    extra_env: dict[str, str] | None = None,
    timeout: float = 45.0,
    during: Callable[[Job], None] | None = None,
    role_ranks: list[int] | None = None,
    secret: str = "test-secret",
    worker_secret: str | None = None,
    not_awaited: tuple[str, ...] = (),
    role_args: dict[str, list[str]] | None = None,
) -> Job:
    """Run a job whose workers execute ``worker_code``; returns when every process ended (or after
    ``timeout``, killing what is left). ``during(job)`` runs once every process has started;
    processes named in ``not_awaited`` (``"worker 1"``) are not waited for, only killed at the end;
    ``role_args`` replaces the interpreter arguments of a role (``["-m", "trainer_core.ps.server"]``)."""
    reserved = reserve_port()
    port = reserved.getsockname()[1]
    job = Job(job_id=uuid.uuid4().hex[:10], port=port)
    tmp = Path(tempfile.mkdtemp(prefix="lk-kv-test-"))
    jenv = JobEnv(
        job_id=job.job_id,
        secret=secret,
        cluster="local",
        root_uri="127.0.0.1",
        root_port=port,
        num_servers=num_servers,
        num_workers=num_workers,
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_", "PS_"))}
    base["PYTHONPATH"] = str(REPO) + os.pathsep + base.get("PYTHONPATH", "")
    base.update(FAST_LIVENESS)
    base.update(extra_env or {})
    plan = (
        [("scheduler", 0)]
        + [("server", i) for i in range(num_servers)]
        + [("worker", i) for i in range(num_workers)]
    )
    try:
        for task_id, (role, rank) in enumerate(plan):
            if role == "worker" and role_ranks is not None:
                rank = role_ranks[rank]
            env = dict(base)
            env.update(
                build_env(
                    jenv,
                    TaskEnv(role=role, role_rank=rank, task_id=task_id, local_rank=0, node_host="127.0.0.1"),
                )
            )
            if role == "worker" and worker_secret is not None:
                env["LAUNCHKIT_JOB_SECRET"] = worker_secret
            code = worker_code if role == "worker" else "import trainer_core"
            log = tmp / f"{role}-{rank}.log"
            args = (role_args or {}).get(role, ["-c", code])
            with open(log, "wb") as out:
                popen = subprocess.Popen(
                    [sys.executable, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO)
                )
            job.procs.append(Proc(role, rank, popen, log))
        if during is not None:
            during(job)
        deadline = time.monotonic() + timeout
        for p in job.procs:
            if p.name in not_awaited:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for p in job.procs:
            if p.popen.poll() is None:
                p.popen.kill()  # SIGKILL ends a stopped process too (no SIGCONT: it would run on first)
                p.popen.wait()
        reserved.close()
        for p in job.procs:
            p.text = p.output()
        shutil.rmtree(tmp, ignore_errors=True)
        job.leftover_shm = shm_segments(job.job_id)
        for path in job.leftover_shm:
            os.unlink(path)
    return job


def worker_script(body: str, kv_type: str = "dist_sync") -> str:
    """A worker program: ``body`` runs with ``kv`` (the store), ``np`` and ``emit(**values)`` defined."""
    header = (
        "import json, os, sys\n"
        "import numpy as np\n"
        "from trainer_core import kv as _kv\n"
        f"kv = _kv.create({kv_type!r})\n"
        "def emit(**values):\n"
        "    print('RESULT ' + json.dumps(values), flush=True)\n"
    )
    return header + body + "\nkv.close()\n"
