"""``--launcher sge``: the whole job as one Grid Engine array job.

Task ``k`` (1-based ``SGE_TASK_ID``) runs row ``k-1`` of the shim's table: the scheduler first,
then the servers, then the workers. Grid Engine places the tasks; the scheduler's task
publishes its address and port in the job's directory on the shared filesystem and the others
wait for it (``launchkit.hostside.rendezvous``), so a ``--detach``ed job needs nothing from the launcher.
Worker 0's task likewise publishes its address and two ports there (``worker0``): torch's
``MASTER_*`` and, without servers (no scheduler task), the rendezvous it serves.
The job secret travels in a file only the user can read, never in the job's environment (which
``qstat -j`` shows to every user). One array job, not one job per role: one submission, one id
to follow, cancel and show. See docs/backends.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import dmlc_env
from dmlc_env import merge_env
from launchkit.backends.batch import BatchBackend, BatchRun, engine_said, not_available
from launchkit.backends.engine import EngineRun, engine_env
from launchkit.backends.engineflags import NODE_PYTHON
from launchkit.backends.hostlists import pe_hostfile
from launchkit.backends.sgeoptions import FLAGS, SgeOptions, parse_pe
from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import fill
from launchkit.core.spec import Host, LaunchSpec, Plan, Task
from launchkit.errors import UsageError
from launchkit.hostside import rendezvous, shim

#: Also passed by name: what a task needs to find python and its libraries.
PASSED_THROUGH = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")


def placeholder_hosts(n: int) -> tuple[Host, ...]:
    """Grid Engine places every task itself: one placeholder per task."""
    return tuple(Host(f"<sge task {i}>") for i in range(1, n + 1))


def scheduler_first(plan: Plan) -> list[Task]:
    """Task 1 is the scheduler: Grid Engine dispatches an array's tasks in order, so with fewer
    free slots than tasks the scheduler still starts, and the others do not wait for it in vain."""
    order = {"scheduler": 0, "server": 1, "worker": 2}
    return sorted(plan.tasks, key=lambda t: (order[t.role], t.rank))


def job_dir(cwd: str, job_id: str) -> str:
    """Output, the scheduler's address and the secret file: on the filesystem the tasks share."""
    return str(Path(cwd) / f"launchkit-{job_id}")


def job_name(job_id: str) -> str:
    return f"lk-{job_id}"  # Grid Engine job names may not start with a digit


def task_env(plan: Plan, directory: str) -> dict[str, str]:
    """What every task gets by name (``-v``): the shared contract values without the secret,
    the shim's table, and where the secret and the scheduler's address are."""
    env = engine_env(plan, scheduler_first(plan))
    env.pop(dmlc_env.LAUNCHKIT_JOB_SECRET, None)
    env[dmlc_env.DMLC_PS_ROOT_URI] = ""
    env[dmlc_env.DMLC_PS_ROOT_PORT] = "0"
    if any(t.role == "scheduler" for t in plan.tasks):
        env[rendezvous.RENDEZVOUS_VAR] = f"{directory}/scheduler"
    env[rendezvous.WORKER0_VAR] = f"{directory}/worker0"  # worker 0's address and ports
    env[rendezvous.SECRET_FILE_VAR] = f"{directory}/secret"
    env["LAUNCHKIT_SHIM_NOTIFY"] = "1"
    env["LAUNCHKIT_SHIM_ON_FAILURE"] = '["qdel", "$JOB_ID"]'  # a failed task ends the array job
    return env


def qsub_argv(plan: Plan, opts: SgeOptions, names: list[str], directory: str, cwd: str) -> list[str]:
    """The submission: one array job with a task per process, its script on stdin. Pure."""
    argv = ["qsub", "-terse", "-N", job_name(plan.job_id), "-t", f"1-{len(plan.tasks)}", "-wd", cwd]
    argv += ["-o", f"{directory}/task-$TASK_ID.out", "-j", "y", "-S", "/bin/sh", "-notify", "-r", "n"]
    argv += ["-C", ""]  # no `#$` directives read from the script: its words are the command's
    argv += ["-v", ",".join(names)]
    if opts.queue:
        argv += ["-q", opts.queue]
    if opts.pe:
        name, slots = parse_pe(opts.pe)
        argv += ["-pe", name, str(slots)]
    for res in opts.resources:
        argv += ["-l", res]
    return [*argv, *opts.extra]


