"""Jobs submitted with ``--detach``: no launcher follows them, so ``ps``, ``kill`` and ``logs``
ask the engine (``scontrol``, ``scancel``) through the ids kept in the job record."""

from __future__ import annotations

import contextlib
import importlib
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launchkit import backends
from launchkit.hostside import shim
from launchkit.jobs import records as jobs


def detaches(name: str) -> bool:
    """Whether the backend ``name`` runs jobs that can be left to run (``Capabilities.detaches``,
    the one registry of backends); its module has ``job_status`` and ``end_argv``, and may have
    ``forget_files`` (what to remove once the job ended)."""
    return name in backends.names() and backends.capabilities(name).detaches


def _engine(name: str) -> Any:
    return importlib.import_module(backends.backend_class(name).__module__)


def engine_job(record: jobs.JobRecord) -> tuple[str, str] | None:
    """(engine, its job id) of a batch job that no launcher follows any more (submitted with
    ``--detach``, or its launcher is gone), else None."""
    info = record.remote or {}
    if not detaches(str(info.get("engine"))) or not info.get("engine_job"):
        return None
    if not record.detached and record.launcher_alive():
        return None
    return str(info["engine"]), str(info["engine_job"])


def await_submission(record: jobs.JobRecord, timeout: float) -> jobs.JobRecord:
    """The record once the submission it is in (``JobRecord.submitting``) has returned, its
    launcher died, or ``timeout`` s passed: ``kill`` ends the engine's job, not the submitter
    (which would leave the job the engine took running, with no record naming it)."""
    deadline = time.monotonic() + timeout
    while record.submitting and record.launcher_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
        record = jobs.load(record.id) or record
    return record


def _ended(record: jobs.JobRecord) -> None:
    info = record.remote or {}
    engine = str(info.get("engine"))
    forget = getattr(_engine(engine), "forget_files", None) if detaches(engine) else None
    if forget is not None and info.get("output"):  # sge: the task files in the output directory
        forget(str(info["output"]))


def refresh(record: jobs.JobRecord) -> jobs.JobRecord:
    """A detached job's record brought up to date with the engine's view (recorded when it ended)."""
    which = engine_job(record)
    if which is None or not record.detached or record.state != "running":
        return record
    status = _engine(which[0]).job_status(which[1])
    if status is not None and status[1] is None:
        return record  # queued, running, or the engine did not answer this time
    _ended(record)
    code = marked_code(record)  # the tasks' own end marks first: they outlive the engine's memory
    if code is None and status is None:
        return jobs.finish(record, "lost", None)  # forgotten by the engine, and no marks
    if code is None:
        code = status[1] if status is not None else None
    return jobs.finish(record, "succeeded" if code == 0 else "failed", code)


def marked_code(record: jobs.JobRecord) -> int | None:
    """The job's code from the end marks its tasks wrote: the first failure that was not a
    consequence of stopping the job; None when not every task left its marks."""
    ends: dict[int, tuple[int, bool]] = {}
    for line in _raw_lines(record):
        frame = shim.parse_frame(line)
        if frame is not None and frame.kind == "x":
            with contextlib.suppress(ValueError, IndexError):
                fields = frame.fields()
                ends[frame.task] = (int(fields[0]), fields[1:2] == ["1"])
    if len(ends) < len(record.processes):
        return None
    failures = [code for code, stopped in ends.values() if code and not stopped]
    return failures[0] if failures else next((c for c, _ in ends.values() if c), 0)


def cancel(record: jobs.JobRecord) -> str | None:
    """End a detached job through its engine; an error message, or None when done."""
    which = engine_job(record)
    if which is None:
        return None
    argv = _engine(which[0]).end_argv(which[1])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{shlex.join(argv)}: {exc}"
    said = (proc.stderr + proc.stdout).lower()
    gone = "invalid job id" in said or "do not exist" in said or "does not exist" in said
    if proc.returncode != 0 and not gone:
        return f"{shlex.join(argv)}: {proc.stderr.strip() or f'exit {proc.returncode}'}"
    _ended(record)
    if record.state == "running":
        jobs.finish(record, "killed", None)
    return None


def _output_files(path: str) -> list[Path]:
    p = Path(path)
    return sorted(p.glob("task-*.out"), key=lambda f: int(f.stem.split("-")[-1])) if p.is_dir() else [p]


def _raw_lines(record: jobs.JobRecord) -> list[bytes]:
    path = (record.remote or {}).get("output")
    lines: list[bytes] = []
    for file in _output_files(str(path)) if path else []:
        with contextlib.suppress(OSError), file.open("rb") as f:
            lines.extend(f)
    return lines


def output_lines(record: jobs.JobRecord) -> Iterator[tuple[str, str, str]]:
    """(label, stream, text) for each line of a batch job's output (one file, or a directory of
    per-task files), split by process."""
    info = record.remote or {}
    path = info.get("output")
    if not path:
        return
    labels = {i: (p.role, p.rank) for i, p in enumerate(record.processes)}
    lines = shim.Reassembler()
    for line in _raw_lines(record):
        frame = shim.parse_frame(line)
        if frame is None:
            text = line.decode(errors="replace").rstrip("\n")
            if text.strip():
                yield (str(info.get("engine", "engine")), "err", text)
            continue
        if frame.kind not in ("o", "e"):
            continue
        data = lines.line(frame)
        if data is None:
            continue
        role, rank = labels.get(frame.task, ("task", frame.task))
        yield (f"{role} {rank}", "out" if frame.kind == "o" else "err", data.decode(errors="replace"))
