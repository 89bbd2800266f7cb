"""The rank shim: what a cluster engine (mpirun, srun, qsub) starts in place of the command.

An engine starts N copies of ``python -m launchkit.hostside.shim COMMAND...``; each finds its place in
the job from the engine's rank variable (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``,
``SLURM_PROCID``, 1-based ``SGE_TASK_ID``, ...) and the task table in ``LAUNCHKIT_SHIM_TASKS`` (``tasktable``),
adds that task's variables (role, ranks, task id) to the environment the engine passed by name,
runs the command, and frames its output so that the launcher can split the engine's merged
stream back into processes:

    ``\\x1elk <task> o <line>``   a line of the task's stdout (``e`` for stderr)
    ``\\x1elk <task> s <pid> <host> <engine job> <engine step>``   the command started
    ``\\x1elk <task> x <code> <t>``   it ended with shell-style ``code``; ``t`` is 1 when the shim
                                      was told to stop it (engine teardown), else 0

``<task>`` is the task's index in the plan. Lines longer than ``CHUNK`` (900) bytes are cut into
several framed pieces. The end mark also goes to ``$LAUNCHKIT_SHIM_ENDS/<task>`` (``end_marks``).
The shim exits with the command's code. Signals (TERM, INT, HUP) go to the command's process
group; if the engine's daemon that started the shim goes away, the shim ends the command itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from launchkit.hostside import rendezvous, tasktable

TASKS_VAR = "LAUNCHKIT_SHIM_TASKS"
#: The launcher's --grace-period: SIGKILL this long after the command was asked to stop.
GRACE_VAR = "LAUNCHKIT_SHIM_GRACE"
#: "1": SIGUSR2 means "stop" (Grid Engine's qdel -notify; what Open MPI's mpirun forwards at once).
NOTIFY_VAR = "LAUNCHKIT_SHIM_NOTIFY"
ENDS_VAR = "LAUNCHKIT_SHIM_ENDS"  # the launcher's directory for the end marks (see above)
#: The submitter's PATH again (sge): a login shell's profile may set PATH anew before the shim runs.
PATH_VAR = "LAUNCHKIT_SHIM_PATH"
#: Variables that instruct the shim (and the batch programs) and that the command does not get.
CONTROL_PREFIXES = ("LAUNCHKIT_SHIM_", "LAUNCHKIT_BATCH", "LAUNCHKIT_RENDEZVOUS", "LAUNCHKIT_SECRET_FILE")
MARK = b"\x1elk "
CHUNK = 900  # a framed line stays under 1024 bytes: Slurm forwards task output in 1 KiB messages
GRACE = 5.0
#: Where each engine puts a process's rank, in the order they are tried, and the rank's base.
RANK_VARS = (
    ("LAUNCHKIT_SHIM_RANK", 0),  # set by launchkit.hostside.batchjob for the scheduler it runs itself
    ("OMPI_COMM_WORLD_RANK", 0),
    ("PMIX_RANK", 0),
    ("PMI_RANK", 0),
    ("SLURM_PROCID", 0),
    ("SGE_TASK_ID", 1),
    ("COMPONENT_ID", 0),  # a YARN Service component's instance index (with LAUNCHKIT_SHIM_OFFSET)
)


# -- the line protocol (pure; the launcher imports these) -----------------------------------------
def frame_output(task: int, stream: str, line: bytes) -> list[bytes]:
    """One output line (with or without its newline) as framed lines of at most CHUNK bytes."""
    body = line[:-1] if line.endswith(b"\n") else line
    body = body.replace(b"\x1e", b"")
    pieces = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    head = MARK + f"{task} {stream} ".encode()
    out = [head + p + b"\\\n" for p in pieces[:-1]]  # a trailing backslash: continued
    out.append(head + pieces[-1] + b"\n")
    return out


def frame_event(task: int, kind: str, *fields: object) -> bytes:
    return MARK + f"{task} {kind} {' '.join(str(f) for f in fields)}".encode() + b"\n"


@dataclass(frozen=True)
class Frame:
    """One parsed framed line."""

    task: int
    kind: str  # o, e (output), s (started), x (exited)
    data: bytes  # output bytes, or the event's fields
    continued: bool = False

    def fields(self) -> list[str]:
        return self.data.decode(errors="replace").split()


def parse_frame(line: bytes) -> Frame | None:
    """A framed line back into its parts; None for a line that is not framed (engine output)."""
    at = line.find(MARK)
    if at < 0:
        return None
    rest = line[at + len(MARK) :].rstrip(b"\r\n")
    parts = rest.split(b" ", 2)
    if len(parts) < 2 or not parts[0].isdigit() or parts[1] not in (b"o", b"e", b"s", b"x"):
        return None
    data = parts[2] if len(parts) == 3 else b""
    kind = parts[1].decode()
    continued = kind in ("o", "e") and len(data) == CHUNK + 1 and data.endswith(b"\\")
    if continued:
        data = data[:-1]
    return Frame(int(parts[0]), kind, data, continued)


def engine_rank(environ: Mapping[str, str]) -> int | None:
    """This process's 0-based rank from the engine's variables."""
    for name, base in RANK_VARS:
        value = environ.get(name, "")
        if value.strip().isdigit():
            return int(value) - base
    return None


def task_of(environ: Mapping[str, str]) -> tuple[int, dict[str, str]]:
    """(the plan's task index, the task's own variables) for this rank. ValueError says what is wrong."""
    raw = environ.get(TASKS_VAR)
    if not raw:
        raise ValueError(f"{TASKS_VAR} is not set: the shim runs only under a launchkit engine job")
    rank = engine_rank(environ)
    if rank is None:
        raise ValueError(f"no rank from the engine: none of {', '.join(n for n, _ in RANK_VARS)} is set")
    offset = int(environ.get("LAUNCHKIT_SHIM_OFFSET", "0") or 0)
    try:
        return tasktable.lookup(raw, rank + offset)
    except ValueError as exc:
        raise ValueError(f"{exc} (engine rank {rank} + offset {offset})" if offset else str(exc)) from None


def shim_grace(environ: Mapping[str, str]) -> float:
    """The grace period the launcher passed (``LAUNCHKIT_SHIM_GRACE``), else ``GRACE``."""
    try:
        value = float(environ.get(GRACE_VAR, "") or GRACE)
    except ValueError:
        return GRACE
    return value if 0 <= value < 1e6 else GRACE


def node_address(environ: Mapping[str, str]) -> str:
    """``DMLC_NODE_HOST`` where the plan left it to the node: the interface's address when
    ``DMLC_INTERFACE`` names one, else the address this node reaches the scheduler through."""
    return rendezvous.local_address(environ, environ.get("DMLC_PS_ROOT_URI")) or socket.gethostname()


class Reassembler:
    """Output frames back into whole lines (a long line comes as several continued frames)."""

    def __init__(self) -> None:
        self.partial: dict[tuple[int, str], bytes] = {}

    def line(self, frame: Frame) -> bytes | None:
        """The complete line this output frame ends, or None while it continues."""
        key = (frame.task, frame.kind)
        if frame.continued:
            self.partial[key] = self.partial.get(key, b"") + frame.data
            return None
        return self.partial.pop(key, b"") + frame.data


# -- running the command (effects) ---------------------------------------------------------------
class _Out:
    """Framed writes to one of the shim's own streams, one write per line (atomic in pipes)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.lock = fd, threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock, contextlib.suppress(OSError):
            os.write(self.fd, data)


