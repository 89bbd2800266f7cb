"""The local cases of bench/reliability.py: one function per fault, each returning an Outcome."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.reliability_kit import Fault, Outcome, Side, finish, inject, launcher_gone


def signal_case(fault: Fault) -> Callable[[Side, float], Outcome]:
    def case(side: Side, cap: float) -> Outcome:
        run = side.start()
        since = inject(run, fault, side.script)
        if fault.target == "launcher":
            return launcher_gone(run, since, cap)
        return finish(run, since, cap, side.message)

    return case


def two_jobs(side: Side, cap: float) -> Outcome:
    """Job A and job B at once; A is stopped (``launchkit kill A``; launch.py has no kill command: SIGTERM
    to A's launcher). The outcome is A's; the message says how B ended."""
    a = side.start()
    a.wait_for(lambda: a.saw("step 3"), 60)
    b = side.start(steps=100)
    b.wait_for(lambda: b.saw("step 3"), 60)
    since = time.monotonic()
    if side.name == "launchkit":
        job = next(ln.split()[2] for ln in a.lines if ln.startswith("launchkit: job "))
        subprocess.run(
            [sys.executable, "-m", "launchkit", "kill", job, "--grace-period", "1"],
            env=side.env,
            capture_output=True,
            timeout=60,
        )
    else:
        os.kill(a.proc.pid, signal.SIGTERM)
    out = finish(a, since, cap, side.message)
    b_out = finish(b, time.monotonic(), cap, side.message)
    b_done = sum(1 for ln in b.lines if "done " in ln)
    out.message = (
        f"A: {out.message} / B: exit {b_out.code}, {b_done} of 2 workers done"
        f"{', processes left: ' + str(b_out.left) if b_out.left else ''}"
    )
    return out


def port_taken(side: Side, cap: float) -> Outcome:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        run = side.start(["--scheduler-port", str(holder.getsockname()[1])])
        return finish(run, time.monotonic(), cap, side.message)


def small_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "lkbench", str(path)], check=True)


def log_dir_full(side: Side, cap: float) -> Outcome:
    logs = Path(side.workdir) / "logs"
    small_tmpfs(logs, "64k")
    try:
        run = side.start(["--log-dir", str(logs)], steps=30, prog=["--chatter", "4000"])
        return finish(run, time.monotonic(), cap, side.message)
    finally:
        subprocess.run(["umount", "-l", str(logs)], check=False)


def checkpoint_full(side: Side, cap: float) -> Outcome:
    ck = Path(side.workdir) / "ck"
    small_tmpfs(ck, "1200k")
    try:
        run = side.start(steps=5, prog=["--size", "200000", "--checkpoint", str(ck / "m.npz")])
        out = finish(run, time.monotonic(), cap, side.message)
        files = sorted(p.name for p in ck.iterdir())
        out.message += f" / files left: {', '.join(files)}"
        return out
    finally:
        subprocess.run(["umount", "-l", str(ck)], check=False)


CKPT_OURS = """
import os, sys, time, numpy as np
from trainer_core.train import checkpoint
d = sys.argv[1]; p = os.path.join(d, "m.npz")
checkpoint.save(p, params={"w": np.ones(200_000, np.float32)}, step=1)
open(os.path.join(d, "filler"), "wb").write(b"0" * 300_000)
t = time.monotonic()
try:
    checkpoint.save(p, params={"w": np.full(250_000, 2, np.float32)}, step=2); said = "saved"
except OSError as e:
    said = f"save raised {type(e).__name__}: {e.strerror}"
took = time.monotonic() - t
try:
    said += f"; left: {sorted(os.listdir(d))}, it loads: step {checkpoint.load(p).step}"
except Exception as e:
    said += f"; left: {sorted(os.listdir(d))}, load raises {type(e).__name__}"
print(f"{took:.3f} {said}")
"""
CKPT_MX = """
import os, sys, time, mxnet as mx
d = sys.argv[1]; p = os.path.join(d, "m.params")
mx.nd.save(p, {"w": mx.nd.ones(200_000)})
open(os.path.join(d, "filler"), "wb").write(b"0" * 300_000)
t = time.monotonic()
try:
    mx.nd.save(p, {"w": mx.nd.ones(250_000) * 2}); said = "saved"
except Exception as e:
    said = f"save raised {type(e).__name__}"
took = time.monotonic() - t
try:
    mx.nd.load(p); said += f"; left: {sorted(os.listdir(d))} ({os.path.getsize(p)} bytes), it loads"
except Exception as e:
    said += f"; left: {sorted(os.listdir(d))} ({os.path.getsize(p)} bytes), load raises {type(e).__name__}"
print(f"{took:.3f} {said}")
"""


def checkpoint_torn(side: Side, cap: float) -> Outcome:
    """The libraries' own checkpoint writers, not a launcher: an 800 kB checkpoint, then the disk fills
    to 100 kB free and a 1 MB one is saved over it. What is left, and does it load?"""
    ck = Path(side.workdir) / "ck"
    small_tmpfs(ck, "1200k")
    try:
        py, code = (sys.executable, CKPT_OURS) if side.name == "launchkit" else (side.mx_py, CKPT_MX)
        res = subprocess.run(
            [py, "-c", code, str(ck)], capture_output=True, text=True, env=side.env, timeout=cap
        )
        took, _, said = res.stdout.strip().partition(" ")
        return Outcome(res.returncode, float(took or 0), said or res.stderr[-200:], 0, 0)
    finally:
        subprocess.run(["umount", "-l", str(ck)], check=False)


K, S = signal.SIGKILL, signal.SIGSTOP
CASES: dict[str, tuple[str, Callable[[Side, float], Outcome], bool]] = {
    # name: (what, how, MXNet's launch.py can be put in the same case)
    "worker-kill9-mid": ("kill -9 of a worker mid-training", signal_case(Fault("worker", K, "mid")), True),
    "server-kill9-mid": ("kill -9 of a server mid-training", signal_case(Fault("server", K, "mid")), True),
    "scheduler-kill9-mid": (
        "kill -9 of the scheduler mid-training",
        signal_case(Fault("scheduler", K, "mid")),
        True,
    ),
    "worker-kill9-start": ("kill -9 of a worker at start-up", signal_case(Fault("worker", K, "start")), True),
    "server-kill9-start": ("kill -9 of a server at start-up", signal_case(Fault("server", K, "start")), True),
    "scheduler-kill9-start": (
        "kill -9 of the scheduler at start-up",
        signal_case(Fault("scheduler", K, "start")),
        True,
    ),
    "worker-stop-mid": ("SIGSTOP of a worker mid-training", signal_case(Fault("worker", S, "mid")), True),
    "server-stop-mid": ("SIGSTOP of a server mid-training", signal_case(Fault("server", S, "mid")), True),
    "scheduler-stop-mid": (
        "SIGSTOP of the scheduler mid-training",
        signal_case(Fault("scheduler", S, "mid")),
        True,
    ),
    "worker-stop-start": ("SIGSTOP of a worker at start-up", signal_case(Fault("worker", S, "start")), True),
    "launcher-kill9-start": (
        "SIGKILL of the launcher at start-up",
        signal_case(Fault("launcher", K, "start")),
        True,
    ),
    "launcher-kill9-mid": (
        "SIGKILL of the launcher mid-training",
        signal_case(Fault("launcher", K, "mid")),
        True,
    ),
    "two-jobs": ("two jobs at once, one stopped", two_jobs, True),
    "port-taken": ("--scheduler-port held by another program", port_taken, False),
    "log-dir-full": ("--log-dir fills up mid-job (64 kB tmpfs)", log_dir_full, False),
    "checkpoint-full": ("the checkpoint's disk fills up (1.2 MB tmpfs)", checkpoint_full, False),
    "checkpoint-torn": (
        "a checkpoint saved over the last one on a full disk (library only)",
        checkpoint_torn,
        True,
    ),
}
