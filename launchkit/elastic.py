"""The supervisor's part of an elastic job (``-n MIN:MAX``): the effects around the pure
decisions of ``launchkit.membership`` (who is a member, when the group restarts) and
``launchkit.core.elastic`` (which hosts, the blacklist). ``Elastic`` is told of each worker's end
and ticked from the supervisor's loop; it starts and signals workers through the supervisor's
hooks (``Hooks``), polls the hosts (the hostfile's time, or the discovery script, every second)
and keeps the history of the membership (``changes``). docs/elastic.md, "In launchkit"."""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import dmlc_env
from launchkit.core.capabilities import Elasticity
from launchkit.core.elastic import COOL_DOWN, COOL_DOWN_CAP, Blacklist, blacklist, host_counts, new_workers
from launchkit.core.placement import machine_key
from launchkit.core.plan import Member, member_task
from launchkit.core.spec import Host, LaunchSpec, Plan, Task, TaskResult
from launchkit.hostdiscovery import HostPoller, HostSource
from launchkit.jobs.history import Change
from launchkit.membership import Act, Membership, grow, respawned, started, tick, worker_ended

if TYPE_CHECKING:
    from launchkit.backends.base import Backend
    from launchkit.telemetry.endpoint import Telemetry

#: seconds an elastic job's scheduler may take to end by itself after the last worker ended
SCHEDULER_WAIT = 2.0


class Hooks(Protocol):
    """What the supervisor lends the controller."""

    def start_task(self, task: Task) -> int:
        """Start ``task`` (a new process of the job); its index among the supervisor's processes."""
        ...

    def signal_task(self, index: int, sig: int) -> None: ...

    def reach_host(self, host: Host) -> str | None:
        """Make ``host`` ready for workers (the backend's ``add_host``); what failed, or None."""
        ...


@dataclass
class _Worker:
    task: Task
    epoch: int


