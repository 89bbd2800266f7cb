"""Job records on disk: ``$LAUNCHKIT_HOME/jobs/<job_id>.json`` (default ``~/.launchkit``).

A record says what was launched, where, and by which launcher process; ``launchkit ps`` reads
them and shows a job whose launcher died without finishing it as ``lost``. Records never hold
the job secret. Writes are atomic (temp file + rename). A job restarted after a failure
(``--max-restarts``) keeps its record; ``attempt`` says which attempt runs (records written
before restarts existed read as attempt 0 of 0).

Reading checks every field's type: a record that is not one (empty, truncated, another JSON
shape, a field of the wrong type) is a ``BadRecord`` naming the file and what is wrong, handed to
the caller's ``on_bad`` and skipped, so that one bad file never hides or breaks the other jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from launchkit.core.hostfile import parse_host
from launchkit.errors import UsageError
from launchkit.jobs.history import Change, change_from_json

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_job_id(job_id: str) -> str:
    """A JOB_ID argument (``kill``, ``logs``, ``top``): UsageError when it is empty (an unset
    shell variable: ``launchkit logs "$JOB"``) or not a job id at all; the id otherwise."""
    if not job_id.strip():
        raise UsageError("the job id is empty (give a JOB_ID from launchkit ps)")
    if not JOB_ID_RE.match(job_id):
        raise UsageError(f"{job_id!r} is not a job id (see launchkit ps)")
    return job_id


def home() -> Path:
    """``$LAUNCHKIT_HOME``, an absolute path: a relative one (``~/lk`` quoted, ``lk``) named a
    different directory from every working directory, so a job launched in one was not found by
    ``ps``, ``kill``, ``logs`` or ``top`` run in another."""
    value = os.environ.get("LAUNCHKIT_HOME")
    if value:
        if not os.path.isabs(value):
            raise UsageError(
                f"LAUNCHKIT_HOME {value}: a relative path (expected an absolute path, e.g. /home/me/.launchkit; "
                "'~' is not expanded there): each command would look for jobs under its own current directory"
            )
        return Path(value)
    try:
        return Path.home() / ".launchkit"
    except RuntimeError:  # no HOME, and no passwd entry for this user
        raise UsageError("cannot tell this user's home directory: set HOME or LAUNCHKIT_HOME") from None


def jobs_dir() -> Path:
    return home() / "jobs"


def _home_problem(path: Path) -> str | None:
    """What makes ``path`` (LAUNCHKIT_HOME or its jobs directory) unusable for reading records:
    not a directory, a dangling link, a directory that cannot be listed; None when it is fine or
    does not exist (no jobs yet)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            return f"a link to {os.readlink(path)}, which does not exist"
        return None
    except OSError as exc:  # ENOTDIR (a file above it), EACCES, ELOOP, ENAMETOOLONG
        return exc.strerror or str(exc)
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "cannot be read (permission denied)"
    return None


def check_readable() -> None:
    """UsageError naming the path when the job records cannot be read (see ``_home_problem``)."""
    for path, what in ((home(), "LAUNCHKIT_HOME"), (jobs_dir(), "the job records' directory")):
        problem = _home_problem(path)
        if problem is not None:
            raise UsageError(f"{what} {path}: {problem} (expected a directory for launchkit's job records)")


