"""The ssh backend: one connection and one watchdog per host, contacted in parallel.

The scheduler runs on this machine (without servers there is none: worker 0 serves the
rendezvous on its host, ``worker0.py``); servers and workers run on the hosts under
``launchkit.hostside.watchdog``, which the launcher sends over the connection. See docs/ssh.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from launchkit.backends.base import Backend, ProcessHandle
from launchkit.backends.local import LocalBackend
from launchkit.backends.ssh import WATCHDOG_SWEEP
from launchkit.backends.ssh.options import CONNECTION_FLAGS, SshOptions, from_flags
from launchkit.backends.ssh.sync import source_dir, sync_all
from launchkit.backends.ssh.worker0 import probe
from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import EngineFlag, fill, positive
from launchkit.core.hostfile import format_host, host_key, unique_hosts
from launchkit.core.placement import assign_hosts
from launchkit.core.spec import Host, LaunchSpec, Plan, Task
from launchkit.errors import BackendError
from launchkit.hostside.netif import route_to

# ``connection`` and ``agent`` import fabric: each method that needs them imports them, so that
# the launches that only read this backend's flags (every launch, on any backend) do not load it
if TYPE_CHECKING:
    from launchkit.backends.ssh.agent import HostAgent, RemoteProcess, UsageSink

#: how long ``await_started`` waits for the processes' pids once every one was asked to start
SPAWN_WAIT = 10.0
#: --start-timeout: how long a program the launcher runs on a host (the watchdog, the port
#: probe) may take to answer once its session is open (Horovod's --start-timeout is 30 s too)
START_TIMEOUT = 30.0


def connect_all(hosts: Sequence[Host], opts: SshOptions) -> tuple[dict[Host, Any], dict[Host, str]]:
    """Connect to every host in parallel (bounded). Returns open connections and per-host errors."""
    from launchkit.backends.ssh import connection as ssh

    conns: dict[Host, Any] = {}
    errors: dict[Host, str] = {}
    config = ssh.fabric_config(opts)

    def one(h: Host) -> None:
        try:
            conns[h] = ssh.connect(h, opts, config)
        except BackendError as exc:
            errors[h] = exc.message.removeprefix("ssh: ")

    ssh.on_each(one, hosts)
    return conns, errors


HEARTBEAT_TIMEOUT = EngineFlag(
    "--heartbeat-timeout", "Seconds of silence that end a host.", float, 10.0, check=positive
)
START_TIMEOUT_FLAG = EngineFlag(
    "--start-timeout",
    "Seconds a host's watchdog (or worker 0's port probe) may take to answer once connected.",
    float,
    START_TIMEOUT,
    check=positive,
)
SYNC_EXCLUDE = EngineFlag(
    "--sync-exclude", "rsync exclude pattern (repeatable).", multiple=True, fills="sync_excludes"
)


class SshBackend(Backend):
    name = "ssh"
    capabilities = Capabilities(
        needs_hostfile=True,
        connects=True,
        restarts=True,
        elastic="resize",
        syncs=True,
        options=frozenset(
            {
                "options",
                "heartbeat_interval",
                "heartbeat_timeout",
                "start_timeout",
                "sync_excludes",
                "console",
            }
        ),
        flags=(*CONNECTION_FLAGS, HEARTBEAT_TIMEOUT, START_TIMEOUT_FLAG, SYNC_EXCLUDE),
    )

    @classmethod
    def flag_options(cls, flags: Mapping[str, Any], spec: LaunchSpec) -> dict[str, Any]:
        own = fill((HEARTBEAT_TIMEOUT, START_TIMEOUT_FLAG, SYNC_EXCLUDE), flags)
        return {
            "options": from_flags(flags),
            "heartbeat_interval": min(1.0, own["heartbeat_timeout"] / 3),
            **own,
        }

    def __init__(
        self,
        options: SshOptions | None = None,
        *,
        heartbeat_interval: float = 1.0,
        heartbeat_timeout: float = 10.0,
        sync_excludes: Sequence[str] = (),
        console: Any = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.options = options or SshOptions()
        self.start_timeout = start_timeout
        self.hb_interval = heartbeat_interval
        self.hb_timeout = heartbeat_timeout
        self.sync_excludes = tuple(sync_excludes)
        self.console = console
        self.local = LocalBackend()
        self.conns: dict[tuple[str, int | None, str | None], Any] = {}
        self.agents: dict[tuple[str, int | None, str | None], HostAgent] = {}
        self._spawned: list[RemoteProcess] = []  # asked to start, pid not yet awaited
        self._queued: dict[tuple[str, int | None, str | None], list[RemoteProcess]] = {}  # not yet sent
        self.spec: LaunchSpec | None = None
        self.job_id = ""
        self.added: list[Host] = []  # hosts an elastic job gained while it ran (``add_host``)
        self.usage_sink: UsageSink | None = None
        # after ``close``: the hosts whose watchdog confirmed its sweep of the job (its bye), each
        # with what that sweep ended; recorded, so that kill and a restart's check skip them
        self.swept: dict[str, int] | None = None

    def watchdog_timeout(self) -> float | None:
        return self.hb_timeout

    def set_host_sink(self, sink: UsageSink) -> None:
        """Where each host's figures go, as its watchdog's heartbeats bring them (the metrics endpoint)."""
        self.usage_sink = sink

    def connect(self, spec: LaunchSpec) -> str | None:
        """Contact every host first (fail fast, naming the unreachable ones); returns the local
        address through which the first host is reached."""
        self.spec = spec
        hosts = unique_hosts(spec.hosts)
        conns, errors = connect_all(hosts, self.options)
        if errors:
            from launchkit.backends.ssh import connection as ssh

            for c in conns.values():
                ssh.close(c)
            detail = "; ".join(errors[h] for h in hosts if h in errors)
            raise BackendError(
                "ssh", f"{len(errors)} of {len(hosts)} host(s) unreachable, nothing started: {detail}"
            )
        self.conns = {host_key(h): conns[h] for h in hosts}
        first = conns[hosts[0]]
        with contextlib.suppress(AttributeError, OSError):
            reached = str(first.transport.sock.getsockname()[0])
            # ps-lite reads DMLC_PS_ROOT_URI as IPv4: a connection made over IPv6 (``localhost`` is
            # ``::1`` first on Debian) gives way to the IPv4 route toward the same host, if it has one
            return route_to(first.host) if ":" in reached and route_to(first.host) else reached
        return route_to(first.host)  # through a jump host or a ProxyCommand: no socket of ours

    def reached_name(self, host: Host) -> str:
        """The ssh config's ``HostName`` for ``host`` (fabric resolved it when connecting)."""
        conn = self.conns.get(host_key(host))
        return str(conn.host) if conn is not None and getattr(conn, "host", None) else host.name

    def worker0_ports(self, spec: LaunchSpec) -> tuple[str, int, int] | None:
        """Worker 0's address and two free ports on its host (``worker0.probe``)."""
        host = assign_hosts(spec.num_workers, spec.num_servers, spec.hosts)[spec.num_servers]
        conn = self.conns[host_key(host)]
        return probe(
            conn, host, spec.interface, self.options.connect_timeout, start_timeout=self.start_timeout
        )

    def _sync(self, hosts: list[Host]) -> None:
        """The working directory to ``--sync-dst-dir`` on ``hosts`` (nothing without it)."""
        assert self.spec is not None
        if self.spec.sync_dst_dir:
            from rich.console import Console

            sync_all(
                hosts,
                source_dir(),
                self.spec.sync_dst_dir,
                self.options,
                self.sync_excludes,
                self.console or Console(stderr=True),
                self.spec.sync_timeout,
            )

    def prepare(self, plan: Plan) -> None:
        assert self.spec is not None, "connect() first"
        self.swept = None  # this attempt's watchdogs have confirmed nothing yet
        hosts = unique_hosts(self.spec.hosts)
        self._sync(hosts)
        self.job_id = plan.job_id
        agents = {host_key(h): self._agent(h) for h in hosts}
        errors = self._start_agents(list(agents.values()))
        self.agents = agents
        if errors:
            self.close()
            raise BackendError(
                "ssh", f"could not start on {len(errors)} host(s): {'; '.join(errors.values())}"
            )

    def _agent(self, h: Host) -> HostAgent:
        from launchkit.backends.ssh.agent import HostAgent

        assert self.spec is not None
        return HostAgent(
            h,
            self.conns[host_key(h)],
            self.job_id,
            hb_interval=self.hb_interval,
            hb_timeout=self.hb_timeout,
            grace=self.spec.grace_period,
            interface=self.spec.interface,
            # the launcher ends the job at the limit; the watchdog's own deadline is the
            # backstop when the launcher cannot (cut off), with the grace period added
            time_limit=None
            if self.spec.time_limit is None
            else self.spec.time_limit + self.spec.grace_period + 5,
            on_usage=self.usage_sink,
        )

    def _start_agents(self, agents: list[HostAgent]) -> dict[Host, str]:
        """Each host's watchdog started, in parallel; what went wrong on each host where it did not."""
        from launchkit.backends.ssh import connection as ssh

        errors: dict[Host, str] = {}

        def start(agent: HostAgent) -> None:
            try:
                agent.start(self.options.connect_timeout, self.start_timeout)
            except BackendError as exc:
                errors[agent.host] = exc.message.removeprefix("ssh: ")
            except Exception as exc:
                errors[agent.host] = f"{agent.host}: {exc}"

        ssh.on_each(start, agents)
        return errors

    def add_host(self, host: Host) -> None:
        """A host that appeared while an elastic job runs, or one whose connection was lost (a cut
        link: that connection and its watchdog are gone for good): reached, synced
        (``--sync-dst-dir``) and its watchdog started, as at the job's start; nothing for a host
        whose watchdog runs; BackendError naming what failed."""
        assert self.spec is not None, "prepare() first"
        key = host_key(host)
        old = self.agents.get(key)
        if old is not None and old.lost is None:
            return
        if old is not None:
            from launchkit.backends.ssh import connection as ssh

            # its watchdog, if it still runs there, ends the job's processes by job id when it
            # stops hearing from the launcher: a new worker waits until it surely has
            ends = (old.lost_at or 0.0) + self.hb_timeout + self.spec.grace_period + WATCHDOG_SWEEP
            if time.monotonic() < ends:
                raise BackendError(
                    "ssh",
                    f"{host}: its connection was lost ({old.lost}); its watchdog may still be ending "
                    f"the job's processes there for up to {math.ceil(ends - time.monotonic())} s",
                )
            old.close(0)  # (lost: it closes its channel and connection, and waits for nothing)
            del self.agents[key]
            ssh.close(self.conns.pop(key))
        conns, errors = connect_all([host], self.options)
        if errors:
            raise BackendError("ssh", errors[host])
        self.conns[key] = conns[host]
        self._sync([host])
        agent = self._agent(host)
        failed = self._start_agents([agent])
        if failed:
            from launchkit.backends.ssh import connection as ssh

            ssh.close(self.conns.pop(key))
            raise BackendError("ssh", failed[host])
        self.agents[key] = agent
        if old is None:
            self.added.append(host)

    def await_started(self) -> None:
        """Every remote process asked to start has started (its pid known), ended, or its host was
        lost; at most SPAWN_WAIT s in all (``start`` asks without waiting)."""
        self.send_starts()  # (the supervisor has sent them; anything queued since goes now)
        deadline = time.monotonic() + SPAWN_WAIT
        for proc in self._spawned:
            proc.started.wait(max(0.0, deadline - time.monotonic()))
        self._spawned = []

    def record_info(self) -> dict[str, Any] | None:
        hosts = unique_hosts([*self.spec.hosts, *self.added]) if self.spec else []
        info = {"hosts": [format_host(h) for h in hosts], "ssh": dataclasses.asdict(self.options)}
        if self.swept is not None:  # closed: which watchdogs swept their host (jobs.kill.confirmed_sweeps)
            info["swept"] = self.swept
        return info

    def start(self, task: Task) -> ProcessHandle:
        if task.role == "scheduler":
            return self.local.start(task)
        # not waited for one by one: a round trip per process, in turn, took 29 s for 1024
        # processes on 128 hosts; and not sent one by one: ``send_starts`` sends each host its
        # processes in one message, which its watchdog starts at once (bench/scale.py)
        key = host_key(task.host)
        proc: RemoteProcess = self.agents[key].add(task.task_id, task)
        self._queued.setdefault(key, []).append(proc)
        self._spawned.append(proc)
        return proc

    def send_starts(self) -> None:
        """Each host's queued processes in one ``spawns`` message, the hosts in parallel (1024
        messages at 128 hosts x 8, each a paramiko packet and a wake of the watchdog's reader,
        were 0.5 ms of the launcher's start a process: bench/scale_profile.py)."""
        from launchkit.backends.ssh import connection as ssh

        queued, self._queued = self._queued, {}
        # in parallel: one after the other, each send waited for Python's interpreter lock while the
        # hosts already started answered (1.4 s for 128 hosts, profiled)
        ssh.on_each(lambda item: self.agents[item[0]].send_spawns(item[1]), list(queued.items()))

    def watch(self, handle: ProcessHandle, ended: Callable[[int], None]) -> None:
        # the host's reader learns of the end: no thread per process (1024 of them took 1.4 ms
        # each to start while the launch was busy: bench/scale.py at 128 hosts x 8)
        from launchkit.backends.ssh.agent import RemoteProcess

        if isinstance(handle, RemoteProcess):
            handle.on_exit(ended)
        else:
            super().watch(handle, ended)  # the scheduler, here

    def close(self) -> None:
        from launchkit.backends.ssh import connection as ssh

        agents = list(self.agents.values())
        if agents:
            timeout = (self.spec.grace_period if self.spec else 5.0) + 5.0
            ssh.on_each(lambda a: a.close(timeout), agents)
            self.swept = {str(a.host): a.swept for a in agents if a.confirmed}
        for c in self.conns.values():
            ssh.close(c)
        self.agents = {}
        self.conns = {}
