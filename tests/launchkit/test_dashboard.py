"""The dashboard: the pure render, and the real thing in a terminal (tmux)."""

from __future__ import annotations

import dataclasses
import io
import itertools
import re
import shlex
import subprocess
import sys
import uuid

from rich.console import Console

from launchkit.dashboard import DashboardState, ProcRow, fit, render
from launchkit.telemetry.view import training
from launchkit.view.panel import sparkline
from launchkit.view.render import duration
from tests.launchkit import dashstates
from tests.launchkit.procs import PROG, pids_with_job, record, run, start, wait_for_job, wait_until


def text_of(state: DashboardState, width: int = 140) -> str:
    console = Console(record=True, width=width, no_color=True)
    console.print(render(state))
    return console.export_text()


def test_render_shows_every_process_and_the_log() -> None:
    state = DashboardState(
        job_id="1122-000000-abcdef",
        name="train",
        backend="local",
        elapsed=3725,
        rows=(
            ProcRow("scheduler", 0, "localhost", 10, "running", cpu_percent=1.0, rss_bytes=12 * 2**20),
            ProcRow("worker", 0, "localhost", 11, "failed", "exit 3", last_line="boom"),
            ProcRow("worker", 1, "localhost", 12, "ended", "signal 15"),
        ),
        log=(("worker 0", "epoch 1 loss 0.5"),),
        message="job failed",
    )
    text = text_of(state)
    assert "train 1122-000000-abcdef  local  1:02:05" in text
    assert "1 ended, 1 failed, 1 running" in text
    assert "12.0 MiB" in text and "1%" in text
    assert "failed (exit 3)" in text and "boom" in text
    assert "ended (signal 15)" in text
    assert "[worker 0] epoch 1 loss 0.5" in text
    assert "job failed" in text


def on_a_line(text: str, *words: str) -> bool:
    """Whether one line of ``text`` holds ``words`` in this order, whatever the spaces between."""
    for line in text.splitlines():
        at = 0
        for w in words:
            at = line.find(w, at)
            if at < 0:
                break
            at += len(w)
        else:
            return True
    return False


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([3, 3, 3]) == "▄▄▄"
    assert sparkline(range(100), width=5) == "▁▃▅▆█"
    assert sparkline([]) == ""


def test_render_a_healthy_job_shows_the_training_panel() -> None:
    text = text_of(dashstates.healthy())
    assert "train_digits 1122-000000-abcdef  local  0:01:05  4 running" in text
    assert on_a_line(text, "step", "300", "host", "load", "mem GiB", "in MB/s", "out MB/s")
    assert on_a_line(text, "loss", "0.06952 █")
    assert on_a_line(text, "accuracy", "0.99 ▁")
    assert on_a_line(text, "samples/s", "640 ▄▄▄▄")
    assert on_a_line(text, "compression", "16.0x")
    assert "slowest" not in text
    # one line per host: load, memory, MB/s in and out
    assert on_a_line(text, "localhost", "1.5", "3.0/8.0", "2.00", "1.00")
    # the sparklines fall (loss) and rise (accuracy)
    loss_line = next(line for line in text.splitlines() if "loss " in line)
    assert "█" in loss_line and loss_line.index("█") < loss_line.rindex("▁")
    assert "[worker 0] epoch 1 loss 0.51" in text
    assert "root cause" not in text


def test_render_names_a_lagging_worker() -> None:
    text = text_of(dashstates.healthy(slow_rank=1))
    assert on_a_line(text, "slowest", "worker 1", "step 150, median 225")


def test_render_a_failure_shows_the_root_cause_and_its_last_lines() -> None:
    text = text_of(dashstates.failed())
    assert "failed (exit 3)" in text
    assert "root cause: worker 1 on localhost (exit 3), its last lines" in text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "root cause" in line)
    assert "epoch 3" in lines[at + 1] and "Traceback" in lines[at + 2] and "data went bad" in lines[at + 3]
    assert "slowest" not in text  # ended workers do not lag


def test_render_the_attempt_of_a_restarted_job() -> None:
    state = DashboardState(**{**dashstates.healthy().__dict__, "attempt": 2, "attempts": 4})
    assert "0:01:05  attempt 2 of 4  4 running" in text_of(state)
    assert "attempt" not in text_of(dashstates.healthy())


