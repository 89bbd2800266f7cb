"""What the supervisor shows of its processes (launchkit.view.snapshot): rows with the hosts'
samples, the root cause with its last lines, the registering nodes."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from launchkit.console import Ui
from launchkit.core.spec import Host, Plan, Task, TaskResult
from launchkit.jobs import live
from launchkit.telemetry.model import JobMetrics
from launchkit.view.snapshot import usage_of
from launchkit.watch import Publisher
from tests.launchkit.dashstates import T0


@dataclass
class Handle:
    pid: int
    node: str | None = None


@dataclass
class Run:
    task: Task
    handle: Any
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    result: TaskResult | None = None


def task(role: str, rank: int, host: str) -> Task:
    return Task(role, rank, rank, Host(host), 0, ("python", "train.py"))


def test_rows_take_the_hosts_samples_and_the_root_cause_its_last_lines() -> None:
    runs = [
        Run(task("scheduler", 0, "a"), Handle(10)),
        Run(task("server", 0, "b"), Handle(20)),
        Run(task("worker", 0, "b"), Handle(21)),
        Run(task("worker", 1, "c"), Handle(30)),
    ]
    plan = Plan("1123-000000-abcdef", "train", "ssh", "a", 9000, tuple(r.task for r in runs))
    m = JobMetrics()
    m.host_report("b", T0, {"load1": 2.0}, {20: (12.0, 2**20), 21: (99.0, 2**30)})
    m.host_report("c", T0, {"load1": 1.0}, {30: (55.0, 3 * 2**20)})
    m.node_report("worker", 0, T0, {"step": 5})
    runs[3].tail.extend(f"line {i}" for i in range(15))
    runs[3].result = TaskResult(runs[3].task, 3, None, T0)
    runs[2].result = TaskResult(runs[2].task, 143, 15, T0, killed_by_launcher=True)
    pub = Publisher(plan, Ui(), None, m, deque([("worker 1", "line 14")]))
    state = pub.snapshot(runs, root=runs[3])
    rows = {(r.role, r.rank): r for r in state.rows}
    assert (rows["server", 0].cpu_percent, rows["server", 0].rss_bytes) == (12.0, 2**20)
    assert rows["worker", 0].state == "ended" and rows["worker", 0].cpu_percent is None  # not a stale sample
    assert rows["worker", 1].state == "failed" and rows["worker", 1].detail == "exit 3"
    assert rows["scheduler", 0].cpu_percent is None  # host a sent no sample
    assert state.root_cause is not None
    assert (state.root_cause.role, state.root_cause.rank, state.root_cause.host) == ("worker", 1, "c")
    assert state.root_cause.lines == tuple(f"line {i}" for i in range(5, 15))
    assert state.training is not None and (state.training.nodes_reported, state.training.nodes_expected) == (
        1,
        3,
    )
    assert state.log == (("worker 1", "line 14"),)


def test_usage_by_host_and_pid_or_by_a_pid_only_one_host_has() -> None:
    procs = {("node1", 5): (1.0, 1), ("node2", 5): (2.0, 2), ("localhost.example", 7): (3.0, 3)}
    assert usage_of(procs, "node2", 5) == (2.0, 2)
    assert usage_of(procs, "node3", 5) is None  # two hosts have a pid 5: which one is not known
    assert usage_of(procs, "localhost", 7) == (3.0, 3)  # the launcher's host under another name
    assert usage_of(procs, "node1", 8) is None


class Shown:
    """A dashboard that keeps its last frame; a host's sampler reports while the frame is drawn."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics
        self.frames: list[Any] = []

    def due(self) -> bool:
        return True

    def update(self, state: Any) -> None:
        self.frames.append(state)

    def stop(self, state: Any = None) -> None:
        self.frames.append(state)
        self.metrics.host_report("b", T0 + 99, {"load1": 7.0, "mem_used": 3 * 2**30, "mem_total": 2**34})


def test_the_final_frame_and_the_live_file_show_one_state(tmp_path, monkeypatch) -> None:
    """``launchkit top`` ends on the launching terminal's last frame, host figures included, even
    when a host's sampler reports between the frame and the live file (CI saw 0.7 against 0.8 GiB)."""
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path))
    runs = [Run(task("server", 0, "b"), Handle(20)), Run(task("worker", 0, "b"), Handle(21))]
    plan = Plan("1126-000000-abcdef", "train", "local", "b", 9000, tuple(r.task for r in runs))
    m = JobMetrics()
    for i in range(60):  # more reports than the live file keeps
        m.host_report("b", T0 + i, {"load1": 1.0, "mem_used": 2**30 + i, "mem_total": 2**34})
        m.node_report("worker", 0, T0 + i, {"step": i, "loss": 1.0 / (i + 1), "samples_total": 32 * i})
    shown = Shown(m)
    pub = Publisher(plan, Ui(), shown, m, deque(), here=True)  # type: ignore[arg-type]
    pub.publish(runs, final=True)
    view, why = live.read(plan.job_id)
    assert view is not None and why == ""
    frame = shown.frames[-1]
    assert frame.training.hosts[0].load1 == 1.0 and view.state.training == frame.training
