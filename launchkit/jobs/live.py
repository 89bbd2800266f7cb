"""A running job's live file: ``$LAUNCHKIT_HOME/jobs/<job_id>/live.json``.

The supervisor writes it (atomic replace, at most once every ``EVERY`` seconds, and once more at
the end) whether or not its terminal shows the dashboard, so that ``launchkit top JOB_ID`` in
another terminal shows the same view, and ``launchkit ps`` the latest step and loss. It holds
the dashboard's state (header, process rows, output tail, root cause) and the training panel's
figures as the launcher computed them (``telemetry.view.to_json``), not the reports they come
from: those grow with the job (version 1 carried them, 9.5 MB at 1024 processes over 128 hosts;
version 2 is about 200 bytes a process).

A live file is read as untrusted input: one that is missing, unreadable, of another version or
malformed reads as ``None`` with the reason, and the caller falls back to the job record.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchkit.jobs.records import JOB_ID_RE, jobs_dir, replace_file
from launchkit.telemetry import view as figures
from launchkit.telemetry.view import KEEP
from launchkit.view import state as view_state
from launchkit.view.state import DashboardState

VERSION = 2
EVERY = 1.0  # seconds between two writes
KEEP_POINTS = KEEP  # reports a copy of the model keeps for a frame: a sparkline's worth, the rate windows


def job_dir(job_id: str) -> Path:
    """The directory of a job's files beside its record (live file, kept output)."""
    return jobs_dir() / job_id


def path(job_id: str) -> Path:
    return job_dir(job_id) / "live.json"


def encode(state: DashboardState, at: float) -> str:
    doc: dict[str, Any] = {"version": VERSION, "written_at": at, "state": view_state.to_json(state)}
    if state.training is not None:
        doc["training"] = figures.to_json(state.training)
    return json.dumps(doc, separators=(",", ":"))


def write(state: DashboardState, at: float | None = None) -> Path:
    """Replace the job's live file at once (temp file + rename); OSError when it cannot."""
    text = encode(state, time.time() if at is None else at)
    return replace_file(job_dir(state.job_id) / "live.json", text)


@dataclass(frozen=True)
class Live:
    state: DashboardState  # with its training figures
    written_at: float


def decode(text: str) -> Live:
    """A live file's text; ValueError saying what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON (cut short?): {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version')!r}, this launchkit reads version {VERSION}")
    at = doc.get("written_at")
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        raise ValueError("field 'written_at' missing or not a number")
    state = view_state.from_json(doc.get("state"), figures.from_json(doc.get("training")))
    return Live(state, float(at))


def read(job_id: str) -> tuple[Live | None, str]:
    """The job's live file, or None and why not ("" when there is none)."""
    if not JOB_ID_RE.match(job_id):
        return None, ""
    p = path(job_id)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, ""
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{p}: cannot read: {getattr(exc, 'strerror', None) or exc}"
    try:
        return decode(text), ""
    except ValueError as exc:
        return None, f"{p}: {exc}"


def step_loss(job_id: str) -> tuple[int | None, float | None]:
    """A running job's latest step and loss (``launchkit ps``); None for what it does not report."""
    view, _ = read(job_id)
    t = view.state.training if view is not None else None
    return (t.step, t.loss) if t is not None else (None, None)
