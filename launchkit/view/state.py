"""What the dashboard shows, as plain data: built by the supervisor (``Supervisor.snapshot``) or
read back from a job's live file, rendered by ``launchkit.view.render``."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, fields
from typing import Any

from launchkit.telemetry.view import Training


@dataclass(frozen=True)
class ProcRow:
    role: str
    rank: int
    host: str
    pid: int | None
    state: str  # starting, running, ok, failed, ended
    detail: str = ""  # e.g. "exit 3", "signal 9"
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    last_line: str = ""


@dataclass(frozen=True)
class RootCause:
    """The process whose failure ended the job, and its last lines."""

    role: str
    rank: int
    host: str
    detail: str  # "exit 3", "signal 9"
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class DashboardState:
    job_id: str
    name: str
    backend: str
    elapsed: float
    rows: tuple[ProcRow, ...]
    log: tuple[tuple[str, str], ...] = ()  # (label, line), newest last
    message: str = ""
    attempt: int | None = None  # this attempt (1 first) of ``attempts``, when the job may restart
    attempts: int | None = None
    training: Training | None = None  # None: no telemetry for this job
    root_cause: RootCause | None = None
    finished: bool = False
    status: str = ""  # what the job waits on outside its processes (an engine's queue state)

    def running(self) -> set[tuple[str, int]]:
        return {(r.role, r.rank) for r in self.rows if r.state in ("running", "starting")}


def to_json(state: DashboardState) -> dict[str, Any]:
    """The state without its training figures (the live file carries the model they come from)."""
    doc = {f.name: getattr(state, f.name) for f in fields(state) if f.name != "training"}
    doc["rows"] = [asdict(r) for r in state.rows]
    doc["log"] = [list(pair) for pair in state.log]
    doc["root_cause"] = asdict(state.root_cause) if state.root_cause else None
    return doc


def _typed(doc: dict[str, Any], name: str, types: Any, default: Any) -> Any:
    value = doc.get(name, default)
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return default
    return value if isinstance(value, types) else default


_ROW: dict[str, Any] = {
    "role": str,
    "rank": int,
    "host": str,
    "pid": (int, type(None)),
    "state": str,
    "detail": str,
    "cpu_percent": (int, float, type(None)),
    "rss_bytes": (int, type(None)),
    "last_line": str,
}


def _row(doc: Any) -> ProcRow:
    if not isinstance(doc, dict) or not all(k in doc for k in ("role", "rank", "host", "state")):
        raise ValueError("a process row needs role, rank, host and state")
    values: dict[str, Any] = {}
    for k, t in _ROW.items():
        v = doc.get(k)
        if k in doc and (not isinstance(v, t) or isinstance(v, bool)):
            raise ValueError(f"process row field {k!r}: unexpected {type(v).__name__}")
        if k in doc:
            values[k] = v
    values.setdefault("pid", None)
    return ProcRow(**values)


def from_json(doc: Any, training: Training | None = None) -> DashboardState:
    """A state read back from a live file (checked: ValueError naming what is wrong)."""
    if not isinstance(doc, dict):
        raise ValueError("the state is not a JSON object")
    for k, t in (("job_id", str), ("name", str), ("backend", str), ("rows", list)):
        if not isinstance(doc.get(k), t):
            raise ValueError(f"field {k!r} missing or of the wrong type")
    elapsed = _typed(doc, "elapsed", (int, float), 0.0)
    log = tuple(
        (str(p[0]), str(p[1])) for p in _typed(doc, "log", list, []) if isinstance(p, list) and len(p) == 2
    )
    root = None
    rc = doc.get("root_cause")
    if isinstance(rc, dict):
        lines = tuple(str(x) for x in rc.get("lines", []) if isinstance(x, str))
        root = RootCause(
            str(rc.get("role", "?")),
            _typed(rc, "rank", int, 0),
            str(rc.get("host", "")),
            str(rc.get("detail", "")),
            lines,
        )
    return DashboardState(
        job_id=doc["job_id"],
        name=doc["name"],
        backend=doc["backend"],
        elapsed=float(elapsed),
        rows=tuple(_row(r) for r in doc["rows"]),
        log=log,
        message=_typed(doc, "message", str, ""),
        attempt=_typed(doc, "attempt", int, None),
        attempts=_typed(doc, "attempts", int, None),
        training=training,
        root_cause=root,
        finished=_typed(doc, "finished", bool, False),
        status=_typed(doc, "status", str, ""),
    )


def replace_training(state: DashboardState, training: Training | None) -> DashboardState:
    return dataclasses.replace(state, training=training)