@dataclass
class Elastic:
    plan: Plan
    elasticity: Elasticity
    hosts: tuple[Host, ...]  # the hosts the job may use now
    source: HostPoller | None  # the hosts read again (a thread of its own), started by ``begin``
    in_process: Callable[[int], bool]  # whether the worker of that index reported the figure
    say: Callable[[str], None]  # a membership change, a discovery problem (console, dashboard, record)
    grace: float
    node_host: Callable[[Host], str]
    cool_down: float = COOL_DOWN  # a host's first cool-down after a worker failed there (doubling)
    state: Membership = field(init=False)
    changes: list[Change] = field(default_factory=list)
    bad: Blacklist = field(default_factory=dict)
    workers: dict[int, _Worker] = field(default_factory=dict)  # supervisor index -> worker
    next_index: int = 0  # the launcher's next unused worker index (LAUNCHKIT_ROLE_RANK)
    reached: set[tuple[str, int | None]] = field(default_factory=set)  # the machines ready for workers
    stopped: dict[int, int] = field(default_factory=dict)  # worker -> the restart it was stopped for
    _left: list[str] = field(default_factory=list)  # who left since the last change was said
    done_at: float | None = None  # when the last worker of a finishing job ended

    def __post_init__(self) -> None:
        assert self.plan.elastic is not None
        self.state = Membership(self.plan.elastic)

    def begin(self, first: Sequence[tuple[int, Task]]) -> None:
        """The first workers run (supervisor index, task)."""
        for index, task in first:
            self.workers[index] = _Worker(task, 0)
            self.reached.add(machine_key(task.host))
            self.next_index = max(self.next_index, task.rank + 1)
        self.state = started(self.state, frozenset(i for i, _ in first))
        if self.source is not None:
            self.source.start()

    def close(self) -> None:
        """The job ended: no more looks at the hosts."""
        if self.source is not None:
            self.source.close()

    def is_worker(self, index: int) -> bool:
        return index in self.workers

    def _every_live_in_process(self, but: int | None = None) -> bool:
        """Every live worker (``but`` the one that just ended) handles a change itself."""
        return all(self.in_process(self.workers[i].task.rank) for i in self.state.live if i != but)

    def ended(self, index: int, exit_code: int, signum: int | None, now: float, hooks: Hooks) -> bool:
        """Worker ``index`` ended: True when the job goes on (a change of membership, a worker
        stopped for a restart, one that finished), False when it must end (fewer than MIN remain:
        this worker is the root cause)."""
        stopping = index in self.state.stopping
        if stopping:
            self.stopped[index] = self.state.restarts + 1
        in_process = self._every_live_in_process(but=index)
        if exit_code != 0 and not stopping and not in_process and self.elasticity != "resize":
            # restart mode needs new processes, which this backend cannot add to its allocation
            self.say(
                f"worker {self.workers[index].task.rank} failed and not every worker handles a change in "
                "its own process: the workers would restart, which this backend cannot do; ending the job"
            )
            return False
        self.state, acts = worker_ended(self.state, index, exit_code == 0, in_process, now, self.grace)
        worker = self.workers[index]
        how = f"signal {signum}" if signum else f"exit {exit_code}"
        if Act.FAIL in acts:
            n = len(self.state.live) + self.state.finished
            remain = f"{n} worker remains" if n == 1 else f"{n} workers remain"
            self.say(
                f"worker {worker.task.rank} on {worker.task.host} ({how}) left; {remain}, "
                f"fewer than MIN ({self.state.bounds[0]}): the job ends"
            )
            return False
        if self.state.finishing and not self.state.live and self.done_at is None:
            self.done_at = now
        if exit_code != 0 and not stopping:
            self._left.append(f"worker {worker.task.rank} on {worker.task.host} ({how})")
            self.bad = blacklist(
                self.bad, worker.task.host, now, self.cool_down, max(COOL_DOWN_CAP, self.cool_down)
            )
            if not self.state.regroup:  # kept running, or finishing: said now
                self._said(how="in process" if in_process else "the job is finishing")
        self._act(acts, now, hooks)
        return True

    def tick(self, now: float, hooks: Hooks) -> None:
        """Time passed: the grace period of a restart, the hosts read again, room to grow."""
        self.state, acts = tick(self.state, now)
        self._act(acts, now, hooks)
        self._poll()
        if self.elasticity != "resize" or self.state.finishing or self.state.regroup:
            return
        if self._room(now):
            self.state, acts = grow(self.state, self._every_live_in_process(), now, self.grace)
            self._act(acts, now, hooks)

    def scheduler_idle(self, now: float) -> bool:
        """Every worker has ended, the job finishing, ``SCHEDULER_WAIT`` seconds ago: the scheduler
        process (trainer_core's; a torch.distributed script never joins it, and a trainer_core
        one has ended it by now) is not needed any more, and the supervisor stops it."""
        return self.done_at is not None and now - self.done_at >= SCHEDULER_WAIT

    def _poll(self) -> None:
        for hosts, failed in self.source.take() if self.source is not None else []:
            if failed is not None:
                self.say(f"cannot read the job's hosts now (the last list stays): {failed}")
            elif hosts is not None and hosts != self.hosts:
                self.say("the job's hosts now: " + ", ".join(f"{h}:{h.slots or 1}" for h in hosts))
                self.hosts = hosts

    def _live_hosts(self, indices: frozenset[int]) -> dict[tuple[str, int | None], int]:
        return host_counts(self.workers[i].task.host for i in indices)

    def _room(self, now: float) -> bool:
        wanted = self.state.bounds[1] - len(self.state.live)
        return wanted > 0 and bool(
            new_workers(self.hosts, self._live_hosts(self.state.live), 1, self.bad, now)
        )

    def _act(self, acts: tuple[Act, ...], now: float, hooks: Hooks) -> None:
        for act in acts:
            if act is Act.STOP or act is Act.KILL:
                sig = signal.SIGTERM if act is Act.STOP else signal.SIGKILL
                for i in sorted(self.state.stopping):
                    hooks.signal_task(i, sig)
            elif act is Act.RESPAWN:
                self._respawn(now, hooks)

    def _respawn(self, now: float, hooks: Hooks) -> None:
        """Start the next epoch's workers: in restart mode the whole group again (the survivors'
        hosts, then new ones up to MAX), dense ranks; in process only the new ones."""
        regroup = self.state.regroup
        keep = sorted(self.state.carried, key=lambda i: self.workers[i].task.rank) if regroup else []
        stay = frozenset(keep) if regroup else self.state.live
        room = self.state.bounds[1] - len(stay)
        extra = (
            new_workers(self.hosts, self._live_hosts(stay), room, self.bad, now)
            if not self.state.finishing
            else []
        )
        extra = [h for h in extra if self._reached(h, now, hooks)]
        if not extra and not regroup:  # every new host failed to come up: no change after all
            self.state = dataclasses.replace(self.state, epoch=self.state.epoch - 1)
            return
        hosts = [self.workers[i].task.host for i in keep] + extra
        # in process, the new workers take their places beside the live ones (local ranks free on
        # their machine, the machines' order); a restarted group starts afresh
        others = [] if regroup else sorted(self.state.live, key=lambda i: self.workers[i].task.rank)
        around = [self.workers[i].task for i in others]
        world = len(around) + len(hosts)
        first_rank = len(around)
        restart = self.state.restarts + 1 if regroup else self.state.restarts
        machines = list(dict.fromkeys(machine_key(h) for h in [*(t.host for t in around), *hosts]))
        per_machine = host_counts([*(t.host for t in around), *hosts])
        used: dict[tuple[str, int | None], set[int]] = {}
        for t in around:
            used.setdefault(machine_key(t.host), set()).add(t.local_rank)
        template = next(iter(self.workers.values())).task
        started_now: set[int] = set()
        joined: list[str] = []
        for n, host in enumerate(hosts):
            key = machine_key(host)
            taken = used.setdefault(key, set())
            local = next(r for r in range(len(taken) + 1) if r not in taken)
            taken.add(local)
            member = Member(
                index=self.next_index,
                rank=first_rank + n,
                world=world,
                host=host,
                local_rank=local,
                local_size=per_machine[key],
                node_rank=machines.index(key),
                hosts=len(machines),
                restart=restart,
            )
            self.next_index += 1
            task = member_task(self.plan, template, member, self.node_host(host))
            index = hooks.start_task(task)
            self.workers[index] = _Worker(task, self.state.epoch)
            started_now.add(index)
            joined.append(f"worker {task.rank} on {host} (rank {member.rank} of {world})")
        self.state = respawned(self.state, frozenset(started_now))
        how = f"restart {restart} of the workers (every one started again)" if regroup else "in process"
        self._said(joined=joined, how=how)

    def _reached(self, host: Host, now: float, hooks: Hooks) -> bool:
        """The host is made ready before a worker starts there (the backend's ``add_host``: a host
        no worker used yet, or one whose connection was lost, is reached again; any other, nothing
        to do); one that cannot be is blacklisted."""
        key = machine_key(host)
        failed = hooks.reach_host(host)
        if failed is not None:
            what = "host" if key in self.reached else "new host"
            self.say(f"cannot use {what} {host} (blacklisted for now): {failed}")
            self.bad = blacklist(self.bad, host, now, self.cool_down, max(COOL_DOWN_CAP, self.cool_down))
            return False
        self.reached.add(key)
        return True

    def history(self, index: int, result: TaskResult | None) -> tuple[int | None, str | None]:
        """Worker ``index``'s fields of the job record: the epoch it joined, how it ended."""
        ended = None
        if result is not None:
            ended = f"signal {result.signal}" if result.signal else f"exit {result.exit_code}"
            if index in self.stopped:
                ended += f" (stopped for restart {self.stopped[index]} of the workers)"
        return self.workers[index].epoch, ended

    def _said(self, joined: Sequence[str] = (), how: str = "") -> None:
        change = Change(self.state.epoch, time.time(), tuple(self._left), tuple(joined), how)
        self._left = []
        self.changes.append(change)
        self.say(change.line())