def job_script(python: str, task: Task) -> str:
    """The array job's script (Grid Engine runs it with /bin/sh). Every word quoted."""
    words = shlex.join([python, "-m", "launchkit.hostside.shim", "--", *task.argv])
    return f"#!/bin/sh\n# launchkit array job: task $SGE_TASK_ID runs row SGE_TASK_ID-1 of the shim's table\nexec {words}\n"


def parse_qacct(text: str) -> dict[int, int]:
    """``qacct -j ID`` -> {task id: exit code}. A task Grid Engine failed to run (``failed``
    set, ``exit_status`` 0) counts as 1."""
    codes: dict[int, int] = {}
    for block in re.split(r"^=+\s*$", text, flags=re.M):
        fields = dict(
            (m.group(1), m.group(2).strip()) for m in re.finditer(r"^(\w+)\s+(.*)$", block, flags=re.M)
        )
        if "exit_status" not in fields:
            continue
        task = fields.get("taskid", "1")
        try:
            tid = int(task) if task.isdigit() else 1
            status = int(fields["exit_status"].split()[0])
            failed = int(fields.get("failed", "0").split()[0])
        except ValueError:
            continue
        codes[tid] = status if status or not failed else 1
    return codes


def job_code(codes: dict[int, int]) -> int:
    """The array job's code: its first failed task's, by task id."""
    return next((codes[t] for t in sorted(codes) if codes[t]), 0)


def error_state(qstat_text: str, job: str) -> bool:
    """Does ``qstat``'s listing show the job in an error state (``Eqw``: it will never run)?"""
    for line in qstat_text.splitlines():
        words = line.split()
        if len(words) > 4 and words[0] == job and "E" in words[4]:
            return True
    return False


def task_states(qstat_text: str, job: str) -> tuple[list[int], list[int]]:
    """(running, pending) task ids of ``job`` in ``qstat -g d`` (one line per array task)."""
    running: list[int] = []
    pending: list[int] = []
    for line in qstat_text.splitlines():
        words = line.split()
        if len(words) > 5 and words[0] == job and words[-1].isdigit():
            (pending if "q" in words[4] else running).append(int(words[-1]))
    return running, pending


def scheduling_info(qstat_j_text: str) -> str:
    """Grid Engine's reason a job waits: the first line of ``qstat -j``'s ``scheduling info``
    (given with the scheduler's ``schedd_job_info true``); empty when it gives none."""
    for line in qstat_j_text.splitlines():
        if line.startswith("scheduling info:"):
            return line.split(":", 1)[1].strip()
    return ""


def queue_slots(qstat_gc_text: str) -> dict[str, int]:
    """Each cluster queue's slots in all (``qstat -g c``'s TOTAL column)."""
    slots: dict[str, int] = {}
    for line in qstat_gc_text.splitlines():
        words = line.split()
        if len(words) >= 6 and words[5].isdigit() and not line.startswith(("CLUSTER", "-")):
            slots[words[0]] = int(words[5])
    return slots


def slots_short(plan: Plan, opts: SgeOptions, slots: dict[str, int]) -> str | None:
    """Why the array job can never run all its tasks at once on these queues, or None."""
    per_task = parse_pe(opts.pe)[1] if opts.pe else 1
    need = len(plan.tasks) * per_task
    queues = [q.split("@")[0] for q in opts.queue.split(",")] if opts.queue else list(slots)
    if not queues or any(q not in slots for q in queues):
        return None  # a queue qstat does not list: nothing is known
    have = sum(slots[q] for q in set(queues))
    if have >= need:
        return None
    counts = (
        f"1 scheduler + {len(plan.by_role('server'))} server(s) + {len(plan.by_role('worker'))} worker(s)"
    )
    where = (
        f"queue {', '.join(sorted(set(queues)))} has"
        if opts.queue
        else f"the queues ({', '.join(sorted(slots))}) have"
    )
    each = f" x {per_task} slots (--pe)" if per_task > 1 else ""
    return (
        f"--launcher sge: the job is one array job whose {len(plan.tasks)} tasks ({counts}{each}) must all "
        f"run at once: it needs {need} slots, but {where} {have} in all; it would wait for ever. "
        "Use fewer servers or workers, or a queue with more slots (--queue)"
    )