def test_render_what_an_engine_job_waits_on() -> None:
    from launchkit.backends.slurm import SlurmBackend
    from launchkit.view import state as view_state

    backend = SlurmBackend()
    assert backend.status() == ""
    backend.say("slurm job 42: pending")  # as the batch run says it when squeue's state changes
    state = DashboardState(**{**dashstates.healthy().__dict__, "status": backend.status()})
    assert "4 running  slurm job 42: pending" in text_of(state)
    assert view_state.from_json(view_state.to_json(state)).status == "slurm job 42: pending"
    assert "pending" not in text_of(DashboardState(**{**state.__dict__, "finished": True}))


def test_render_waiting_for_nodes() -> None:
    m = dashstates.model(workers=1)
    state = dashstates.healthy()
    state = DashboardState(**{**state.__dict__, "training": training(m, 6)})
    assert "waiting for nodes to register: 2 of 6" in text_of(state)  # a server and a worker
    assert "waiting" not in text_of(DashboardState(**{**state.__dict__, "finished": True}))


def test_a_small_terminal_keeps_every_row_and_shortens_the_output() -> None:
    state = DashboardState(
        **{**dashstates.healthy().__dict__, "log": tuple(("worker 0", f"l{i}") for i in range(12))}
    )
    rows, lines = fit(state, 24, 80)
    assert (rows, lines) == (4, 6)
    console = Console(record=True, width=80, height=24, no_color=True)
    console.print(render(state, rows, lines, width=80))
    text = console.export_text()
    assert len(text.splitlines()) <= 24
    assert "worker    │    1" in text and "[worker 0] l11" in text and "l5" not in text


def test_a_narrow_terminal_cuts_no_figure_and_wraps_no_row() -> None:
    # 60 cells: the header kept its counts, the training figures their digits, each row one line
    for state, counts in ((dashstates.healthy(), "4 running"), (dashstates.failed(), "3 ended, 1 failed")):
        for width in (60, 80):
            text = Console(record=True, width=width, height=15, no_color=True, file=io.StringIO())
            text.print(render(state, *fit(state, 15, width), width=width))
            lines = text.export_text().splitlines()
            assert state.job_id[:4] in lines[0] or width == 60
            assert f"{duration(state.elapsed)}  {counts} ─" in lines[0], lines[0]
            body = "\n".join(lines)
            for figure in ("300", "0.06952", "0.99", "640", "16.0x", "3.0/8.0", "2.00"):
                assert figure in body, (figure, body)
            table = lines[next(i for i, x in enumerate(lines) if "━" in x) + 1 :]
            rows = list(itertools.takewhile(lambda x: "╭" not in x and "..." not in x, table))
            assert rows and all(any(r in x for r in ("scheduler", "server", "worker")) for x in rows), body


def test_a_40_column_terminal_cuts_no_host_figure_and_keeps_the_counts() -> None:
    """At 40x10 the hosts table cut every column ('… mem … in M…'), against docs/dashboard.md's
    'no figure is cut'; the header cut its counts ('3 ended, 1 fail…'). The hosts now stack."""
    many = dashstates.model(hosts=tuple(f"node{i:02d}" for i in range(10)))
    for state, counts in (
        (dashstates.healthy(), "4 running"),
        (dashstates.failed(), "3 ended, 1 failed"),
        (dataclasses.replace(dashstates.healthy(), training=training(many, 4)), "4 running"),
    ):
        for width in (36, 40, 48):
            console = Console(record=True, width=width, height=10, no_color=True, file=io.StringIO())
            console.print(render(state, *fit(state, 10, width), width=width))
            lines = console.export_text().splitlines()
            assert f"{duration(state.elapsed)}  {counts} ─" in lines[0], (width, lines[0])
            panel = lines[: next(i for i, x in enumerate(lines) if "┃" in x)]
            assert not any("…" in line for line in panel), (width, "\n".join(panel))
            body = " ".join(" ".join(panel).replace("│", " ").split())
            for figure in ("load 1.5", "mem 3.0/8.0 GiB", "in 2.00 MB/s", "out 1.00 MB/s"):
                assert figure in body, (width, figure, body)
            assert (state.training is not None and len(state.training.hosts) == 1) or "+3 more" in body


