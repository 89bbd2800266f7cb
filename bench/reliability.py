"""Fault injection, measured: launchkit + trainer_core beside MXNet 1.9.1's tools/launch.py + ps-lite.

    python -m bench.reliability [--repeat 3] [--cap 60] [--only CASE,...] [--json out.json]

Each case starts a real dist_sync job (2 workers, 1 server, --launcher local), injects one fault
and measures, from the fault to the launcher's exit: the exit code, the seconds (median over
``--repeat`` runs for launchkit; MXNet's runs once per case, since a hang is a hang), whether the
root cause is named, and what is left 2 s after the launcher has gone (processes of the job, and
/dev/shm segments). A launcher still running ``--cap`` seconds after the fault counts as hung and is
killed then, with everything it started (found by a token in their environment).

The programs do the same on both sides: push and pull a 1000-float array per step, 0.05 s apart,
printing ``step K``. launchkit's is tests/faults/trainprog.py; MXNet's is below. Both get the
ps-lite heartbeat knobs (trainer_core: every 0.5 s, 2 s timeout; ps-lite takes whole seconds: 1
and 2); trainer_core also gets PS_START_TIMEOUT=5 (ps-lite has no such bound). MXNet's
``launch.py`` needs ``Thread.isAlive`` restored on Python 3.9+ (it is, before it runs unchanged).

The ssh cases (``ssh-*``: a link down, a host unreachable, SIGKILL during rsync) run on three
network-namespace hosts and need root: see bench/reliability_ssh.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.peers import mxnet_python

REPO = Path(__file__).resolve().parents[1]
TRAINPROG = REPO / "tests" / "faults" / "trainprog.py"
TAG = "LKBENCH_TAG"

MXPROG = textwrap.dedent(
    """
    import sys, time
    import mxnet as mx
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    kv = mx.kv.create("dist_sync")
    kv.init(3, mx.nd.zeros(1000))
    out = mx.nd.zeros(1000)
    for step in range(steps):
        kv.push(3, mx.nd.ones(1000))
        kv.pull(3, out=out)
        out.wait_to_read()
        print("step %d" % (step + 1), flush=True)
        time.sleep(0.05)
    print("done %d %s" % (kv.rank, out.asnumpy()[0]), flush=True)
    """
)


@dataclass
class Outcome:
    code: int | None  # None: hung, killed at the cap
    seconds: float
    message: str  # the line that says what happened (launchkit's error line, else the last line)
    left: int  # processes of the job still running 2 s after the launcher's exit
    shm: int
    gone: bool = True  # with the launcher SIGKILLed: every process of the job ended within the cap


@dataclass(frozen=True)
class Fault:
    target: str  # worker, server, scheduler, launcher
    sig: int
    when: str  # start (as soon as the process exists) or mid (after "step 3")


def tagged(tag: str) -> list[int]:
    """Live processes whose environment holds ``LKBENCH_TAG=tag`` (ours: a fresh token per run)."""
    needle, found = f"{TAG}={tag}".encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def program_pid(tag: str, role: str, script: str) -> int | None:
    """The python process (not a shell around it) of ``role`` running ``script``, the highest rank."""
    best = None
    for pid in tagged(tag):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        python = Path(argv[0].decode()).name.startswith("python")
        if (
            f"DMLC_ROLE={role}".encode() in env
            and python
            and any(a.decode().endswith(script) for a in argv[1:])
        ):
            best = pid if best is None else max(best, pid)
    return best


def end_all(tag: str) -> None:
    for pid in tagged(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)


class Run:
    """One launcher under test, its output (stdout and stderr) read live."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.tag = secrets.token_hex(6)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL, env={**env, TAG: self.tag}, cwd=cwd,
                                     start_new_session=True)  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout or []), daemon=True).start()

    def wait_for(self, pred: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if pred():
                return True
            time.sleep(0.02)
        return pred()

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))


def inject(run: Run, fault: Fault, script: str) -> float:
    """Wait for the moment, send the signal; returns when."""
    if fault.when == "mid" and not run.wait_for(lambda: run.saw("step 3"), 60):
        raise SystemExit("the job never reached step 3:\n" + "".join(run.lines[-30:]))
    if fault.target == "launcher":
        if fault.when == "start":
            run.wait_for(lambda: program_pid(run.tag, "scheduler", script) is not None, 30)
        pid: int | None = run.proc.pid
    else:
        found: dict[str, int | None] = {}

        def appeared() -> bool:
            found["pid"] = program_pid(run.tag, fault.target, script)
            return found["pid"] is not None

        run.wait_for(appeared, 30)
        pid = found.get("pid")
    if not pid:
        raise SystemExit(f"no {fault.target} process appeared:\n" + "".join(run.lines[-30:]))
    os.kill(pid, fault.sig)
    return time.monotonic()


