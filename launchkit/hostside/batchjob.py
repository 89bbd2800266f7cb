"""The job inside a Slurm allocation: the scheduler here, the servers and workers as ``srun`` steps.

Run as ``python -m launchkit.hostside.batchjob`` by the launcher itself inside an allocation (``salloc``),
or as the batch script of ``sbatch``. Its instructions come in ``LAUNCHKIT_BATCH`` (JSON, no
secret; the job's variables arrive in the environment by name):

    {"scheduler": ROW or null, "steps": [{"srun": [...], "offset": K, "slots": TABLE}],
     "program": [python, "-m", "launchkit.hostside.shim", "--", ...], "grace": SECONDS}

where TABLE is a ``tasktable`` (its row k: the index of task k's node among the allocation's, as
runs and repeats, so its size does not grow with a regular placement's tasks). Each step gets
``SLURM_HOSTFILE`` (one allocated node per task, ``--distribution=arbitrary``),
so the tasks land where launchkit's placement put them. When ``DMLC_PS_ROOT_URI`` is empty (a
batch job: the launcher cannot know the node), the scheduler's address is this node's
``NodeAddr`` and its port a free one. The first step or scheduler to fail ends the rest; the
exit code is the first failure's. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from launchkit.hostside import shim, tasktable

BATCH_VAR = "LAUNCHKIT_BATCH"
RANK_OVERRIDE = "LAUNCHKIT_SHIM_RANK"
STOP = signal.SIGUSR2  # what a stop is passed on as (see main)


def allocation_nodes(environ: Mapping[str, str] | None = None) -> list[str]:
    """The allocation's node names (``scontrol show hostnames $SLURM_JOB_NODELIST``).
    RuntimeError outside an allocation; OSError/SubprocessError when scontrol fails."""
    env = os.environ if environ is None else environ
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodelist:
        raise RuntimeError("SLURM_JOB_NODELIST is not set: not inside a Slurm allocation")
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return out.split()


def node_address(node: str) -> str:
    """This node's address as Slurm knows it (``NodeAddr``), else its resolved name."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=30
        ).stdout
        for word in out.split():
            if word.startswith("NodeAddr="):
                addr = word.split("=", 1)[1]
                with contextlib.suppress(OSError):
                    return socket.gethostbyname(addr)
    return socket.gethostbyname(socket.gethostname())


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def hostfile_text(slots: Mapping[str, Any] | list[int], nodes: list[str]) -> str:
    """A step's ``SLURM_HOSTFILE``: the node of each task, in order. ``slots`` is a ``tasktable``
    whose row k's index is task k's node (a plain list of indexes, the older form, is read too)."""
    indexes = slots if isinstance(slots, list) else (k for k, _ in tasktable.rows(slots))
    return "".join(f"{nodes[k % len(nodes)]}\n" for k in indexes)


class _Relay:
    """Every child's output goes through here, a whole line per write, so lines of the srun
    steps and the scheduler never interleave in the one output file (or pipe) they share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.steps: set[str] = set()  # JOB.STEP of every step a shim reported its start from

    def start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for src, fd in ((proc.stdout, 1), (proc.stderr, 2)):
            t = threading.Thread(target=self._copy, args=(src, fd), daemon=True)
            t.start()
            self.threads.append(t)
        return proc

    def _copy(self, src: Any, fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in iter(src.readline, b""):
                frame = shim.parse_frame(line)
                if frame is not None and frame.kind == "s":
                    fields = frame.fields()
                    if len(fields) >= 4 and "-" not in (fields[2], fields[3]):
                        self.steps.add(f"{fields[2]}.{fields[3]}")
                with self.lock:
                    os.write(fd, line)

    def join(self) -> None:
        for t in self.threads:
            t.join(5.0)


def _stop(procs: list[subprocess.Popen[bytes]], scheduler: bool, steps: set[str]) -> None:
    """Ask every task to stop, so that each gets its grace period. srun turns SIGTERM into
    SIGKILL of its tasks ("forcing job termination") and passes any other signal to every process
    of the step, the command's too: the steps get SIGTERM from ``scancel --signal=TERM STEP``
    (ids from the shims' start marks); the scheduler, a child of ours, SIGUSR2 (the shim's "stop")."""
    if scheduler and procs[0].poll() is None:
        with contextlib.suppress(OSError):
            procs[0].send_signal(STOP)
    if steps:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", "--signal=TERM", *sorted(steps)], capture_output=True, timeout=30)
    for p in procs[1 if scheduler else 0 :]:  # a step not started yet: srun ends it
        if p.poll() is None and not steps:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGTERM)


def main() -> int:
    try:
        spec: dict[str, Any] = json.loads(os.environ[BATCH_VAR])
        nodes = allocation_nodes()
    except (KeyError, ValueError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        sys.stderr.write(f"launchkit batch job: cannot start: {exc}\n")
        return 2
    env = dict(os.environ)
    env.pop(BATCH_VAR, None)
    if spec.get("scheduler") is not None:  # else worker 0 serves the root (its shim publishes it)
        if not env.get("DMLC_PS_ROOT_URI"):
            here = os.environ.get("SLURMD_NODENAME") or nodes[0]
            env["DMLC_PS_ROOT_URI"] = node_address(here)
        if env.get("DMLC_PS_ROOT_PORT", "0") in ("", "0"):
            env["DMLC_PS_ROOT_PORT"] = str(free_port(env["DMLC_PS_ROOT_URI"]))
    program = list(spec["program"])
    procs: list[subprocess.Popen[bytes]] = []
    relay = _Relay()
    grace = float(spec.get("grace", 5.0))
    stop_at: list[float] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop_at.append(time.monotonic())  # acted on in the loop below

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, STOP):  # before any child exists
        signal.signal(sig, on_signal)
    tmp = tempfile.mkdtemp(prefix="launchkit-batch-")
    if spec.get("scheduler") is not None:
        # not a step: it must not pass for one (a user's own step would be cancelled with ours)
        own = {k: v for k, v in env.items() if not k.startswith(("SLURM_STEP", "SLURM_STEPID"))}
        procs.append(relay.start(program, {**own, RANK_OVERRIDE: str(spec["scheduler"])}))
    for n, step in enumerate(spec["steps"]):
        path = os.path.join(tmp, f"hosts.{n}")
        with open(path, "w") as f:
            f.write(hostfile_text(step["slots"], nodes))
        step_env = {**env, "SLURM_HOSTFILE": path, "LAUNCHKIT_SHIM_OFFSET": str(step["offset"])}
        procs.append(relay.start([*step["srun"], *program], step_env))
    first_failure = 0
    stopped = False
    while [p.poll() for p in procs].count(None):  # poll every one (any() would stop early)
        for p in procs:
            if p.returncode is not None and p.returncode != 0 and not first_failure:
                rc = p.returncode
                first_failure = 128 - rc if rc < 0 else rc
                stop_at.append(time.monotonic())
        if stop_at and not stopped:
            stopped = True
            _stop(procs, spec.get("scheduler") is not None, relay.steps)
        if stop_at and time.monotonic() - stop_at[0] > grace + 5:
            for q in procs:
                if q.poll() is None:
                    q.kill()
        time.sleep(0.1)
    for p in procs:
        if p.returncode and not first_failure:
            first_failure = 128 - p.returncode if p.returncode < 0 else p.returncode
    relay.join()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    with contextlib.suppress(OSError, KeyError):  # worker 0's address: moot once the job ended
        os.unlink(env["LAUNCHKIT_RENDEZVOUS_WORKER0"])
    return first_failure


if __name__ == "__main__":
    raise SystemExit(main())
