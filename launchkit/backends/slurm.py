"""``--launcher slurm``: the job as ``srun`` steps of a Slurm allocation.

Inside an allocation (``SLURM_JOB_ID`` set, e.g. under ``salloc``) the launcher runs
``launchkit.hostside.batchjob`` here: the scheduler on this machine, the servers and the workers as one
``srun`` step each on the allocated nodes. Outside one it submits the same program as a batch
job (``sbatch --parsable``); the scheduler then runs on the batch job's first node, so a
``--detach``ed job needs nothing from the launcher. Either way every task runs under the shim,
and its framed output comes back through srun (or the batch output file) to the supervisor.
See docs/backends.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import dmlc_env
from dmlc_env import merge_env
from launchkit.backends.batch import BatchBackend, BatchRun
from launchkit.backends.engine import (
    EngineProcess,
    EngineRun,
    PopenRun,
    engine_env,
    scheduler_last,
)
from launchkit.backends.engineflags import NODE_PYTHON, ROLE_RESOURCES
from launchkit.backends.hostlists import slurm_allocation
from launchkit.backends.slurmoptions import FLAGS, NODES, SlurmOptions, options_from_flags, parse_mem
from launchkit.backends.worker0file import forget_worker0, worker0_file
from launchkit.core.capabilities import Capabilities
from launchkit.core.spec import Host, LaunchSpec, Plan, Task
from launchkit.errors import UsageError
from launchkit.hostside import batchjob, rendezvous, shim, tasktable
from launchkit.hostside.netif import route_address

#: Slurm end states -> exit codes (docs/exit-codes.md); FAILED uses the job's own code.
STATE_CODES = {
    "COMPLETED": 0,
    "TIMEOUT": 124,
    "DEADLINE": 124,
    "CANCELLED": 143,
    "PREEMPTED": 143,
    "OUT_OF_MEMORY": 137,
    "NODE_FAIL": 255,
    "BOOT_FAIL": 255,
}
FINAL_STATES = {*STATE_CODES, "FAILED", "SPECIAL_EXIT", "REVOKED"}
UNKNOWN = "UNKNOWN"  # Slurm did not answer this time
#: Slurm's own account of steps ending (the launcher reports every process's end itself)
NOISE = re.compile(
    r"^(slurmstepd(-\S+)?: error: \*\*\* STEP \S+ ON \S+ CANCELLED AT \S+ \*\*\*"
    r"|srun: error: \S+: tasks? [\d,-]+: (Exited with exit code \d+|Killed|Terminated)"
    r"|srun: launch/slurm: _step_signal: Terminating StepId=\S+"
    r"|srun: Job step aborted: Waiting up to \d+ seconds for job step to finish\."
    r"|srun: forcing job termination)$"
)


def placeholder_hosts(n: int) -> tuple[Host, ...]:
    """Hosts of a batch job not yet placed: node 1..n of the allocation Slurm will give."""
    return tuple(Host(f"<node {i} of the allocation>") for i in range(1, n + 1))


def end_code(state: str, exit_code: str) -> int:
    """A Slurm end state and its ``ExitCode=N:S`` -> the launcher's exit code."""
    state = state.split()[0].rstrip("+") if state else ""
    if state in STATE_CODES:
        return STATE_CODES[state]
    code, _, sig = exit_code.partition(":")
    with contextlib.suppress(ValueError):
        if int(sig or 0):
            return 128 + int(sig)
        if int(code):
            return int(code)
    return 1


def _step_srun(plan: Plan, tasks: Sequence[Task], opts: SlurmOptions, role: str) -> list[str]:
    argv = ["srun", f"--job-name={plan.job_id}-{role}s", f"--ntasks={len(tasks)}"]
    argv += [f"--nodes={len({t.host for t in tasks})}", "--distribution=arbitrary", "--overlap"]
    elastic = role == "worker" and any(dmlc_env.LAUNCHKIT_ELASTIC in t.env for t in tasks)  # one may leave
    argv += ["--overcommit", f"--kill-on-bad-exit={0 if elastic else 1}", "--export=ALL", "--input=none"]
    cpus = opts.cpus_per_server if role == "server" else opts.cpus_per_worker
    mem = opts.mem_per_server if role == "server" else opts.mem_per_worker
    if cpus:
        argv.append(f"--cpus-per-task={cpus}")
    if mem:
        # Slurm's --mem is per node: what the step's busiest node runs of this role, times mem
        per_node = max(Counter(t.host for t in tasks).values())
        number, unit = parse_mem(mem)
        argv.append(f"--mem={number * per_node}{unit}")
    if role == "worker" and opts.gpus_per_worker:
        argv.append(f"--gpus-per-task={opts.gpus_per_worker}")
    return argv


