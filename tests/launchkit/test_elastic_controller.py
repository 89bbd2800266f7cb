"""launchkit.elastic.Elastic in one process, with fake supervisor hooks (no process starts): the
group a restart builds, growth after the cool-down, a new host that cannot be reached, a
backend that only shrinks, the hosts read again, and the supervisor's announcement of a change."""

from __future__ import annotations

import os
import signal
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import dmlc_env
from launchkit.core.capabilities import Capabilities, Elasticity
from launchkit.core.elastic import start_size
from launchkit.core.plan import make_plan
from launchkit.core.spec import LOCALHOST, Host, LaunchSpec, Task
from launchkit.elastic import Elastic
from launchkit.hostdiscovery import HostPoller, HostSource
from tests.launchkit.procs import wait_until


@dataclass
class FakeHooks:
    next_index: int
    started: list[Task] = field(default_factory=list)
    signals: list[tuple[int, int]] = field(default_factory=list)
    unreachable: set[str] = field(default_factory=set)

    def start_task(self, task: Task) -> int:
        self.started.append(task)
        self.next_index += 1
        return self.next_index - 1

    def signal_task(self, index: int, sig: int) -> None:
        self.signals.append((index, sig))

    def reach_host(self, host: Host) -> str | None:
        return "connection refused" if host.name in self.unreachable else None


def controller(
    hosts: tuple[Host, ...] = (LOCALHOST,),
    bounds: tuple[int, int] = (2, 3),
    elasticity: Elasticity = "resize",
    in_process: bool = False,
    source: HostPoller | None = None,
) -> tuple[Elastic, FakeHooks, list[str]]:
    n = start_size(bounds, hosts, elasticity, "test")
    spec = LaunchSpec(num_workers=n, num_servers=0, command=("x",), hosts=hosts, elastic=bounds)
    plan = make_plan(
        spec, caps=Capabilities(elastic=elasticity), job_id="j", secret="s", root_uri="r", root_port=1
    )
    said: list[str] = []
    e = Elastic(
        plan=plan,
        elasticity=elasticity,
        hosts=hosts,
        source=source,
        in_process=lambda rank: in_process,
        say=said.append,
        grace=2.0,
        node_host=lambda h: h.name,
        cool_down=10.0,
    )
    e.begin([(i, t) for i, t in enumerate(plan.tasks) if t.role == "worker"])
    return e, FakeHooks(len(plan.tasks)), said


def test_restart_mode_builds_the_group_again_with_dense_ranks() -> None:
    e, hooks, said = controller()  # tasks: scheduler 0, workers 1..3 (indices 0..2)
    assert e.ended(2, 137, 9, now=100.0, hooks=hooks)
    assert hooks.signals == [(1, signal.SIGTERM), (3, signal.SIGTERM)] and not hooks.started
    e.tick(102.5, hooks)  # the grace period over: SIGKILL to those still running
    assert hooks.signals[-2:] == [(1, signal.SIGKILL), (3, signal.SIGKILL)]
    assert e.ended(1, 143, 15, now=102.6, hooks=hooks) and not hooks.started
    assert e.ended(3, 137, 9, now=102.7, hooks=hooks)
    envs = [t.env for t in hooks.started]  # localhost in its cool-down: the two survivors' places only
    assert [
        (t.rank, env[dmlc_env.RANK], env[dmlc_env.WORLD_SIZE])
        for t, env in zip(hooks.started, envs, strict=True)
    ] == [
        (3, "0", "2"),
        (4, "1", "2"),
    ]
    assert {env[dmlc_env.TORCHELASTIC_RESTART_COUNT] for env in envs} == {"1"}
    joined = "joined: worker 3 on localhost (rank 0 of 2), worker 4 on localhost (rank 1 of 2)"
    assert said == [
        f"epoch 1; left: worker 1 on localhost (signal 9); {joined}; restart 1 of the workers (every one started again)"
    ]
    assert e.history(1, None) == (0, None) and e.stopped == {1: 1, 3: 1}


def test_in_process_the_survivors_stay_and_the_host_returns_after_its_cool_down() -> None:
    e, hooks, said = controller(in_process=True)
    assert e.ended(3, 3, None, now=100.0, hooks=hooks)
    assert not hooks.signals and said == ["epoch 1; left: worker 2 on localhost (exit 3); in process"]
    e.tick(105.0, hooks)
    assert not hooks.started  # localhost cools down until 110
    e.tick(110.0, hooks)
    [late] = hooks.started
    assert late.rank == 3 and late.env[dmlc_env.DMLC_NUM_WORKER] == "3" and late.env[dmlc_env.RANK] == "2"
    assert said[-1] == "epoch 2; joined: worker 3 on localhost (rank 2 of 3); in process"


def test_a_new_host_that_cannot_be_reached_is_said_and_blacklisted() -> None:
    a, b = Host("a", slots=2), Host("b", slots=1)
    e, hooks, said = controller(hosts=(a,), bounds=(1, 3), in_process=True)  # 2 workers on a
    e.hosts = (a, b)
    hooks.unreachable = {"b"}
    e.tick(1.0, hooks)
    assert not hooks.started and "cannot use new host b (blacklisted for now): connection refused" in said
    e.tick(2.0, hooks)
    assert not hooks.started  # in its cool-down
    hooks.unreachable = set()
    e.tick(11.5, hooks)
    assert [t.host for t in hooks.started] == [b]


