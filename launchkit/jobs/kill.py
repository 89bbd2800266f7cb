"""End running jobs on this host: ``launchkit kill``'s logic, by job id (never by name)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from dataclasses import dataclass

from launchkit.backends.batch import SUBMIT_TIMEOUT
from launchkit.backends.ssh import commands as ssh_commands
from launchkit.backends.ssh.commands import HostResult
from launchkit.backends.ssh.options import SshOptions
from launchkit.core.hostfile import parse_host, unique_hosts
from launchkit.core.spec import Host
from launchkit.hostside import procscan
from launchkit.jobs import detached, owner
from launchkit.jobs import records as jobs


@dataclass(frozen=True)
class StopResult:
    job_id: str
    ended: int  # processes of the job on this machine that were running and are gone now
    launcher_stopped: bool
    hosts: tuple[HostResult, ...] = ()  # per remote host: processes ended there, or the error
    cancelled: str | None = None  # a detached job: the engine job that was cancelled
    lost: bool = False  # its launcher had died without recording the end: the record is left so


#: seconds the sweep of a job's hosts may take after its launcher has ended (connections included)
SWEEP_BOUND = 30.0


def remote_hosts(record: jobs.JobRecord) -> tuple[list[Host], SshOptions] | None:
    info = record.remote or {}
    if not info.get("hosts"):
        return None
    known = {f.name for f in dataclasses.fields(SshOptions)}
    opts = SshOptions(**{k: v for k, v in info.get("ssh", {}).items() if k in known})
    return [parse_host(h.split()[0]) for h in info["hosts"]], opts


def hosts_that_ran(record: jobs.JobRecord, hosts: list[Host]) -> list[Host]:
    """Those of ``hosts`` that the record says ran a process of the job (all of them when it
    names none: a record written before its processes were)."""
    ran = {p.host for p in record.processes}
    return [h for h in hosts if str(h) in ran] or hosts


def confirmed_sweeps(record: jobs.JobRecord, ended: bool | None = None) -> dict[str, int]:
    """The hosts (``str(Host)``) whose watchdog confirmed at the job's end that it had swept the job
    from its host (its ``bye``), each with how many processes that sweep ended: ``remote.swept``,
    which the launcher records as it finishes the job. Trusted only from a launcher that recorded
    the end (``ended``: by default, the record is no longer ``running``): a lost launcher (killed
    with SIGKILL, its host gone) recorded nothing of it, and a record without the field (an older
    launcher, another backend) confirms nothing, so every host that ran a process is swept."""
    swept = (record.remote or {}).get("swept")
    if not (record.state != "running" if ended is None else ended) or not isinstance(swept, dict):
        return {}
    return {h: n for h, n in swept.items() if isinstance(n, int) and not isinstance(n, bool)}


def hosts_to_sweep(record: jobs.JobRecord, hosts: list[Host], ended: bool | None = None) -> list[Host]:
    """Those of ``hosts`` that ran a process of the job (``hosts_that_ran``) and whose watchdog did
    not confirm its own sweep of the job (``confirmed_sweeps``): at 128 hosts, sweeping each again
    took kill 2 s more (128 handshakes on 2 cores) for nothing."""
    confirmed = confirmed_sweeps(record, ended)
    return [h for h in hosts_that_ran(record, hosts) if str(h) not in confirmed]


def sweep_hosts(record: jobs.JobRecord, grace: float, ended: bool | None = None) -> list[HostResult]:
    """End what is left of the record's job on the hosts that ran a process of it and whose
    watchdog did not confirm its sweep (none: the job ran on no ssh hosts, or all confirmed)."""
    where = remote_hosts(record)
    hosts = hosts_to_sweep(record, where[0], ended) if where is not None else []
    if where is None or not hosts:
        return []
    reach = ssh_commands.Reach(hosts, where[1])
    try:
        return reach.sweep(record.id, grace, grace + SWEEP_BOUND)
    finally:
        reach.close()


@dataclass(frozen=True)
class AllPlan:
    """What ``kill --all`` ends: the jobs this home records as running (those ``ps`` lists:
    running or lost), and on each machine the processes ``owner.decide`` finds are this home's
    jobs or strays; what it leaves, with why."""

    listed: tuple[str, ...]  # recorded here as running
    here: tuple[owner.Verdict, ...]  # the jobs with a process on this machine
    mine: frozenset[str]  # every job id this home records (readable or not)
    me: str  # this home's LAUNCHKIT_JOB_HOME

    def to_end(self) -> list[str]:
        """The jobs to end from here (``stop_job``), in job id order."""
        return sorted({*self.listed, *(v.job_id for v in self.here if v.end)})

    def on_host(self, found: dict[str, dict[str, object]]) -> list[owner.Verdict]:
        """The verdicts for what a host's scan found (``Reach.scan``)."""
        return owner.decide(owner.seen_of(found), mine=self.mine, me=self.me, recorded=owner.recorded_in)


def plan_all(on_bad: jobs.OnBad | None = None) -> AllPlan:
    """``kill --all``'s plan on this machine (it ends nothing). A record ``on_bad`` hears is
    unreadable still names a job of this home (its file's name)."""
    unreadable: list[str] = []

    def note(bad: jobs.BadRecord) -> None:
        unreadable.append(bad.path.stem)
        if on_bad is not None:
            on_bad(bad)

    records = jobs.load_all(note)
    mine = frozenset({r.id for r in records} | set(unreadable))
    me = owner.home_id()
    here = owner.decide(owner.seen_of(procscan.scan()), mine=mine, me=me, recorded=owner.recorded_in)
    return AllPlan(tuple(r.id for r in records if r.state == "running"), tuple(here), mine, me)


