"""Find and end a job's processes by the job id in their environment (never by a name pattern).

Every process a job starts inherits ``LAUNCHKIT_JOB_ID``, including grandchildren that started
a new session or process group; ``/proc/PID/environ`` shows it, and ``LAUNCHKIT_JOB_HOME``: where
the job is recorded (``scan``; ``launchkit.jobs.owner`` tells whose job that makes it). Only this user's processes are
readable, so another user's job is never touched. This module is also what the launcher's
reaper and ``launchkit kill`` use on the local host; it only needs the standard library, so a
remote watchdog can run the same code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Collection, Iterable

JOB_VAR = b"LAUNCHKIT_JOB_ID="
HOME_VAR = b"LAUNCHKIT_JOB_HOME="  # HOST:PATH of the home that records the job (jobs.owner)
SHM_DIR = "/dev/shm"  # (a str: no ``pathlib`` in a watchdog's teardown, 2.5 ms of CPU a host)
SHM_PREFIX = "launchkit-"


def _environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X")
    except (OSError, ValueError):
        return True


def _values(data: bytes | None, var: bytes) -> set[str]:
    if not data:
        return set()
    return {e[len(var) :].decode(errors="replace") for e in data.split(b"\0") if e.startswith(var)}


def job_ids_of(pid: int) -> set[str]:
    """The job ids in one process's environment (usually zero or one)."""
    return _values(_environ(pid), JOB_VAR)


def job_home_of(pid: int) -> str:
    """The ``LAUNCHKIT_JOB_HOME`` in one process's environment ("" when it carries none)."""
    return min(_values(_environ(pid), HOME_VAR), default="")


def pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def find_job_pids(job_id: str | Collection[str] | None = None, exclude: Iterable[int] = ()) -> list[int]:
    """Live pids of this user whose environment carries ``job_id`` (one of those job ids, given a
    collection; any job id when None).

    Only processes of this host count: those in our own PID namespace. (A container or a
    test host in a child PID namespace is another machine as far as jobs are concerned; its
    processes are reached through that host, not killed from here.)"""
    skip = {os.getpid(), *exclude}
    uid = os.getuid()
    own_ns = pid_namespace("self")
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in skip:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        ids = job_ids_of(pid)
        if (
            (ids if job_id is None else job_id in ids if isinstance(job_id, str) else ids & set(job_id))
            and not _is_zombie(pid)
            and pid_namespace(pid) == own_ns
        ):
            found.append(pid)
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def terminate(pids: Iterable[int], grace: float, poll: float = 0.05) -> list[int]:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left. Returns the pids signalled."""
    pids = [p for p in pids if alive(p)]
    signal_pids(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(poll)
    signal_pids([p for p in pids if alive(p)], signal.SIGKILL)
    return pids


def scan(exclude: Iterable[int] = ()) -> dict[str, dict[str, list[int]]]:
    """Every job with a live process here: job id -> the ``LAUNCHKIT_JOB_HOME`` its processes
    carry ("" for none) -> their pids."""
    found: dict[str, dict[str, list[int]]] = {}
    for pid in find_job_pids(None, exclude):
        data = _environ(pid)
        home = min(_values(data, HOME_VAR), default="")
        for job in _values(data, JOB_VAR):
            found.setdefault(job, {}).setdefault(home, []).append(pid)
    return found


def sweep_job(
    job_id: str | Collection[str] | None, grace: float, rounds: int = 3, exclude: Iterable[int] = ()
) -> int:
    """End every process of a job (of any of those jobs, given a collection; all jobs when
    ``job_id`` is None), including ones that fork while we sweep. Returns how many processes
    were ended."""
    ended: set[int] = set()
    for _ in range(rounds):
        pids = find_job_pids(job_id, exclude)
        if not pids:
            break
        ended.update(terminate(pids, grace))
    return len(ended)


def remove_shm(job_id: str) -> int:
    """Delete the job's shared-memory segments (``/dev/shm/launchkit-<job_id>-*``)."""
    removed = 0
    prefix = f"{SHM_PREFIX}{job_id}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))
                    removed += 1
    return removed