def test_a_host_used_before_is_reached_again_for_a_new_worker_and_blacklisted_if_it_cannot_be() -> None:
    """A worker's host is asked again (ssh: its connection may have been lost, a cut link) before
    a new worker starts there, after its cool-down."""
    e, hooks, said = controller(in_process=True)
    assert e.ended(3, 255, None, now=100.0, hooks=hooks)
    hooks.unreachable = {"localhost"}  # (still cut off)
    e.tick(110.0, hooks)
    assert not hooks.started and said[-1] == (
        "cannot use host localhost (blacklisted for now): connection refused"
    )
    hooks.unreachable = set()
    e.tick(125.0, hooks)
    assert not hooks.started  # a second cool-down, twice as long: until 130
    e.tick(130.0, hooks)
    assert [t.host for t in hooks.started] == [LOCALHOST]


def test_a_backend_that_only_shrinks_ends_the_job_rather_than_restart() -> None:
    e, hooks, said = controller(elasticity="shrink")
    assert not e.ended(2, 1, None, now=0.0, hooks=hooks)
    assert "which this backend cannot do" in said[-1]
    e, hooks, said = controller(elasticity="shrink", in_process=True)
    assert e.ended(2, 1, None, now=0.0, hooks=hooks)
    e.tick(100.0, hooks)
    assert not hooks.started  # never grows


def test_below_min_is_the_jobs_end_and_says_why() -> None:
    e, hooks, said = controller(bounds=(3, 3), in_process=True)
    assert not e.ended(1, 255, None, now=0.0, hooks=hooks)
    assert said == [
        "worker 0 on localhost (exit 255) left; 2 workers remain, fewer than MIN (3): the job ends"
    ]


def test_the_hostfile_read_again_is_said_and_a_broken_one_keeps_the_last_list(tmp_path: Path) -> None:
    hf = tmp_path / "hosts"
    hf.write_text("a slots=1\n")
    poller = HostPoller(HostSource(str(hf), None), every=0.02)  # (its thread: started by begin)
    e, hooks, said = controller(hosts=(Host("a", slots=1),), bounds=(1, 2), source=poller)
    try:
        hf.write_text("a slots=1\nb slots=1\n")
        os.utime(hf, (1, 1))
        assert wait_until(lambda: e.tick(5.0, hooks) or "the job's hosts now: a:1, b:1" in said, 10)
        hf.write_text("a slots=zero\n")
        os.utime(hf, (2, 2))
        assert wait_until(lambda: e.tick(7.0, hooks) or "cannot read the job's hosts now" in said[-1], 10)
        assert "(the last list stays)" in said[-1] and [h.name for h in e.hosts] == ["a", "b"]
    finally:
        e.close()


def test_the_supervisor_puts_each_change_in_the_jobs_log() -> None:
    from launchkit.backends.local import LocalBackend
    from launchkit.console import Ui
    from launchkit.supervisor import Supervisor

    e, _, _ = controller()
    sup = Supervisor(e.plan, LocalBackend(), Ui(), elastic=e)
    e.say("epoch 1; left: worker 1 on localhost (exit 3); in process")
    assert ("launchkit", "epoch 1; left: worker 1 on localhost (exit 3); in process") in deque(
        sup.publisher.log
    )


def test_a_new_worker_in_process_takes_the_free_local_rank_beside_the_live_ones() -> None:
    a, b = Host("a", slots=2), Host("b", slots=1)
    e, hooks, _ = controller(hosts=(a, b), bounds=(1, 3), in_process=True)  # a: local 0, 1; b: 0
    assert e.ended(1, 1, None, now=0.0, hooks=hooks)  # a's local rank 0 leaves
    e.tick(10.0, hooks)
    [late] = hooks.started
    assert late.host == a and late.local_rank == 0
    env = late.env
    assert env[dmlc_env.LOCAL_RANK] == "0" and env[dmlc_env.LOCAL_WORLD_SIZE] == "2"
    assert env[dmlc_env.GROUP_RANK] == "0" and env[dmlc_env.GROUP_WORLD_SIZE] == "2"
    assert env[dmlc_env.RANK] == "2" and env[dmlc_env.WORLD_SIZE] == "3"


def test_the_mode_asks_only_the_survivors() -> None:
    """A worker that dies before it reported the figure does not make the others restart."""
    spec = LaunchSpec(num_workers=3, num_servers=0, command=("x",), elastic=(2, 3))
    plan = make_plan(
        spec, caps=Capabilities(elastic="resize"), job_id="j", secret="s", root_uri="r", root_port=1
    )
    hooks = FakeHooks(len(plan.tasks))
    e = Elastic(
        plan, "resize", (LOCALHOST,), None, lambda rank: rank != 1, lambda _: None, 2.0, lambda h: h.name
    )
    e.begin([(i, t) for i, t in enumerate(plan.tasks) if t.role == "worker"])
    assert e.ended(2, 1, None, now=0.0, hooks=hooks)  # worker 1, which never reported
    assert not hooks.signals