def finish(run: Run, since: float, cap: float, message: Callable[[list[str]], str]) -> Outcome:
    """Wait for the launcher's exit (at most ``cap`` s after ``since``; then SIGKILL it alone, as a user
    would end a hung launcher); count what is left 2 s later, then end it all."""
    code: int | None
    try:
        code = run.proc.wait(max(0.1, since + cap - time.monotonic()))
        took = time.monotonic() - since
    except subprocess.TimeoutExpired:
        code, took = None, cap
        run.proc.kill()
        run.proc.wait()
    time.sleep(2.0)
    left = len(tagged(run.tag))
    job = next((ln.split()[2] for ln in run.lines if ln.startswith("launchkit: job ")), None)
    shm = len(list(Path("/dev/shm").glob(f"launchkit-{job}-*"))) if job else 0
    end_all(run.tag)
    return Outcome(code, took, message(run.lines), left, shm)


def ours_message(lines: list[str]) -> str:
    """launchkit's error line, with the trainer_core scheduler's abort reason when there is one."""
    errors = [ln.strip() for ln in lines if ln.startswith("launchkit: error:")]
    aborts = [ln.split("aborting the job: ", 1)[1].strip() for ln in lines if "aborting the job: " in ln]
    text = errors[0] if errors else (lines[-1].strip() if lines else "")
    return (text + (f" (scheduler: {aborts[0]})" if aborts else ""))[:240]


def mx_message(lines: list[str]) -> str:
    """The tracker's or ps-lite's own word on it: a RuntimeError of a tracker thread (its env dump cut),
    a failed check, else the last line that is not the program's own output."""
    useful = [
        ln.strip()
        for ln in lines
        if ln.strip() and "step " not in ln and not ln.startswith(("done ", "Warning: Permanently added"))
    ]
    for key in ("RuntimeError:", "Check failed", "Error"):
        for ln in useful:
            if key in ln and "raise " not in ln:
                return ln.split(" on [")[0][:160]
    return (useful[-1] if useful else "(nothing)")[:160]