def test_render_64_processes_over_12_hosts_fits() -> None:
    hosts = tuple(f"node{i:02d}" for i in range(12))
    m = dashstates.model(workers=48, hosts=hosts)
    rows = tuple(
        ProcRow(role, rank, hosts[i % 12], 1000 + i, "failed" if i == 50 else "running", last_line="x" * 200)
        for i, (role, rank) in enumerate(
            [("scheduler", 0)] + [("server", r) for r in range(15)] + [("worker", r) for r in range(48)]
        )
    )
    state = DashboardState("1122-000000-abcdef", "big", "ssh", 10.0, rows, training=training(m, 64))
    console = Console(record=True, width=160, height=50, no_color=True)
    console.print(render(state, *fit(state, 50)))  # (its speed: bench/dashboard.py)
    frame = console.export_text().splitlines()
    assert len(frame) <= 50, len(frame)
    assert re.search(r"worker +│ +34 │ node02", frame[0] + "\n".join(frame))  # the failed row is kept
    shown, _ = fit(state, 50)
    assert 10 < shown < 64
    # the others one line per host (all 12 fit): their count, states and roles
    for h in range(12):
        assert any(f"node{h:02d}" in line and "procs" in line and "running" in line for line in frame), h
    assert "more processes" not in "\n".join(frame)


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=True).stdout


SOCKET = f"lk-test-{uuid.uuid4().hex[:8]}"
SIZED = "env -u COLUMNS -u LINES"  # the pane's own size (pytest's environment may carry 80x24)


def test_live_dashboard_in_a_terminal(tmp_path) -> None:
    script = tmp_path / "steps.py"
    script.write_text(
        "import os, time\n"
        "for i in range(30):\n"
        "    print(os.environ['DMLC_ROLE'], os.environ['LAUNCHKIT_ROLE_RANK'], 'step', i, flush=True)\n"
        "    time.sleep(0.1)\n"
        "if os.environ['DMLC_ROLE'] == 'worker' and os.environ['LAUNCHKIT_ROLE_RANK'] == '1':\n"
        "    time.sleep(1.0)\n"  # the job's last line, whatever the others' start-up skew
        "    print('worker 1 is done', flush=True)\n"
    )
    cmd = shlex.join(
        [
            sys.executable,
            "-m",
            "launchkit",
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--dashboard",
            sys.executable,
            str(script),
        ]
    )
    tmux("new-session", "-d", "-s", "dash", "-x", "140", "-y", "40", f"{SIZED} {cmd}; echo EXIT=$?; sleep 30")
    try:

        def rows_shown() -> bool:
            screen = tmux("capture-pane", "-p", "-t", "dash")
            return "running" in screen and "worker    │    1" in screen and "scheduler │    0" in screen

        assert wait_until(rows_shown, 10), tmux("capture-pane", "-p", "-t", "dash")
        # its output while it runs ("step" alone would match the job's name, steps)
        assert wait_until(lambda: "] worker 1 step" in tmux("capture-pane", "-p", "-t", "dash"), 10)
        assert wait_until(lambda: "EXIT=0" in tmux("capture-pane", "-p", "-t", "dash"), 15)
        final = tmux("capture-pane", "-p", "-t", "dash")
        assert "4 ok" in final
        assert "[worker 1] worker 1 is done" in final
        assert "all 4 processes succeeded" in final
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)


def test_dashboard_without_a_terminal_falls_back_to_plain_output() -> None:
    res = run(["launch", "-n", "1", "-s", "0", "--dashboard", sys.executable, PROG, "argv", "x"])
    assert res.returncode == 0
    assert "--dashboard needs a terminal" in res.stderr
    assert '[worker 0] ["x"]' in res.stdout


def test_top_once_shows_a_running_job(launchkit_home) -> None:
    proc = start(["launch", "-n", "2", "-s", "0", sys.executable, PROG, "wait"])
    try:
        job = wait_for_job(launchkit_home)
        assert wait_until(lambda: len(pids_with_job(job)) == 2, 10)  # the workers (-s 0: no scheduler)
        res = run(["top", job, "--once"])
        assert res.returncode == 0, res.stderr
        assert job in res.stdout and "2 running" in res.stdout
        pids = [p["pid"] for p in record(launchkit_home, job)["processes"]]
        assert all(str(pid) in res.stdout for pid in pids)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    # (the launcher has exited: its record says how the job ended)
    assert "job interrupted" in run(["top", job, "--once"]).stdout


def test_top_unknown_job() -> None:
    res = run(["top", "nope"])
    assert res.returncode == 2 and "no job 'nope'" in res.stderr
