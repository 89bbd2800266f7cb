"""Whose job a process is: this home's, another home's, or nobody's (a stray).

Every process a launch starts carries ``LAUNCHKIT_JOB_HOME=HOST:PATH`` (``home_id``): the machine
(its host name) and the ``LAUNCHKIT_HOME`` (its real path) that record the job; on an ssh host too,
where it names the launcher's machine. ``launchkit kill --all`` ends the jobs this home records and
the strays: processes whose home is this machine's and holds no record of their job (the record
or the whole home was removed). It leaves a job recorded in another home, one launched from
another machine (whose records cannot be read here), and a process that names no home (an older
launchkit's, or one started by hand with ``LAUNCHKIT_JOB_ID``) whose job this home does not
record: ``launchkit kill JOB_ID`` ends those by their id.

``decide`` is the pure core: the processes seen (``Seen``) and what the records say -> one
``Verdict`` a job; ``recorded_in`` is its one look at the file system.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from launchkit.jobs import records as jobs


@dataclass(frozen=True)
class Seen:
    """Processes of one job, found on one host, that carry the same ``LAUNCHKIT_JOB_HOME``."""

    job_id: str
    home: str  # HOST:PATH; "" when they carry none
    count: int


@dataclass(frozen=True)
class Verdict:
    """What ``kill --all`` does with one job's processes on one host, and why."""

    job_id: str
    kind: str  # one of KINDS
    why: str  # "recorded here", "a stray: its home PATH has no record of it", "recorded in PATH", ...
    count: int  # its processes there

    @property
    def end(self) -> bool:
        return self.kind in ENDED


#: this home's job; a stray; another home's on this machine; one launched from another machine; a
#: process that names no home, or a home that is not HOST:PATH
KINDS = ("this home", "stray", "another home", "another machine", "no home")
ENDED = ("this home", "stray")


#: a job's processes in another home's (or an unknown) record: (home path, job id) -> recorded there
Recorded = Callable[[str, str], bool]


def home_id(host: str | None = None) -> str:
    """``HOST:PATH`` of this home: the host name and the real path of ``$LAUNCHKIT_HOME``."""
    return f"{host or socket.gethostname()}:{os.path.realpath(jobs.home())}"


def split(home: str) -> tuple[str, str] | None:
    """``(host, path)`` of a ``LAUNCHKIT_JOB_HOME`` value; None when it is not one."""
    host, sep, path = home.partition(":")
    return (host, path) if sep and host and path.startswith("/") else None


def recorded_in(path: str, job_id: str) -> bool:
    """Whether the home at ``path`` (on this machine) holds a record of ``job_id``, readable or
    not; True when it cannot be told (a home this user may not read): such a job is left alone."""
    if not jobs.JOB_ID_RE.match(job_id):
        return False
    try:
        os.stat(os.path.join(path, "jobs", f"{job_id}.json"))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def _other(seen: Seen, host: str, recorded: Recorded) -> tuple[str, str]:
    """Processes of a job this home does not record: (kind, why)."""
    if not seen.home:
        return "no home", "they name no home (an older launchkit's, or started by hand)"
    where = split(seen.home)
    if where is None:
        return "no home", f"they name a home that is not HOST:PATH ({seen.home!r})"
    if where[0] != host:
        return "another machine", f"launched from {where[0]} (its home {where[1]} cannot be read here)"
    if recorded(where[1], seen.job_id):
        return "another home", f"recorded in {where[1]}"
    return "stray", f"a stray: its home {where[1]} has no record of it"


def decide(seen: Iterable[Seen], *, mine: Collection[str], me: str, recorded: Recorded) -> list[Verdict]:
    """One verdict a job, in job id order: end the processes of a job ``mine`` (the job ids this
    home records) names or that carry ``me`` (this home's ``home_id``: its record is gone), and
    those of a stray (``_other``); leave the rest, with why (a job whose processes name several
    homes is left unless every one makes it a stray). ``recorded`` looks into another home of
    this machine (``recorded_in``)."""
    host = (split(me) or ("", ""))[0]
    by_job: dict[str, list[Seen]] = {}
    for s in seen:
        by_job.setdefault(s.job_id, []).append(s)
    verdicts = []
    for job, groups in sorted(by_job.items()):
        count = sum(s.count for s in groups)
        if job in mine:
            verdicts.append(Verdict(job, "this home", "recorded here", count))
        elif any(s.home == me for s in groups):
            verdicts.append(Verdict(job, "this home", "of this home, which no longer records it", count))
        else:
            said = [_other(s, host, recorded) for s in groups]
            left = [(kind, why) for kind, why in said if kind not in ENDED]
            verdicts.append(Verdict(job, *(left[0] if left else said[0]), count))
    return verdicts


def seen_of(found: Mapping[str, Mapping[str, object]]) -> list[Seen]:
    """``Seen`` from a scan (``procscan.scan``, or a host's: job -> home -> pids or a count)."""
    return [
        Seen(job, home, len(v) if isinstance(v, list) else int(v) if isinstance(v, int) else 0)
        for job, homes in found.items()
        for home, v in homes.items()
    ]
