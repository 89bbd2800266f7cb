"""The views at scale, in process: a synthetic job of 1024 processes (1 scheduler, 63 servers,
960 workers) over 128 hosts with a full telemetry history (worker 917 behind, worker 500 failed), and what each view costs on it.

    python -m bench.scale_views [--procs 1024] [--hosts 128] [--repeat 20] [--json out.json]

Timed (median of ``--repeat``, ms): the supervisor's snapshot of its processes (rows, CPU and
memory by host and pid, the training figures), a dashboard frame for a 160x50 terminal (render
and print to a string), writing the live file, and reading it back as ``launchkit top`` and
``launchkit ps`` do; the live file's size in bytes. ``launchkit logs --role worker --rank 917``
is timed as a real command on a synthetic job record with kept output. Not run in CI.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class _Handle:
    pid: int | None
    node: str | None = None


@dataclass
class _Proc:
    task: Any
    handle: Any
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=10))
    result: Any = None


def synthetic_job(procs: int, hosts: int) -> tuple[Any, list[_Proc], Any]:
    """(plan, the supervisor's processes, the telemetry model) of a job in full training."""
    from launchkit import backends
    from launchkit.core.plan import make_plan
    from launchkit.core.spec import Host, LaunchSpec
    from launchkit.telemetry.model import HISTORY, JobMetrics

    servers = procs // 16 - 1
    spec = LaunchSpec(
        num_workers=procs - 1 - servers,
        num_servers=servers,
        command=("python3", "train.py"),
        backend="ssh",
        hosts=tuple(Host(f"node{h:03d}") for h in range(hosts)),
    )
    plan = make_plan(
        spec,
        caps=backends.capabilities(spec.backend),
        job_id="1127-000000-abcdef",
        secret="s",
        root_uri="10.0.0.1",
        root_port=9000,
    )
    model = JobMetrics()
    t0 = time.time() - HISTORY
    running = []
    for i, task in enumerate(plan.tasks):
        p = _Proc(task, _Handle(10000 + i))
        p.tail.extend(f"{task.role} {task.rank}: step {s} loss 0.{s}" for s in range(10))
        running.append(p)
    for t in range(HISTORY):
        for task in plan.tasks[1:]:
            behind = 3 if (task.role, task.rank) == ("worker", 917) else 0  # one straggler
            figures = {
                "step": 10.0 * t - behind * t,
                "loss": 2.0 / (1 + t),
                "samples_total": 320.0 * t,
                "compression_ratio": 16.0,
                "bytes_pushed": 1e6 * t,
                "bytes_pulled": 1e6 * t,
                "push_ms": 1.0,
                "pull_ms": 1.2,
                "heartbeat_age_s": 0.2,
                "registered": 1.0,
            }
            model.node_report(task.role, task.rank, t0 + t, figures)
        for h in range(hosts):
            model.host_report(
                f"node{h:03d}",
                t0 + t,
                {
                    "load1": 3.0,
                    "mem_used": 2**33,
                    "mem_total": 2**35,
                    "net_rx_bytes": 1e8 * t,
                    "net_tx_bytes": 9e7 * t,
                },
            )
    for p in running:
        model.procs[(f"{p.task.host}.cluster", p.handle.pid)] = (50.0, 2**29)  # the sampler says its own name
    return plan, running, model


def _fail_one(running: list[_Proc]) -> None:
    from launchkit.core.spec import TaskResult

    p = next(p for p in running if (p.task.role, p.task.rank) == ("worker", 500))
    p.result = TaskResult(p.task, 3, None, time.time())


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        a = time.perf_counter()
        fn()
        times.append(time.perf_counter() - a)
    return 1000 * statistics.median(times)


def views(procs: int, hosts: int, repeat: int) -> dict[str, Any]:
    from rich.console import Console

    from launchkit.console import Ui
    from launchkit.jobs import live
    from launchkit.view.render import fit, render
    from launchkit.watch import Publisher

    plan, running, model = synthetic_job(procs, hosts)
    _fail_one(running)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as home:
        os.environ["LAUNCHKIT_HOME"] = home
        pub = Publisher(plan, Ui(Console(file=io.StringIO())), None, model, deque(maxlen=12))
        state = pub.snapshot(running)
        out["snapshot (rows + training figures)"] = _median_ms(lambda: pub.snapshot(running), repeat)

        def frame() -> str:
            console = Console(
                file=io.StringIO(), width=160, height=50, force_terminal=True, color_system="truecolor"
            )
            console.print(render(state, *fit(state, 50, 160), width=160))
            return console.file.getvalue()  # type: ignore[attr-defined]

        out["dashboard frame, 160x50"] = _median_ms(frame, repeat)
        copy = model.copy(live.KEEP_POINTS)
        if "metrics" in inspect.signature(live.write).parameters:  # version 1: the model too
            out["live file write"] = _median_ms(lambda: live.write(state, copy), repeat)  # type: ignore[call-arg]
        else:
            out["live file write"] = _median_ms(lambda: live.write(state), repeat)
        out["live file read (top, ps)"] = _median_ms(lambda: live.read(plan.job_id), repeat)
        out["live file bytes"] = live.path(plan.job_id).stat().st_size
        text = frame()
        out["frame"] = text
        out.update(commands(plan, state, home))
    return out


def commands(plan: Any, state: Any, home: str) -> dict[str, float]:
    """The CLI's views as real commands (wall ms, median of 3): a record of the 1024-process job
    (its launcher is this process, so it shows as running), its live file, and 100 lines of kept
    output per process."""
    from launchkit.jobs import live
    from launchkit.jobs import records as jobs

    rec = jobs.started_here(
        id=plan.job_id,
        name=plan.job_name,
        backend="ssh",
        hosts=tuple(sorted({str(t.host) for t in plan.tasks})),
        command=("python3", "train.py"),
        cwd="/",
        processes=tuple(jobs.ProcessRecord(r.role, r.rank, r.host, r.pid) for r in state.rows),
    )
    jobs.save(rec)
    live.write(state)
    for t in plan.tasks:
        body = "".join(f"{t.role} {t.rank}: step {s} loss 0.{s}\n" for s in range(100))
        (live.job_dir(plan.job_id) / f"{t.role}-{t.rank}.stdout").write_text(body)
        (live.job_dir(plan.job_id) / f"{t.role}-{t.rank}.stderr").write_text("")
    from rich.console import Console

    from launchkit.cli.top import Source, frame
    from launchkit.console import Ui

    ui = Ui(Console(file=io.StringIO(), width=160, height=50, force_terminal=True))
    source = Source(ui, plan.job_id, rec)
    out = {
        "top's refresh on a 160x50 terminal (in process: record, live file, frame)": _median_ms(
            lambda: ui.out.print(frame(ui, source.state())), 10
        )
    }
    env = {**os.environ, "LAUNCHKIT_HOME": home, "COLUMNS": "160", "LINES": "50"}
    runs = {
        "launchkit ps": ["ps"],
        "launchkit top JOB --once (a pipe: every row)": ["top", plan.job_id, "--once", "--interval", "0.1"],
        "launchkit logs JOB --role worker --rank 917": [
            "logs",
            plan.job_id,
            "--role",
            "worker",
            "--rank",
            "917",
        ],
        "launchkit logs JOB (all, 102,400 lines)": ["logs", plan.job_id],
    }
    for name, argv in runs.items():
        times = []
        for _ in range(3):
            a = time.perf_counter()
            res = subprocess.run(
                [sys.executable, "-m", "launchkit", *argv],
                env=env,
                capture_output=True,
                text=True,
                cwd=ROOT,
                check=False,
            )
            times.append(time.perf_counter() - a)
            if res.returncode != 0:
                raise SystemExit(f"{name}: exit {res.returncode}: {res.stderr[-2000:]}")
        out[f"{name} (command, wall)"] = 1000 * statistics.median(times)
    times = []
    for _ in range(3):
        a = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "launchkit", "--help"], env=env, capture_output=True, check=False
        )
        times.append(time.perf_counter() - a)
    out["launchkit --help (the interpreter's and CLI's start, for scale)"] = 1000 * statistics.median(times)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=1024)
    p.add_argument("--hosts", type=int, default=128)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--show", action="store_true", help="print the frame too")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = views(args.procs, args.hosts, args.repeat)
    frame = result.pop("frame")
    if args.show:
        sys.stdout.write(frame)
    print(f"| {args.procs} processes, {args.hosts} hosts | ms (median of {args.repeat}) |")
    print("|---|---|")
    for k, v in result.items():
        print(f"| {k} | {v:,.1f} |" if "bytes" not in k else f"| {k} | {v:,} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
