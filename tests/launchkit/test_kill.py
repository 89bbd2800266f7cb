"""``launchkit kill``'s choice of the ssh hosts it sweeps (``jobs.kill``), in process: only those
that ran a process of the job and whose watchdog did not confirm its own sweep in the record the
launcher finished; every host that ran one where the record says nothing of it (issue 28)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from launchkit.backends.ssh.backend import SshBackend
from launchkit.core.hostfile import parse_host
from launchkit.core.spec import Host
from launchkit.jobs import kill
from launchkit.jobs import records as jobs

JOB = "1127-204500-abcdef"
# three hosts that refuse at once (nothing listens on port 1 of these loopback addresses)
A, B, C = "127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"


def ended_record(**remote: Any) -> jobs.JobRecord:
    """A job that ran a worker on each of A, B and C and whose launcher has ended (a dead pid)."""
    return jobs.JobRecord(
        id=JOB,
        name="train",
        backend="ssh",
        hosts=(A, B, C),
        command=("python", "train.py"),
        cwd="/tmp",
        launcher_pid=2**22 + 7,
        launcher_start=1,
        started_at=1.0e9,
        state="succeeded",
        ended_at=1.0e9 + 5,
        exit_code=0,
        processes=tuple(jobs.ProcessRecord("worker", i, h, 100 + i) for i, h in enumerate((A, B, C))),
        remote={"hosts": [A, B, C], "ssh": {"connect_timeout": 2.0}, **remote},
    )


HOSTS = [parse_host(h) for h in (A, B, C)]


def names(hosts: list[Host]) -> list[str]:
    return [str(h) for h in hosts]


def test_only_the_hosts_that_ran_and_did_not_confirm_their_sweep() -> None:
    record = ended_record(swept={B: 0, C: 2})
    assert names(kill.hosts_to_sweep(record, HOSTS)) == [A]
    assert names(kill.hosts_to_sweep(ended_record(swept={A: 0, B: 0, C: 0}), HOSTS)) == []


def test_every_host_that_ran_without_the_launchers_word() -> None:
    assert names(kill.hosts_to_sweep(ended_record(), HOSTS)) == [A, B, C]  # an older record: no field
    # a lost launcher (SIGKILL) recorded no end: what it held of the sweeps counts for nothing
    lost = replace(ended_record(swept={B: 0, C: 0}), state="running", ended_at=None, exit_code=None)
    assert names(kill.hosts_to_sweep(lost, HOSTS)) == [A, B, C]
    # unless the caller is the launcher that ended the attempt itself (a restart's check)
    assert names(kill.hosts_to_sweep(lost, HOSTS, ended=True)) == [A]
    # a field that is not host -> count confirms nothing for that host
    odd = ended_record(swept={B: "yes", C: True})
    assert names(kill.hosts_to_sweep(odd, HOSTS)) == [A, B, C]
    # a host that ran nothing is not swept either way
    only_a = replace(ended_record(swept={B: 0}), processes=(jobs.ProcessRecord("worker", 0, A, 100),))
    assert names(kill.hosts_to_sweep(only_a, HOSTS)) == [A]


def test_the_swept_field_survives_the_record_file(launchkit_home) -> None:
    jobs.save(ended_record(swept={B: 0, C: 2}))
    loaded = jobs.load(JOB)
    assert loaded is not None and loaded.remote is not None and loaded.remote["swept"] == {B: 0, C: 2}


def test_kill_contacts_only_the_unconfirmed_host(launchkit_home) -> None:
    """The launcher is gone and recorded that B's and C's watchdogs swept them: kill reports them
    swept (nothing left for it) and tries only A (refused). Before, it connected to all three."""
    jobs.save(ended_record(swept={B: 0, C: 2}))
    res = kill.stop_job(JOB, grace=0.5)
    by_host = {str(r.host): r for r in res.hosts}
    assert list(by_host) == [A, B, C], res.hosts
    assert not by_host[A].ok and by_host[A].error
    assert by_host[B].ok and by_host[B].data == {"ended": 0, "watchdog": 0}
    assert by_host[C].ok and by_host[C].data == {"ended": 0, "watchdog": 2}


@dataclass
class FakeAgent:
    host: Host
    confirmed: bool
    swept: int = 0
    closed: bool = False

    def close(self, timeout: float) -> None:
        self.closed = True


def test_the_ssh_backend_records_which_watchdogs_said_bye() -> None:
    backend = SshBackend()
    assert "swept" not in (backend.record_info() or {})  # not closed: nothing confirmed yet
    agents = [FakeAgent(HOSTS[0], False), FakeAgent(HOSTS[1], True, 0), FakeAgent(HOSTS[2], True, 3)]
    backend.agents = {(h.host.name, h.host.port, None): h for h in agents}  # type: ignore[misc]
    backend.close()
    assert all(a.closed for a in agents)
    assert (backend.record_info() or {})["swept"] == {B: 0, C: 3}