def batch_spec(plan: Plan, opts: SlurmOptions, grace: float) -> dict[str, Any]:
    """``LAUNCHKIT_BATCH`` for ``launchkit.hostside.batchjob``: one srun step per role, each with
    its tasks' node indexes as a ``tasktable`` (runs and repeats: its size does not grow with the
    tasks of a regular placement; one index per task reached Linux's 128 KiB limit on one
    environment string near 30,000 tasks). Pure."""
    ordered = scheduler_last(plan)
    hosts = {h: k for k, h in enumerate(dict.fromkeys(t.host for t in plan.tasks if t.role != "scheduler"))}
    steps = []
    offset = 0
    for role in ("server", "worker"):
        tasks = [t for t in ordered if t.role == role]
        if tasks:
            slots = tasktable.encode([(hosts[t.host], {}) for t in tasks])
            steps.append(
                {"srun": _step_srun(plan, tasks, opts, role), "offset": offset, "slots": json.loads(slots)}
            )
        offset += len(tasks)
    has_scheduler = any(t.role == "scheduler" for t in plan.tasks)
    return {
        "scheduler": len(ordered) - 1 if has_scheduler else None,
        "steps": steps,
        "program": [opts.python, "-m", "launchkit.hostside.shim", "--", *plan.tasks[0].argv],
        "grace": grace,
    }


def sbatch_argv(plan: Plan, opts: SlurmOptions, output: str, cwd: str) -> list[str]:
    """The submission of a batch job that runs ``launchkit.hostside.batchjob`` (its script on stdin). Pure."""
    nodes = len({t.host for t in plan.tasks if t.role != "scheduler"})
    argv = ["sbatch", "--parsable", f"--job-name={plan.job_id}", f"--output={output}", f"--chdir={cwd}"]
    steps = len([t for t in plan.tasks if t.role != "scheduler"])
    argv += [f"--nodes={opts.nodes or nodes}", f"--ntasks={steps}", "--overcommit"]
    argv += ["--export=ALL", "--kill-on-invalid-dep=yes"]
    for flag, value in (
        ("--partition", opts.partition),
        ("--time", opts.time),
        ("--account", opts.account),
        ("--qos", opts.qos),
        ("--constraint", opts.constraint),
    ):
        if value:
            argv.append(f"{flag}={value}")
    workers = len([t for t in plan.tasks if t.role == "worker"])
    if opts.gpus_per_worker:
        argv.append(f"--gpus={workers * opts.gpus_per_worker}")
    return [*argv, *opts.extra]


def batch_script(python: str) -> str:
    return f"#!/bin/sh\n# launchkit batch job: the scheduler here, servers and workers as srun steps\nexec {shlex.quote(python)} -m launchkit.hostside.batchjob\n"


def batch_env(plan: Plan, opts: SlurmOptions, grace: float, *, in_allocation: bool) -> dict[str, str]:
    """What the batch job's environment carries (by name, never on a command line)."""
    env = engine_env(plan, scheduler_last(plan), grace)
    env[shim.NOTIFY_VAR] = "1"  # a stop comes as SIGUSR2, which srun forwards (batchjob.STOP)
    env[rendezvous.WORKER0_VAR] = worker0_file(plan)  # worker 0's node picks its ports there
    if not in_allocation:  # the batch job finds its own address and port on its first node
        env[dmlc_env.DMLC_PS_ROOT_URI] = ""
        env[dmlc_env.DMLC_PS_ROOT_PORT] = "0"
    env[batchjob.BATCH_VAR] = json.dumps(batch_spec(plan, opts, grace), separators=(",", ":"))
    return env


def job_hosts(nodes: int | None) -> tuple[Host, ...]:
    """Inside an allocation its nodes (``--nodes`` takes the first N); outside, N placeholders."""
    if in_allocation(os.environ):
        hosts = allocation_hosts()
        if nodes is not None and nodes > len(hosts):
            raise UsageError(f"--nodes {nodes}: the allocation has only {len(hosts)} node(s)")
        return hosts[:nodes] if nodes else hosts
    return placeholder_hosts(nodes or 1)


