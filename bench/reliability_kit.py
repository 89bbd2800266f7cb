"""The harness of bench/reliability.py: a launcher under test (its output read live), the job's
processes found by a token in their environment, a fault injected, the outcome measured; and the two
sides, launchkit + trainer_core and MXNet 1.9.1's launch.py + ps-lite."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.peers import mxnet_python

REPO = Path(__file__).resolve().parents[1]
TRAINPROG = REPO / "tests" / "faults" / "trainprog.py"
DOC = REPO / "docs" / "reliability.md"
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
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**env, TAG: self.tag},
            cwd=cwd,
            start_new_session=True,
        )
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


def finish(
    run: Run,
    since: float,
    cap: float,
    message: Callable[[list[str]], str],
    elsewhere: Callable[[], int] = lambda: 0,
) -> Outcome:
    """Wait for the launcher's exit (at most ``cap`` s after ``since``; then SIGKILL it alone, as a user
    would end a hung launcher); count what is left 2 s later (here, and ``elsewhere()``: on hosts),
    then end it all."""
    code: int | None
    try:
        code = run.proc.wait(max(0.1, since + cap - time.monotonic()))
        took = time.monotonic() - since
    except subprocess.TimeoutExpired:
        code, took = None, cap
        run.proc.kill()
        run.proc.wait()
    time.sleep(2.0)
    left = len(tagged(run.tag)) + elsewhere()
    job = next((ln.split()[2] for ln in run.lines if ln.startswith("launchkit: job ")), None)
    shm = len(list(Path("/dev/shm").glob(f"launchkit-{job}-*"))) if job else 0
    end_all(run.tag)
    return Outcome(code, took, message(run.lines), left, shm)


def ours_message(lines: list[str]) -> str:
    """launchkit's error line; for a root cause that exited with a code, its last line too."""
    at = next((i for i, ln in enumerate(lines) if ln.startswith("launchkit: error:")), None)
    if at is None:
        return (lines[-1].strip() if lines else "(nothing printed)")[:240]
    text = re.sub(r"job \d{4}-\d{6}-[0-9a-f]{6}", "job ID", lines[at].strip())
    tail = []
    for ln in lines[at + 2 :] if "last lines of" in "".join(lines[at + 1 : at + 2]) else []:
        if not ln.startswith("    "):
            break
        tail.append(ln.strip())
    if tail and "exited with code" in text:
        text += f": {tail[-1]}"
    return text[:240]


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
    return (useful[-1] if useful else "(nothing printed)")[:160]


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
            self.launch_py = str(
                Path(
                    subprocess.run(
                        [
                            self.mx_py,
                            "-c",
                            "import importlib.util as u; print(u.find_spec('mxnet').submodule_search_locations[0])",
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout.strip()
                )
                / "tools"
                / "launch.py"
            )
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
            return [
                sys.executable,
                "-m",
                "launchkit",
                "launch",
                "-n",
                "2",
                "-s",
                "1",
                "--launcher",
                "local",
                "--grace-period",
                "1",
                "--env",
                "PS_HEARTBEAT_INTERVAL:0.5",
                "--env",
                "PS_HEARTBEAT_TIMEOUT:2",
                "--env",
                "PS_START_TIMEOUT:5",
                *extra,
                sys.executable,
                str(TRAINPROG),
                "--steps",
                str(steps),
                "--delay",
                "0.05",
                *prog,
            ]
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
        run = (
            "import runpy, sys, threading; threading.Thread.isAlive = threading.Thread.is_alive; "
            f"sys.argv = {args!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        return [self.mx_py, "-c", run]

    def start(self, extra: Sequence[str] = (), steps: int = 400, prog: Sequence[str] = ()) -> Run:
        return Run(self.argv(extra, steps, prog), self.env, self.workdir)


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
