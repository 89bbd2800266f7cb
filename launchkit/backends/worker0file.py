"""Where worker 0's rank shim publishes its address and two ports on the engines (``mpi`` and
``slurm``; ``sge`` keeps it in its job directory): a file beside the job's working directory, on
the filesystem its tasks share (``launchkit.hostside.rendezvous.WORKER0_VAR``), removed when the
job ends."""

from __future__ import annotations

import contextlib
import os

from launchkit.core.spec import Plan


def worker0_file(plan: Plan) -> str:
    """Where worker 0's shim publishes its address and ports (``rendezvous.WORKER0_VAR``): beside
    the job's working directory, on the filesystem its tasks share (as a batch job's output)."""
    cwd = next((t.cwd for t in plan.tasks if t.role == "worker"), ".")
    return os.path.join(cwd, f".launchkit-{plan.job_id}.worker0")


def forget_worker0(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