def for_job(
    spec: LaunchSpec,
    backend: Backend,
    plan: Plan,
    root_uri: str,
    telemetry: Telemetry | None,
    say: Callable[[str], None],
) -> Elastic | None:
    """An elastic job's controller (None for a fixed job): its hosts and where they are read
    again, the workers' word on how they handle a change (the metrics endpoint's model), where
    a new worker's node publishes itself (as the plan's workers do)."""
    if spec.elastic is None:
        return None
    read = spec.hostfile or spec.host_discovery
    source = HostPoller(HostSource(spec.hostfile, spec.host_discovery)) if read else None
    published = backend.node_hosts(spec) or {}
    model = telemetry.model if telemetry is not None else None

    def in_process(rank: int) -> bool:
        """Worker ``rank`` said it handles a change itself (its metrics figure, docs/elastic.md)."""
        if model is None:
            return False
        with model.lock:
            series = model.nodes.get(("worker", rank))
            return series is not None and series.latest.get(dmlc_env.ELASTIC_IN_PROCESS_FIGURE) == 1

    def node_host(host: Host) -> str:
        return root_uri if backend.capabilities.here else published.get(host, host.name)

    return Elastic(
        plan=plan,
        elasticity=backend.capabilities.elastic,
        hosts=spec.hosts,
        source=source,
        in_process=in_process,
        say=say,  # (the supervisor's, once it has one: its log, the dashboard)
        grace=spec.grace_period,
        node_host=node_host,
        cool_down=spec.cool_down,
    )
