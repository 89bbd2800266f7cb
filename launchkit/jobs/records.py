"""Job records on disk: ``$LAUNCHKIT_HOME/jobs/<job_id>.json`` (default ``~/.launchkit``).

A record says what was launched, where, and by which launcher process; ``launchkit ps`` reads
them and shows a job whose launcher died without finishing it as ``lost``. Records never hold
the job secret. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def home() -> Path:
    return Path(os.environ.get("LAUNCHKIT_HOME") or Path.home() / ".launchkit")


def jobs_dir() -> Path:
    return home() / "jobs"


def process_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class ProcessRecord:
    role: str
    rank: int
    host: str
    pid: int | None = None


@dataclass(frozen=True)
class JobRecord:
    id: str
    name: str
    backend: str
    hosts: tuple[str, ...]
    command: tuple[str, ...]
    cwd: str
    launcher_pid: int
    launcher_start: int | None
    started_at: float
    state: str = "running"
    ended_at: float | None = None
    exit_code: int | None = None
    log_dir: str | None = None
    processes: tuple[ProcessRecord, ...] = field(default_factory=tuple)
    remote: dict[str, Any] | None = None  # how to reach the hosts again (ssh options; no secrets)
    detached: bool = False  # submitted to a batch engine with --detach: no launcher follows it

    def launcher_alive(self) -> bool:
        start = process_start_time(self.launcher_pid)
        return start is not None and (self.launcher_start is None or start == self.launcher_start)

    @property
    def shown_state(self) -> str:
        """``running`` only while the launcher lives; otherwise ``lost``."""
        if self.state == "running" and not self.detached and not self.launcher_alive():
            return "lost"
        return self.state

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shown_state"] = self.shown_state
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        procs = tuple(ProcessRecord(**p) for p in data.get("processes", ()))
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "processes"}
        fields["hosts"] = tuple(fields.get("hosts", ()))
        fields["command"] = tuple(fields.get("command", ()))
        return cls(**fields, processes=procs)


def started_here(**fields: Any) -> JobRecord:
    """A record of a job this process launches now (its pid, start time and the time)."""
    pid = os.getpid()
    return JobRecord(
        launcher_pid=pid, launcher_start=process_start_time(pid), started_at=time.time(), **fields
    )


def save(record: JobRecord) -> Path:
    d = jobs_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{record.id}.json"
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{record.id}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(record), f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load(job_id: str) -> JobRecord | None:
    if not JOB_ID_RE.match(job_id):
        return None
    try:
        return JobRecord.from_json(json.loads((jobs_dir() / f"{job_id}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def load_all() -> list[JobRecord]:
    records = []
    with contextlib.suppress(OSError):
        for path in sorted(jobs_dir().glob("*.json")):
            rec = load(path.stem)
            if rec is not None:
                records.append(rec)
    return sorted(records, key=lambda r: r.started_at)


def finish(record: JobRecord, state: str, exit_code: int | None) -> JobRecord:
    done = replace(record, state=state, exit_code=exit_code, ended_at=time.time())
    save(done)
    return done