def _pump(task: int, stream: str, src: int, out: _Out) -> None:
    # buffered: readline returns as soon as a line is complete, without a read() per byte
    with os.fdopen(src, "rb") as f, contextlib.suppress(OSError, ValueError):
        for line in iter(f.readline, b""):
            for piece in frame_output(task, stream, line):
                out.write(piece)


def end_marks(environ: Mapping[str, str], index: int, code: int, stopped: bool) -> None:
    """The task's end mark on both streams (one write each, atomic in a pipe: each says that stream
    is complete), and written whole to ``$LAUNCHKIT_SHIM_ENDS/<task>`` when it is set: the launcher
    reads it there when the engine stops passing output on (Open MPI's mpirun, ending the job
    itself once it sees a rank killed by a signal)."""
    mark = frame_event(index, "x", code, int(stopped))
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.write(fd, mark)
    if where := environ.get(ENDS_VAR):
        with contextlib.suppress(OSError):
            tmp = os.path.join(where, f".{index}.{os.getpid()}")
            with open(tmp, "wb") as f:
                f.write(mark)
            os.replace(tmp, os.path.join(where, str(index)))


def _die_with_shim() -> None:  # pragma: no cover - runs between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _end_job(environ: Mapping[str, str]) -> None:
    """A failed task ends its whole engine job where nothing else would (a detached Grid Engine
    array job): ``LAUNCHKIT_SHIM_ON_FAILURE`` is a JSON argv; ``$JOB_ID`` words become the id."""
    raw = environ.get("LAUNCHKIT_SHIM_ON_FAILURE")
    if not raw:
        return
    with contextlib.suppress(ValueError, TypeError, OSError, subprocess.SubprocessError):
        argv = [environ.get("JOB_ID", "") if w == "$JOB_ID" else str(w) for w in json.loads(raw)]
        # not waited for: this task's own end must be recorded before the engine acts on it
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


