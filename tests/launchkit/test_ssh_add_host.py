"""``SshBackend.add_host`` for a host whose connection was lost (a cut link) while an elastic job
runs, in one process (no connection is made): a new worker there waits until the host's old
watchdog has surely ended the job's processes (its sweep by job id would end the new one too),
then the host is reached again from the start, the lost agent closed."""

from __future__ import annotations

import time

import pytest

from launchkit.backends.ssh import WATCHDOG_SWEEP
from launchkit.backends.ssh import backend as ssh_backend
from launchkit.backends.ssh.backend import SshBackend
from launchkit.core.hostfile import host_key
from launchkit.core.spec import Host, LaunchSpec
from launchkit.errors import BackendError


class LostAgent:
    def __init__(self, lost_at: float) -> None:
        self.lost = "host h stopped answering (no heartbeat for 4.1s)"
        self.lost_at = lost_at
        self.closed = False

    def close(self, timeout: float) -> None:
        self.closed = True


def backend_with_lost_host(lost_at: float) -> tuple[SshBackend, Host, LostAgent]:
    h = Host("h")
    b = SshBackend(heartbeat_timeout=4.0)
    b.spec = LaunchSpec(num_workers=1, num_servers=0, command=("x",), hosts=(h,), grace_period=2.0)
    agent = LostAgent(lost_at)
    b.agents[host_key(h)] = agent  # type: ignore[assignment]
    b.conns[host_key(h)] = object()
    return b, h, agent


def test_a_lost_host_is_not_used_while_its_old_watchdog_may_still_sweep_the_job() -> None:
    b, h, agent = backend_with_lost_host(time.monotonic())
    with pytest.raises(BackendError) as caught:
        b.add_host(h)
    said = caught.value.message
    head = f"ssh: h: its connection was lost ({agent.lost}); its watchdog may still be ending the job's "
    assert said.startswith(head + "processes there for up to "), said
    # its heartbeat timeout, the grace period, its last words and sweep
    assert 0 < int(said.split()[-2]) <= 4.0 + 2.0 + WATCHDOG_SWEEP
    assert not agent.closed and b.agents[host_key(h)] is agent  # nothing changed


def test_after_that_the_lost_host_is_reached_again_from_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    b, h, agent = backend_with_lost_host(time.monotonic() - 60)
    tried: list[list[Host]] = []

    def connect_all(hosts, opts):
        tried.append(list(hosts))
        return {}, {h: "h: connection refused"}

    monkeypatch.setattr(ssh_backend, "connect_all", connect_all)
    with pytest.raises(BackendError, match="h: connection refused"):
        b.add_host(h)
    assert tried == [[h]]  # a new connection
    assert agent.closed and host_key(h) not in b.agents and host_key(h) not in b.conns
    assert b.added == []  # not a host the job gained: one it had
