"""Jobs submitted with ``--detach``: no launcher follows them, so ``ps``, ``kill`` and ``logs``
ask the engine (``scontrol``, ``scancel``) through the ids kept in the job record."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from launchkit import jobs, shim


def engine_job(record: jobs.JobRecord) -> tuple[str, str] | None:
    """(engine, its job id) of a detached job, else None."""
    info = record.remote or {}
    if not record.detached or not info.get("engine") or not info.get("engine_job"):
        return None
    return str(info["engine"]), str(info["engine_job"])


def refresh(record: jobs.JobRecord) -> jobs.JobRecord:
    """A detached job's record brought up to date with the engine's view (recorded when it ended)."""
    which = engine_job(record)
    if which is None or record.state != "running":
        return record
    from launchkit.backends import slurm

    state = slurm.job_state(which[1])
    if state is not None and state[0].split()[0] not in slurm.FINAL_STATES:
        return record
    code = slurm.end_code(*state) if state is not None else None
    if state is None:
        return jobs.finish(record, "lost", None)  # Slurm forgot it before we looked
    return jobs.finish(record, "succeeded" if code == 0 else "failed", code)


def cancel(record: jobs.JobRecord) -> str | None:
    """End a detached job through its engine; an error message, or None when done."""
    which = engine_job(record)
    if which is None:
        return None
    try:
        proc = subprocess.run(["scancel", which[1]], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"scancel {which[1]}: {exc}"
    if proc.returncode != 0:
        return f"scancel {which[1]}: {proc.stderr.strip() or f'exit {proc.returncode}'}"
    jobs.finish(record, "killed", None)
    return None


def output_lines(record: jobs.JobRecord) -> Iterator[tuple[str, str, str]]:
    """(label, stream, text) for each line of a batch job's output file, split by process."""
    info = record.remote or {}
    path = info.get("output")
    if not path:
        return
    labels = {i: (p.role, p.rank) for i, p in enumerate(record.processes)}
    partial: dict[tuple[int, str], bytes] = {}
    with contextlib.suppress(OSError), Path(path).open("rb") as f:
        for line in f:
            frame = shim.parse_frame(line)
            if frame is None:
                text = line.decode(errors="replace").rstrip("\n")
                if text.strip():
                    yield ("slurm", "err", text)
                continue
            if frame.kind not in ("o", "e"):
                continue
            key = (frame.task, frame.kind)
            if frame.continued:
                partial[key] = partial.get(key, b"") + frame.data
                continue
            data = partial.pop(key, b"") + frame.data
            role, rank = labels.get(frame.task, ("task", frame.task))
            yield (f"{role} {rank}", "out" if frame.kind == "o" else "err", data.decode(errors="replace"))