def check_slots(plan: Plan, opts: SgeOptions, env: Mapping[str, str] | None = None) -> None:
    """Refuse (exit 2) a job the queues can never run at once, where ``qstat -g c`` tells, and
    one no Grid Engine here can take (``qstat`` missing or failing: no qmaster answers)."""
    try:
        shown = _run(["qstat", "-g", "c"], env)
    except FileNotFoundError:
        raise not_available("sge", "qstat is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise not_available("sge", "qstat -g c did not answer in 30 s") from None
    if shown.returncode != 0:
        raise not_available("sge", engine_said("qstat -g c", shown))
    why = slots_short(plan, opts, queue_slots(shown.stdout))
    if why:
        raise UsageError(why)


def _run(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=30, env=None if env is None else dict(env)
    )


def job_status(job: str, env: Mapping[str, str] | None = None) -> tuple[str, int | None]:
    """(state, exit code once ended): ``qstat -j`` while it exists, then ``qacct``."""
    try:
        shown = _run(["qstat", "-j", job], env)
        if shown.returncode == 0:
            listing = _run(["qstat", "-g", "d"], env).stdout
            if error_state(listing, job):
                return "ERROR", None
            running, pending = task_states(listing, job)
            if pending and running:  # some wait while the others run (and wait for them)
                ids = ", ".join(map(str, pending[:5])) + (", ..." if len(pending) > 5 else "")
                why = scheduling_info(shown.stdout) or "no free slot"
                return (
                    f"RUNNING {len(running)} of {len(running) + len(pending)} tasks; task(s) {ids} pending: {why}",
                    None,
                )
            return ("PENDING" if pending else "QUEUED_OR_RUNNING"), None
        if "do not exist" not in (shown.stderr + shown.stdout):
            return "UNKNOWN", None  # qmaster busy or unreachable: ask again later
        acct = _run(["qacct", "-j", job], env)
    except (OSError, subprocess.SubprocessError):
        return "UNKNOWN", None
    codes = parse_qacct(acct.stdout) if acct.returncode == 0 else {}
    return "ENDED", job_code(codes) if codes else 0


def end_argv(job: str) -> list[str]:
    """End the whole job, Grid Engine's way (with -notify: SIGUSR2, then SIGKILL)."""
    return ["qdel", job]


class QsubRun(BatchRun):
    """A Grid Engine array job: state from qstat (then qacct), output in one file per task."""

    engine = "sge"

    def __init__(self, *args: Any, directory: str, secret: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.directory = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = Path(directory, "secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret)

    def parse_submit(self, stdout: str) -> str:
        return stdout.strip().split(".")[0]  # "123.1-5:1" for an array job

    def poll(self) -> tuple[str, int | None]:
        assert self.job_id is not None
        state, code = job_status(self.job_id, self.env)
        if state == "ERROR":  # never going to run: say why, and end it
            why = _run(["qstat", "-j", self.job_id], self.env).stdout
            reason = next((ln.strip() for ln in why.splitlines() if "error reason" in ln), "an error state")
            if self.say is not None:
                self.say(f"sge job {self.job_id} cannot run: {reason}")
            for argv in self.cancel_argv(signal.SIGKILL):
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    _run(argv, self.env)
            return state, 1
        if code is not None:
            forget_files(self.directory)
        return ("RUNNING" if state == "QUEUED_OR_RUNNING" else state), code

    def describe_state(self, state: str) -> str:
        return "running" + state[7:] if state.startswith("RUNNING ") else state.lower()

    def output_location(self) -> str:
        return self.directory

    def output_files(self) -> list[str]:
        with contextlib.suppress(OSError):
            return sorted(str(p) for p in Path(self.directory).glob("task-*.out"))
        return []

    def cancel_argv(self, sig: int) -> list[list[str]]:
        assert self.job_id is not None
        # qdel: with -notify the tasks get SIGUSR2 (the shim ends its command: TERM, then KILL
        # after the grace period) before Grid Engine's SIGKILL
        return [end_argv(self.job_id)] if sig != signal.SIGKILL else [["qdel", "-f", self.job_id]]


def forget_files(directory: str) -> None:
    """The secret and the scheduler's address are not needed once the job has ended."""
    for name in ("secret", "scheduler", "worker0"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))


class SgeBackend(BatchBackend):
    name = "sge"
    engine_label = "sge"
    capabilities = Capabilities(
        hosts="per task",
        hostfile_ignored="Grid Engine places the tasks",
        detaches=True,
        options=frozenset({"sge", "node_python", "console"}),
        flags=(*FLAGS, NODE_PYTHON),
        gives_hosts="PE_HOSTFILE",
        elastic="shrink",  # workers may leave; none can join a running allocation
    )

    @classmethod
    def flag_options(cls, flags: Mapping[str, Any], spec: LaunchSpec) -> dict[str, Any]:
        return {"sge": SgeOptions(**fill(FLAGS, flags)), "node_python": NODE_PYTHON.value(flags)}

    @classmethod
    def given_hosts(cls, environ: Mapping[str, str]) -> tuple[str, list[Host]]:
        return pe_hostfile(environ)

    def __init__(
        self, *, sge: SgeOptions | None = None, node_python: str | None = None, console: object = None
    ):
        super().__init__(console)
        base = sge or SgeOptions()
        self.opts = replace(base, python=node_python or base.python)
        if self.opts.pe:
            parse_pe(self.opts.pe)

    def finds_scheduler_address(self) -> bool:
        return True

    def node_hosts(self, spec: LaunchSpec) -> dict[Host, str] | None:
        return dict.fromkeys(spec.hosts, "")

    def engine_runs(self, task: Task) -> bool:
        return True

    def node_unknown(self, task: Task) -> bool:
        return True

    def _names(self, plan: Plan, directory: str) -> list[str]:
        env = task_env(plan, directory)
        names = {*env, *(n for n in PASSED_THROUGH if n in os.environ)}
        return sorted(names | ({shim.PATH_VAR} if "PATH" in names else set()))

    def _qsub(self, plan: Plan) -> list[str]:
        cwd = plan.tasks[0].cwd
        directory = job_dir(cwd, plan.job_id)
        return qsub_argv(plan, self.opts, self._names(plan, directory), directory, cwd)

    def describe(self, task: Task) -> list[str]:
        return [self.opts.python, "-m", "launchkit.hostside.shim", "--", *task.argv]

    def describe_job(self, plan: Plan) -> list[list[str]]:
        return [self._qsub(plan)]

    def notes(self, plan: Plan) -> list[str]:
        return [
            "one array job; task k runs row k-1 (the scheduler, servers, workers); the "
            "scheduler's task publishes its address in the job's directory",
            f"the job script, on qsub's stdin: {job_script(self.opts.python, plan.tasks[0]).splitlines()[-1]}",
        ]

    def prepare(self, plan: Plan) -> None:
        check_slots(plan, self.opts)  # before anything is submitted
        super().prepare(plan)

    def make_run(self, plan: Plan) -> EngineRun:
        cwd = plan.tasks[0].cwd
        directory = job_dir(cwd, plan.job_id)
        env = merge_env(os.environ, task_env(plan, directory))
        env.pop(dmlc_env.LAUNCHKIT_JOB_SECRET, None)
        if "PATH" in env:  # again under the shim's name: a login shell's profile sets PATH anew
            env[shim.PATH_VAR] = env["PATH"]
        secret = plan.tasks[0].env.get(dmlc_env.LAUNCHKIT_JOB_SECRET, secrets.token_hex(32))
        self.batch = QsubRun(
            self._qsub(plan),
            job_script(self.opts.python, plan.tasks[0]),
            env,
            cwd,
            self.say,
            directory=directory,
            secret=secret,
        )
        return self.batch

    def close(self) -> None:
        super().close()
        if self.batch is not None:
            forget_files(self.batch.output_location())