class _Guardian:
    """A process in a session of its own, forked before the command starts: if the shim is killed
    outright (SIGKILL, which it cannot pass on), it kills the command's group (``watch``) and writes
    the task's end marks (137), learning of the death from a pipe only the shim holds; ``release``
    ends it (and waits for it) when the shim ends normally, so no guardian is left over."""

    def __init__(self, index: int) -> None:
        self.pid, self.w = 0, -1
        try:
            r, self.w = os.pipe()
            self.pid = os.fork()
        except OSError:
            return
        if self.pid:
            os.close(r)
            return
        try:  # the guardian: no Python cleanup; only the shim's output streams and the pipe kept
            _guardian(index, r, self.w)
        finally:
            os._exit(0)

    def watch(self, group: int) -> None:
        self._say(f"{group}\n".encode())

    def release(self) -> None:
        if self.w < 0:
            return
        self._say(b"x")
        with contextlib.suppress(OSError):
            os.close(self.w)
            os.waitpid(self.pid, 0)
        self.w = -1

    def _say(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(self.w, data)


def _guardian(index: int, r: int, w: int) -> None:  # pragma: no cover - a forked child
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    os.close(w)
    os.dup2(os.open(os.devnull, os.O_RDWR), 0)
    os.dup2(r, 3)
    os.closerange(4, 65536)
    said = b""
    while data := os.read(3, 64):  # EOF without the last word: the shim is gone
        said += data
        if said.endswith(b"x"):
            return  # released: the shim ends normally
    group = said.split(b"\n")[0]
    if group.isdigit():
        _killpg(int(group), signal.SIGKILL)
    end_marks(os.environ, index, 128 + signal.SIGKILL, False)


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def run(argv: list[str], environ: Mapping[str, str]) -> int:
    try:
        index, own = task_of(environ)
    except (ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"launchkit shim: {exc}\n")
        return 2
    guard = _Guardian(index)
    try:
        return _run(argv, environ, index, own, guard)
    finally:
        guard.release()


def _run(
    argv: list[str], environ: Mapping[str, str], index: int, own: dict[str, str], guard: _Guardian
) -> int:
    env = dict(environ)
    env.update(own)
    if env.get(PATH_VAR):
        env["PATH"] = env[PATH_VAR]
    try:
        rendezvous.resolve(env)
    except (OSError, TimeoutError) as exc:
        sys.stderr.write(f"launchkit shim: {exc}\n")
        guard.release()
        end_marks(environ, index, 1, False)
        _end_job(environ)  # without its scheduler the job cannot run: end it, do not let it wait
        return 1
    if env.get("DMLC_NODE_HOST") == "":
        env["DMLC_NODE_HOST"] = node_address(env)
    for name in [k for k in env if k.startswith(CONTROL_PREFIXES)]:
        del env[name]  # the shim's own instructions are not the command's business
    out, err = _Out(1), _Out(2)
    stop = {"asked": 0.0}
    started: list[int] = []  # the child's pid, once there is one

    # LAUNCHKIT_SHIM_NOTIFY=1: SIGUSR2 (qdel -notify's, Open MPI's forwarded stop) means "stop";
    # SIGUSR1 (qdel's announced suspension, which SIGSTOP then does) is not passed on
    notify = environ.get(NOTIFY_VAR) == "1"
    stopping = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP} | ({signal.SIGUSR2} if notify else set())

    def on_signal(signum: int, _frame: object) -> None:
        if notify and signum == signal.SIGUSR1:
            return
        if signum in stopping:
            if stop["asked"]:
                return  # one stop is passed on once (the engine and the launcher may both send it)
            stop["asked"] = time.monotonic()
        forward = signal.SIGTERM if notify and signum == signal.SIGUSR2 else signum
        for pid in started:
            _killpg(pid, forward)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    try:
        o_r, o_w = os.pipe()
        e_r, e_w = os.pipe()
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=o_w,
            stderr=e_w,
            start_new_session=True,
            preexec_fn=_die_with_shim,
        )
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        where = f" (PATH={env.get('PATH', '')})" if code == 127 and "/" not in argv[0] else ""
        for piece in frame_output(
            index, "e", f"cannot start {argv[0]!r}: {exc.strerror or exc}{where}".encode()
        ):
            err.write(piece)
        guard.release()
        end_marks(environ, index, code, False)
        return code
    started.append(child.pid)
    guard.watch(child.pid)
    if stop["asked"]:  # a signal came while it was starting
        _killpg(child.pid, signal.SIGTERM)
    os.close(o_w)
    os.close(e_w)
    job = env.get("SLURM_JOB_ID") or env.get("JOB_ID") or "-"
    step = env.get("SLURM_STEP_ID") or "-"
    out.write(frame_event(index, "s", child.pid, socket.gethostname(), job, step))
    pumps = [
        threading.Thread(target=_pump, args=(index, "o", o_r, out), daemon=True),
        threading.Thread(target=_pump, args=(index, "e", e_r, err), daemon=True),
    ]
    for t in pumps:
        t.start()

    parent = os.getppid()
    grace = shim_grace(environ)
    while child.poll() is None:
        if not stop["asked"] and os.getppid() != parent:  # the engine's daemon is gone
            stop["asked"] = time.monotonic()
            _killpg(child.pid, signal.SIGTERM)
        if stop["asked"] and time.monotonic() - stop["asked"] > grace:
            _killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(0.1)
    _killpg(child.pid, signal.SIGKILL)  # what the command left in its group
    for t in pumps:
        t.join(2.0)
    rc = child.returncode
    code = 128 - rc if rc < 0 else rc
    guard.release()  # before the end marks: nothing of the task is left once they are read
    end_marks(environ, index, code, bool(stop["asked"]))
    if code and not stop["asked"]:  # after the end marks: this failure is the job's root cause
        _end_job(environ)
    return code


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m launchkit.hostside.shim COMMAND [ARGS...]\n")
        return 2
    return run(argv, os.environ)


if __name__ == "__main__":
    raise SystemExit(main())