def in_allocation(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_JOB_ID"))


def allocation_hosts() -> tuple[Host, ...]:
    try:
        return tuple(Host(n) for n in batchjob.allocation_nodes())
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        raise UsageError(f"--launcher slurm: cannot list the allocation's nodes: {exc}") from None


def output_path(cwd: str, job_id: str) -> str:
    return str(Path(cwd) / f"launchkit-{job_id}.out")


def job_state(slurm_job: str) -> tuple[str, str] | None:
    """(JobState, ExitCode) from ``scontrol show job``; None once Slurm has forgotten the job
    (``Invalid job id``); ``UNKNOWN`` when Slurm did not answer (a transient failure)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", slurm_job], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN, ""
    fields = dict(w.split("=", 1) for w in out.stdout.split() if "=" in w)
    if out.returncode != 0 and "invalid job id" in (out.stderr + out.stdout).lower():
        return None
    if out.returncode != 0 or "JobState" not in fields:
        return UNKNOWN, ""  # slurmctld busy or unreachable: ask again later
    return fields["JobState"], fields.get("ExitCode", "0:0")


def job_status(slurm_job: str) -> tuple[str, int | None] | None:
    """(state, exit code once the job has ended); None once Slurm has forgotten the job."""
    state = job_state(slurm_job)
    if state is None:
        return None
    return state[0], end_code(*state) if state[0].split()[0] in FINAL_STATES else None


def end_argv(slurm_job: str) -> list[str]:
    """End the whole job, Slurm's way (SIGTERM, then SIGKILL after KillWait)."""
    return ["scancel", slurm_job]


class SbatchRun(BatchRun):
    """A Slurm batch job: state from ``scontrol show job``, output in one file."""

    engine = "slurm"

    def __init__(self, *args: Any, output: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.output = output
        with contextlib.suppress(FileNotFoundError):
            os.unlink(output)

    def parse_submit(self, stdout: str) -> str:
        return stdout.strip().split(";")[0]

    def poll(self) -> tuple[str, int | None]:
        assert self.job_id is not None
        status = job_status(self.job_id)
        if status is None:  # Slurm forgot it: it ended (seen before, or a code from the tasks' marks)
            return (self.ended_state, self._code) if self.ended_state else ("GONE", 1)
        return status

    def output_files(self) -> list[str]:
        return [self.output]

    def output_location(self) -> str:
        return self.output

    def cancel_argv(self, sig: int) -> list[list[str]]:
        assert self.job_id is not None
        if sig == signal.SIGKILL:
            return [end_argv(self.job_id)]
        # to the batch program only, which stops the steps and the scheduler (batchjob._stop):
        # SIGTERM to the steps' srun would SIGKILL their tasks
        return [["scancel", "--batch", "--signal=USR2", self.job_id]]


class SlurmBackend(BatchBackend):
    name = "slurm"
    engine_label = "slurm"
    capabilities = Capabilities(
        hosts="allocation",
        hostfile_ignored="the job goes on the allocation's nodes",
        detaches=True,
        inherits_env=True,  # srun and sbatch --export=ALL
        options=frozenset({"slurm", "node_python", "console"}),
        flags=(*FLAGS, *ROLE_RESOURCES, NODE_PYTHON),
        gives_hosts="the allocation",
        elastic="shrink",  # workers may leave; none can join a running allocation
    )

    @classmethod
    def flag_options(cls, flags: Mapping[str, Any], spec: LaunchSpec) -> dict[str, Any]:
        return {
            "slurm": options_from_flags(flags, spec.gpus_per_worker),
            "node_python": NODE_PYTHON.value(flags),
        }

    @classmethod
    def allocation_hosts(cls, flags: Mapping[str, Any]) -> tuple[Host, ...]:
        return job_hosts(NODES.value(flags))

    @classmethod
    def given_hosts(cls, environ: Mapping[str, str]) -> tuple[str, list[Host]]:
        return slurm_allocation(environ)

    def __init__(
        self,
        *,
        slurm: SlurmOptions | None = None,
        node_python: str | None = None,
        console: object = None,
    ) -> None:
        super().__init__(console)
        base = slurm or SlurmOptions()
        self.opts = replace(base, python=node_python or base.python)
        self.inside = in_allocation(os.environ)
        self.steps: set[str] = set()

    def connect(self, spec: LaunchSpec) -> str | None:
        """Inside an allocation: the local address that reaches the first node (its NodeAddr)."""
        super().connect(spec)
        if not self.inside or not spec.hosts:
            return None
        return route_address(batchjob.node_address(spec.hosts[0].name))

    def finds_scheduler_address(self) -> bool:
        return not self.inside

    def node_hosts(self, spec: LaunchSpec) -> dict[Host, str] | None:
        return dict.fromkeys(spec.hosts, "")  # each task's shim finds its node's address

    def engine_runs(self, task: Task) -> bool:
        return True  # the scheduler runs under launchkit.hostside.batchjob too

    def _plan(self, plan: Plan) -> Plan:
        if not self.opts.gpus_per_worker:
            return plan
        # Slurm binds the GPUs it gives (--gpus-per-task): its CUDA_VISIBLE_DEVICES stands
        tasks = tuple(
            replace(t, env={k: v for k, v in t.env.items() if k != dmlc_env.CUDA_VISIBLE_DEVICES})
            for t in plan.tasks
        )
        return replace(plan, tasks=tasks)

    def _sbatch(self, plan: Plan) -> list[str]:
        cwd = plan.tasks[0].cwd
        return sbatch_argv(plan, self.opts, output_path(cwd, plan.job_id), cwd)

    def describe(self, task: Task) -> list[str]:
        return [self.opts.python, "-m", "launchkit.hostside.shim", "--", *task.argv]

    def describe_job(self, plan: Plan) -> list[list[str]]:
        plan = self._plan(plan)
        spec = batch_spec(plan, self.opts, self.grace)
        steps = [[*s["srun"], *spec["program"]] for s in spec["steps"]]
        head = [self.opts.python, "-m", "launchkit.hostside.batchjob"]
        return [head if self.inside else self._sbatch(plan), *steps]

    def notes(self, plan: Plan) -> list[str]:
        if self.inside:
            return [f"inside allocation {os.environ.get('SLURM_JOB_ID')}: steps start at once"]
        return [
            "outside an allocation: submitted with sbatch; the scheduler runs on the batch job's "
            "first node, which finds its own address and port",
            f"the batch script, on sbatch's stdin: {batch_script(self.opts.python).splitlines()[-1]}",
        ]

    def make_run(self, plan: Plan) -> EngineRun:
        plan = self._plan(plan)
        cwd = plan.tasks[0].cwd
        env = merge_env(os.environ, batch_env(plan, self.opts, self.grace, in_allocation=self.inside))
        if self.inside:
            return PopenRun([self.opts.python, "-m", "launchkit.hostside.batchjob"], env, cwd, batchjob.STOP)
        script = batch_script(self.opts.python)
        self.batch = SbatchRun(
            self._sbatch(plan), script, env, cwd, self.say, output=output_path(cwd, plan.job_id)
        )
        return self.batch

    def engine_noise(self, text: str) -> bool:
        return bool(NOISE.match(text.strip()))

    def can_detach(self) -> bool:
        return not self.inside

    def detach_refusal(self) -> str:
        return "run it outside an allocation (SLURM_JOB_ID is set here)"

    def node_unknown(self, task: Task) -> bool:
        return task.host.name.startswith("<")  # a batch job's placeholder

    def on_task_started(self, proc: EngineProcess, fields: list[str]) -> None:
        if proc.task.role == "scheduler":
            return  # it runs beside the steps, in no step of ours
        if len(fields) >= 4 and fields[3] not in ("-", "batch") and fields[2] != "-":
            step = f"{fields[2]}.{fields[3]}"
            if step not in self.steps:
                self.steps.add(step)
                if self.inside and self._cleanup_sink is not None:
                    self._cleanup_sink(["scancel", step], ends_job=True)

    def signal_engine(self, sig: int) -> None:
        super().signal_engine(sig)
        if sig == signal.SIGKILL and self.inside and self.steps:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["scancel", *sorted(self.steps)], capture_output=True, timeout=30)

    def close(self) -> None:
        clean = self.engine_code == 0
        super().close()  # scancel of the batch job if it has not ended
        if self.plan is not None:
            forget_worker0(worker0_file(self.plan))
        if self.inside and self.steps and not clean:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["scancel", *sorted(self.steps)], capture_output=True, timeout=30)