def check_home() -> Path:
    """Before a launch: the jobs directory exists (made if missing) and a file can be written in
    it; UsageError naming the path and what is wrong otherwise. Returns the directory."""
    check_readable()
    where = jobs_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=where, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(
            f"cannot write job records in {where}: {exc.strerror or exc} "
            "(LAUNCHKIT_HOME, default ~/.launchkit, must be a directory this user can write)"
        ) from None
    return where


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
    epoch: int | None = None  # an elastic job's worker: the membership epoch it joined
    ended: str | None = None  # an elastic job's worker: how it ended ("exit 137", "signal 15 (stopped ...)")


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
    attempt: int = 0  # LAUNCHKIT_RESTART_COUNT of the attempt running (or that ran last): 0 first
    max_restarts: int = 0  # --max-restarts: the job runs at most max_restarts + 1 attempts
    # its launcher died, and its reaper then ended everything of it, known to have succeeded
    # (the sweep here and on each ssh host, each cleanup command): when (``jobs.reaper``)
    reaped_at: float | None = None
    changes: tuple[Change, ...] = ()  # an elastic job's membership changes (jobs.history)

    def launcher_alive(self) -> bool:
        start = process_start_time(self.launcher_pid)
        return start is not None and (self.launcher_start is None or start == self.launcher_start)

    @property
    def submitting(self) -> bool:
        """A detached job recorded before its submission, which has not returned yet: no engine
        job id (``launchkit.submitting``)."""
        return self.detached and self.state == "running" and not (self.remote or {}).get("engine_job")

    @property
    def shown_state(self) -> str:
        """``running`` only while the launcher lives; otherwise ``lost``; a detached job being
        submitted: ``submitting`` while its launcher submits it (``lost`` if it died there)."""
        if self.submitting:
            return "submitting" if self.launcher_alive() else "lost"
        if self.state == "running" and not self.detached and not self.launcher_alive():
            return "lost"
        return self.state

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shown_state"] = self.shown_state
        return data

    @classmethod
    def from_json(cls, data: Any) -> JobRecord:
        """The record in ``data`` (parsed JSON); ValueError saying which field is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {_kind(data)}")
        fields = {k: _field(k, data[k], _FIELDS[k]) for k in _FIELDS if k in data}
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(repr(k) for k in missing)}")
        procs = tuple(
            _process(i, p) for i, p in enumerate(_field("processes", data.get("processes", []), list))
        )
        remote = fields.get("remote")
        for key, value in (remote or {}).items():
            _field(f"remote.{key}", value, _REMOTE.get(key, object))
        for key, value in ((remote or {}).get("ssh") or {}).items():
            _field(f"remote.ssh.{key}", value, _SSH.get(key, object))
        for i, h in enumerate((remote or {}).get("hosts") or []):
            try:
                parse_host(_field(f"remote.hosts[{i}]", h, str).split()[0])
            except (ValueError, IndexError) as exc:
                raise ValueError(f"field 'remote.hosts[{i}]': {exc or 'empty'}") from None
        for i, w in enumerate(fields.get("hosts", [])):
            _field(f"hosts[{i}]", w, str)
        for i, w in enumerate(fields.get("command", [])):
            _field(f"command[{i}]", w, str)
        fields.setdefault("launcher_start", None)
        fields["hosts"] = tuple(fields.get("hosts", ()))
        fields["command"] = tuple(fields.get("command", ()))
        changes = tuple(
            change_from_json(i, c) for i, c in enumerate(_field("changes", data.get("changes", []), list))
        )
        return cls(**fields, processes=procs, changes=changes)


_NUMBER = (int, float)
_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))
# every field of a record and the JSON types it may hold (bool is never a number here)
_FIELDS: dict[str, Any] = {
    "id": str, "name": str, "backend": str, "hosts": list, "command": list, "cwd": str,
    "launcher_pid": int, "launcher_start": _OPT_INT, "started_at": _NUMBER, "state": str,
    "ended_at": (*_NUMBER, type(None)), "exit_code": _OPT_INT, "log_dir": _OPT_STR,
    "remote": (dict, type(None)), "detached": bool, "attempt": int, "max_restarts": int,
    "reaped_at": (*_NUMBER, type(None)),
}  # fmt: skip
_REQUIRED = ("id", "name", "backend", "cwd", "launcher_pid", "started_at")
_REMOTE: dict[str, Any] = {
    "hosts": list, "ssh": dict, "engine": _OPT_STR, "engine_job": _OPT_STR, "output": _OPT_STR,
    "swept": dict,  # ssh, at the job's end: host -> what its watchdog's sweep ended (jobs.kill.confirmed_sweeps)
}  # fmt: skip
_SSH: dict[str, Any] = {
    "port": _OPT_INT, "identity": _OPT_STR, "known_hosts": _OPT_STR, "strict_host_keys": bool,
    "connect_timeout": _NUMBER, "config_file": _OPT_STR,
}  # fmt: skip
_PROCESS: dict[str, Any] = {
    "role": str,
    "rank": int,
    "host": str,
    "pid": _OPT_INT,
    "epoch": _OPT_INT,
    "ended": _OPT_STR,
}
_NAMES = {
    str: "a string",
    int: "a whole number",
    float: "a number",
    list: "a list",
    dict: "an object",
    bool: "true or false",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return _NAMES.get(type(value), type(value).__name__)


def _field(name: str, value: Any, types: Any) -> Any:
    types = types if isinstance(types, tuple) else (types,)
    if object in types:
        return value
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        want = " or ".join(dict.fromkeys(_NAMES[t] for t in types if t is not int or float not in types))
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ValueError(f"field {name!r}: expected {want}, got {_kind(value)} {shown}")
    return value


def _process(i: int, data: Any) -> ProcessRecord:
    _field(f"processes[{i}]", data, dict)
    missing = [k for k in ("role", "rank", "host") if k not in data]
    if missing:
        raise ValueError(f"processes[{i}]: missing field(s) {', '.join(repr(k) for k in missing)}")
    return ProcessRecord(
        **{k: _field(f"processes[{i}].{k}", data[k], t) for k, t in _PROCESS.items() if k in data}
    )


class BadRecord(UsageError):
    """A job record that cannot be read: the file and what is wrong with it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