def scan_hosts(hosts: list[Host], opts: SshOptions) -> tuple[ssh_commands.Reach, list[HostResult]]:
    """Every job with a process on ``hosts`` (``kill --all -H``), over connections left open for
    ``sweep_chosen`` (the caller closes them, ``Reach.close``, when it sweeps nothing)."""
    reach = ssh_commands.Reach(hosts, opts)
    try:
        return reach, reach.scan(SWEEP_BOUND)
    except BaseException:
        reach.close()
        raise


def sweep_chosen(
    reach: ssh_commands.Reach, plan: AllPlan, scanned: list[HostResult], grace: float
) -> list[HostResult]:
    """End on each host the jobs ``plan`` gives its scan to end; each host's data: ``ended`` and
    ``verdicts`` (the jobs found there, ended or left). A host the scan did not reach keeps its error."""
    verdicts = {r.host: plan.on_host(r.data.get("jobs", {})) for r in scanned if r.ok}
    ids_of = {h: [v.job_id for v in vs if v.end] for h, vs in verdicts.items()}
    swept = {r.host: r for r in reach.sweep_each(ids_of, grace, grace + SWEEP_BOUND)}
    out = []
    for r in scanned:
        if not r.ok:
            out.append(r)
            continue
        done = swept[r.host]
        out.append(dataclasses.replace(done, data={**done.data, "verdicts": verdicts[r.host]}))
    return out


def _stop_launcher(record: jobs.JobRecord, grace: float) -> bool:
    """Ask a live launcher to end its job (SIGTERM: it tears down and records the end)."""
    if not record.launcher_alive():
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(record.launcher_pid, signal.SIGTERM)
    deadline = time.monotonic() + grace + 3.0
    while time.monotonic() < deadline and record.launcher_alive():
        time.sleep(0.05)
    return True


def stop_job(job_id: str, grace: float = 3.0) -> StopResult:
    running = set(procscan.find_job_pids(job_id))
    record = jobs.load(job_id)
    if record is not None and record.submitting:  # --detach, in its submission: wait for it
        record = detached.await_submission(record, SUBMIT_TIMEOUT + 5.0)
    if record is not None and detached.engine_job(record) is not None:
        # a batch job no launcher follows: the engine ends it (harmless if it already ended)
        info = record.remote or {}
        error = detached.cancel(record)
        if error is not None:
            return StopResult(
                job_id, 0, False, (HostResult(Host(str(info.get("engine"))), False, error=error),)
            )
        return StopResult(job_id, 0, True, cancelled=f"{info.get('engine')} job {info.get('engine_job')}")
    stopped = False
    lost = record is not None and record.shown_state == "lost"
    where = remote_hosts(record) if record is not None else None
    reach: ssh_commands.Reach | None = None
    try:
        if record is not None and record.state == "running" and not lost:
            stopped = _stop_launcher(record, grace)
        # the hosts are contacted once the launcher has ended the job: contacted meanwhile (128
        # handshakes on 2 cores), the job's end took 2.4 s instead of 1.1, and kill no less; and only
        # those whose watchdog did not confirm its sweep in the record the launcher finished
        last = (jobs.load(job_id) or record) if record is not None else None
        confirmed = confirmed_sweeps(last) if last is not None else {}
        ran = hosts_that_ran(last, where[0]) if last is not None and where is not None else []
        left = [h for h in ran if str(h) not in confirmed]
        if left and where is not None:
            reach = ssh_commands.Reach(left, where[1])
        procscan.sweep_job(job_id, grace)
        procscan.remove_shm(job_id)
        if record is not None and not lost:  # a lost job's end is not known: it stays lost
            fresh = jobs.load(job_id) or record
            if fresh.state == "running" or (stopped and fresh.state == "interrupted"):
                jobs.finish(fresh, "killed", fresh.exit_code)
        ended = sum(1 for pid in running if not procscan.alive(pid))
        swept = reach.sweep(job_id, grace, grace + SWEEP_BOUND) if reach is not None else []
        # a host whose watchdog swept it: nothing of the job was left there for kill to end
        done = [
            HostResult(h, True, data={"ended": 0, "watchdog": confirmed[str(h)]})
            for h in unique_hosts(ran)
            if str(h) in confirmed
        ]
        order = {str(h): i for i, h in enumerate(unique_hosts(ran))}
        remote = tuple(sorted([*swept, *done], key=lambda r: order.get(str(r.host), len(order))))
    finally:
        if reach is not None:
            reach.close()
    return StopResult(job_id, ended, stopped, remote, lost=lost)


def active_job_ids(on_bad: jobs.OnBad | None = None) -> list[str]:
    """Jobs of this user that may still have processes: recorded as running (or lost), plus
    any job id found in a live process's environment (also the job of a record that ``on_bad``
    hears is unreadable)."""
    ids = {r.id for r in jobs.load_all(on_bad) if r.state == "running"}
    for pid in procscan.find_job_pids(None):
        ids.update(procscan.job_ids_of(pid))
    return sorted(ids)


def elsewhere(job_id: str) -> str | None:
    """Why ``kill JOB_ID`` leaves a job this home does not record: its processes here are another
    home's (``owner.decide``); None when they are not (a stray, or none)."""
    homes = procscan.scan().get(job_id)
    found = {job_id: homes} if homes else {}
    verdicts = owner.decide(owner.seen_of(found), mine=(), me=owner.home_id(), recorded=owner.recorded_in)
    if verdicts and verdicts[0].kind in ("another home", "another machine"):
        return verdicts[0].why
    return None
