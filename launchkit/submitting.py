"""``launch --detach``: submit a batch job that no launcher follows, and record it.

The record is written before the submission, so that ``ps`` and ``kill`` see the job from the
start: while the engine's submitter runs, the record has no engine job id, and ``ps`` shows it as
``submitting`` (``lost`` if the submitting launcher died there: whether the engine took the job
is not known). Once submitted, the record names the engine's job and ``ps`` shows it as running;
a submission that fails (the engine refused it, or is not there) leaves the record as
``not submitted``, with the launch's exit code (a Ctrl-C there: ``interrupted``, 130), so that
``ps --all`` says what became of a job another terminal saw being submitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from launchkit.backends.base import Backend
from launchkit.core.plan import make_plan, new_job_id, new_secret, one_thread_note
from launchkit.core.spec import LaunchSpec
from launchkit.errors import EXIT_INTERNAL, BackendError, UsageError
from launchkit.jobs import owner
from launchkit.jobs import records as jobs
from launchkit.launching import inherited

if TYPE_CHECKING:
    from launchkit.backends.batch import BatchBackend

#: the state of a detached job whose submission failed: nothing was started
NOT_SUBMITTED = "not submitted"


@dataclass(frozen=True)
class Submitted:
    """A detached batch job: launchkit's job id, the engine's, and where its output goes."""

    job_id: str
    engine_job: str
    output: str | None


def submit_detached(
    spec: LaunchSpec, backend: Backend, say: Callable[[str], None] | None = None
) -> Submitted:
    """``--detach``: record the job (being submitted), submit it, and record the engine's job id;
    the job then runs on its own. ``say`` is given what the launch says before it submits
    (``OMP_NUM_THREADS``). A failed submission finishes the record as ``NOT_SUBMITTED``."""
    if not backend.capabilities.detaches:
        raise UsageError(f"--detach needs a batch engine, not --launcher {backend.name}")
    backend = cast("BatchBackend", backend)  # what a backend that detaches is
    if not backend.can_detach():
        raise UsageError(f"--detach submits a batch job: {backend.detach_refusal()}")
    plan = make_plan(
        spec,
        caps=backend.capabilities,
        job_id=new_job_id(),
        secret=new_secret(),
        root_uri="",
        root_port=0,
        node_host_of=backend.node_hosts(spec),
        job_home=owner.home_id(),
        inherited=inherited(backend),
    )
    if say is not None and (note := one_thread_note(plan)) is not None:
        say(note)
    record = jobs.started_here(
        id=plan.job_id,
        name=plan.job_name,
        backend=plan.backend,
        hosts=(),
        command=spec.command,
        cwd=spec.cwd,
        log_dir=spec.log_dir,
        remote={"engine": backend.name, "engine_job": None, "output": None},  # being submitted
        detached=True,
        processes=tuple(jobs.ProcessRecord(t.role, t.rank, str(t.host)) for t in plan.tasks),
    )
    jobs.save(record)
    try:
        backend.prepare(plan)
        try:
            engine_job = backend.submit(plan)
        except OSError as exc:
            raise BackendError(backend.name, str(exc)) from None
    except KeyboardInterrupt:  # (the submitter may have reached the engine: not known)
        jobs.finish(record, "interrupted", 130)
        raise
    except BaseException as exc:
        jobs.finish(record, NOT_SUBMITTED, getattr(exc, "exit_code", EXIT_INTERNAL))
        raise
    output = backend.output_of(plan)
    remote = {"engine": backend.name, "engine_job": engine_job, "output": output}
    jobs.save(dataclasses.replace(record, remote=remote))
    return Submitted(plan.job_id, engine_job, output)