class Side:
    """How one launcher runs the job: its argv (``extra`` launcher flags first), environment, output."""

    def __init__(self, name: str, workdir: str) -> None:
        self.name, self.workdir = name, workdir
        self.home = Path(workdir) / "lkhome"
        if name == "launchkit":
            self.script = TRAINPROG.name
            self.env = {
                **os.environ,
                "PYTHONPATH": str(REPO),
                "LAUNCHKIT_HOME": str(self.home),
                "NO_COLOR": "1",
            }
            self.message = ours_message
        else:
            self.mx_py = mxnet_python()
            self.launch_py = str(Path(subprocess.run(
                [self.mx_py, "-c", "import importlib.util as u; print(u.find_spec('mxnet').submodule_search_locations[0])"],
                capture_output=True, text=True, check=True).stdout.strip()) / "tools" / "launch.py")  # fmt: skip
            (Path(workdir) / "mxprog.py").write_text(MXPROG)
            self.script = "mxprog.py"
            self.env = {
                **os.environ,
                "DMLC_INTERFACE": "lo",
                "PS_HEARTBEAT_INTERVAL": "1",
                "PS_HEARTBEAT_TIMEOUT": "2",
            }
            self.message = mx_message

    def argv(self, extra: Sequence[str] = (), steps: int = 400, prog: Sequence[str] = ()) -> list[str]:
        if self.name == "launchkit":
            return [sys.executable, "-m", "launchkit", "launch", "-n", "2", "-s", "1", "--launcher", "local",
                    "--grace-period", "1", "--env", "PS_HEARTBEAT_INTERVAL:0.5", "--env", "PS_HEARTBEAT_TIMEOUT:2",
                    "--env", "PS_START_TIMEOUT:5", *extra, sys.executable, str(TRAINPROG), "--steps", str(steps),
                    "--delay", "0.05", *prog]  # fmt: skip
        args = [
            self.launch_py,
            "-n",
            "2",
            "-s",
            "1",
            "--launcher",
            "local",
            *extra,
            self.mx_py,
            "mxprog.py",
            str(steps),
        ]
        run = ("import runpy, sys, threading; threading.Thread.isAlive = threading.Thread.is_alive; "
               f"sys.argv = {args!r}; runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
        return [self.mx_py, "-c", run]

    def start(self, extra: Sequence[str] = (), steps: int = 400, prog: Sequence[str] = ()) -> Run:
        return Run(self.argv(extra, steps, prog), self.env, self.workdir)


def signal_case(fault: Fault) -> Callable[[Side, float], Outcome]:
    def case(side: Side, cap: float) -> Outcome:
        run = side.start()
        since = inject(run, fault, side.script)
        if fault.target == "launcher":
            return launcher_gone(run, since, cap)
        return finish(run, since, cap, side.message)

    return case


def launcher_gone(run: Run, since: float, cap: float) -> Outcome:
    """The launcher was SIGKILLed: the seconds until none of the job's processes is left (the cap when
    some still are), and how many there were 2 s after the kill."""
    run.proc.wait()
    left, gone = None, None
    while time.monotonic() - since < cap:
        alive = tagged(run.tag)
        if left is None and time.monotonic() - since >= 2.0:
            left = len(alive)
        if not alive:
            gone = time.monotonic() - since
            break
        time.sleep(0.05)
    end_all(run.tag)
    what = "nothing printed: the launcher is gone"
    return Outcome(-9, gone if gone is not None else cap, what, left or 0, 0, gone=gone is not None)


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
        subprocess.run([sys.executable, "-m", "launchkit", "kill", job, "--grace-period", "1"], env=side.env,
                       capture_output=True, timeout=60)  # fmt: skip
    else:
        os.kill(a.proc.pid, signal.SIGTERM)
    out = finish(a, since, cap, side.message)
    b_out = finish(b, time.monotonic(), cap, side.message)
    b_done = sum(1 for ln in b.lines if "done " in ln)
    out.message = (f"A: {out.message} / B: exit {b_out.code}, {b_done} of 2 workers done"
                   f"{', processes left: ' + str(b_out.left) if b_out.left else ''}")  # fmt: skip
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


SSH_CASES = (
    "ssh-link-down-mid",
    "ssh-host-unreachable",
    "ssh-sigkill-during-rsync",
)  # bench/reliability_ssh.py
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


def fmt(o: Outcome | None, median_s: float | None = None) -> tuple[str, str, str]:
    """(what happened, seconds, message) for the table."""
    if o is None:
        return "not applicable", "", ""
    secs = f"{median_s if median_s is not None else o.seconds:.2f}"
    if o.code == -9:  # the launcher itself was killed
        left = f"{o.left} process(es) running 2 s later" if o.left else "nothing left after 2 s"
        if not o.gone:
            return (
                f"launcher killed; {left}, some still after {o.seconds:.0f} s",
                f"> {o.seconds:.0f}",
                o.message,
            )
        return f"launcher killed; {left}", secs + " until none left", o.message
    code = "hangs, killed at the cap" if o.code is None else f"exit {o.code}"
    left = f"{o.left} process(es) left" if o.left else "nothing left"
    if o.code is None:
        left += " once the launcher was killed"
    if o.shm:
        left += f", {o.shm} /dev/shm segment(s)"
    return (
        f"{code}; {left}",
        (secs if o.code is not None else f"> {o.seconds:.0f}"),
        o.message.replace("|", "/"),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="launchkit runs per case (median)")
    ap.add_argument(
        "--cap", type=float, default=60.0, help="seconds after the fault before a launcher counts as hung"
    )
    ap.add_argument(
        "--only", default=",".join([*CASES, *SSH_CASES]), help="cases, comma-separated (ssh-*: root)"
    )
    ap.add_argument("--no-mxnet", action="store_true")
    ap.add_argument("--json", help="also write the raw outcomes here")
    args = ap.parse_args()
    raw: dict[str, dict[str, list[dict[str, object]]]] = {}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        ours = Side("launchkit", d)
        mx = None if args.no_mxnet else Side("mxnet", d)
        for name in args.only.split(","):
            print(f"[reliability] {name} ...", file=sys.stderr, flush=True)
            if name.startswith("ssh-"):
                from bench import reliability_ssh as remote

                what = remote.CASES[name][0]
                runs = [remote.run_case(name, ours, Path(d), args.cap) for _ in range(args.repeat)]
                theirs = None if mx is None else remote.run_case(name, mx, Path(d), args.cap)
            else:
                what, how, comparable = CASES[name]
                runs = [how(ours, args.cap) for _ in range(args.repeat)]
                theirs = how(mx, args.cap) if mx is not None and comparable else None
            raw[name] = {"launchkit": [asdict(r) for r in runs], "mxnet": [asdict(theirs)] if theirs else []}
            median = statistics.median(r.seconds for r in runs)
            rows.append((what, fmt(runs[0], median), fmt(theirs)))
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; launchkit: median of {args.repeat} runs; "
          f"MXNet 1.9.1 launch.py: one run, capped at {args.cap:g} s after the fault")  # fmt: skip
    print(
        "| case | launchkit + trainer_core | s | its message | MXNet launch.py + ps-lite | s | its message |"
    )
    print("|---|---|---|---|---|---|---|")
    for what, o, t in rows:
        print(
            f"| {what} | {o[0]} | {o[1]} | `{o[2]}` | {t[0]} | {t[1]} | {'`' + t[2] + '`' if t[2] else ''} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