OnBad = Callable[[BadRecord], None]


def started_here(**fields: Any) -> JobRecord:
    """A record of a job this process launches now (its pid, start time and the time)."""
    pid = os.getpid()
    return JobRecord(
        launcher_pid=pid, launcher_start=process_start_time(pid), started_at=time.time(), **fields
    )


def replace_file(path: Path, text: str) -> Path:
    """Replace ``path`` with ``text`` at once (a temporary file beside it, then a rename): a reader
    sees the old content or the new, never a part; OSError when it cannot."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def save(record: JobRecord) -> Path:
    return replace_file(jobs_dir() / f"{record.id}.json", json.dumps(asdict(record), indent=1))


def read(path: Path) -> JobRecord:
    """The record in ``path``; BadRecord if it cannot be read (FileNotFoundError if it is gone)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError:
        raise BadRecord(path, "not UTF-8 text: expected a JSON job record") from None
    except OSError as exc:
        raise BadRecord(path, f"cannot read: {exc.strerror or exc}") from None
    if not text.strip():
        raise BadRecord(path, "empty file: expected a JSON job record")
    try:
        data = json.loads(text)
    except ValueError as exc:  # JSONDecodeError's text ends with the line and column
        raise BadRecord(path, f"not valid JSON (cut short?): {exc}") from None
    try:
        record = JobRecord.from_json(data)
    except ValueError as exc:
        raise BadRecord(path, str(exc)) from None
    if record.id != path.stem:
        raise BadRecord(path, f"field 'id': {record.id!r} is not the file's job id {path.stem!r}")
    return record


def load(job_id: str, on_bad: OnBad | None = None) -> JobRecord | None:
    """The record of ``job_id``; None when there is none, or it is bad (then ``on_bad`` hears why)."""
    if not JOB_ID_RE.match(job_id):
        return None
    check_readable()
    try:
        return read(jobs_dir() / f"{job_id}.json")
    except FileNotFoundError:
        return None
    except BadRecord as bad:
        if on_bad is not None:
            on_bad(bad)
        return None


def load_all(on_bad: OnBad | None = None) -> list[JobRecord]:
    """Every readable record, oldest first; each bad one is skipped and handed to ``on_bad``."""
    records = []
    check_readable()
    with contextlib.suppress(OSError):
        for path in sorted(jobs_dir().glob("*.json")):
            if not JOB_ID_RE.match(path.stem):
                if on_bad is not None:
                    on_bad(BadRecord(path, "the name is not a job id (letters, digits, '.', '_', '-')"))
                continue
            rec = load(path.stem, on_bad)
            if rec is not None:
                records.append(rec)
    return sorted(records, key=lambda r: r.started_at)


def unreadable(bad: BadRecord) -> str:
    """The one wording of a job record that cannot be read, for every command about one job."""
    return f"cannot read the job record {bad.message}"


def refuse(bad: BadRecord) -> None:
    """An ``on_bad`` for a command about one job: its record is unreadable, so stop (exit 2)."""
    raise UsageError(unreadable(bad))


def skipping(warn: Callable[[str], None]) -> OnBad:
    """An ``on_bad`` that warns, through ``warn``, that the record is skipped."""
    return lambda bad: warn(f"skipping unreadable job record {bad.message}")


def finish(record: JobRecord, state: str, exit_code: int | None) -> JobRecord:
    done = replace(record, state=state, exit_code=exit_code, ended_at=time.time())
    save(done)
    return done
