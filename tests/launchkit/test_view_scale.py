"""The views of a job of 1024 processes over 128 hosts (issue 28): the frame fits the terminal,
shows the failure and the slowest worker first and the others one line per host; the live file
stays small. Timed in bench/scale_views.py."""

from __future__ import annotations

import io

from rich.console import Console

from launchkit.jobs import live
from launchkit.telemetry.view import HostFigures, Lagging, Training
from launchkit.view.render import fit, render
from launchkit.view.state import DashboardState, ProcRow

HOSTS = [f"node{h:03d}" for h in range(128)]


def big_state() -> DashboardState:
    names = [("scheduler", 0)] + [("server", r) for r in range(63)] + [("worker", r) for r in range(960)]
    failed = ("worker", 500)
    rows = tuple(
        ProcRow(
            role,
            rank,
            "localhost" if role == "scheduler" else HOSTS[i % 128],
            10000 + i,
            "failed" if (role, rank) == failed else "running",
            "exit 3" if (role, rank) == failed else "",
            50.0,
            2**29,
            f"{role} {rank}: step 2390 loss 0.008",
        )
        for i, (role, rank) in enumerate(names)
    )
    hosts = tuple(HostFigures(h, 3.0 + (h == "node077"), 2.0**33, 2.0**35, 100.0, 90.0) for h in HOSTS)
    training = Training(
        1023,
        1023,
        2390,
        0.008,
        (1.0, 0.5, 0.1),
        None,
        (),
        3e5,
        (3e5, 3e5),
        16.0,
        hosts,
        Lagging("worker", 917, "step 1673, median 2390"),
    )
    return DashboardState("1127-000000-abcdef", "big", "ssh", 100.0, rows, training=training)


def frame_lines(state: DashboardState, width: int = 160, height: int = 50) -> list[str]:
    console = Console(file=io.StringIO(), width=width, height=height, no_color=True)
    console.print(render(state, *fit(state, height, width), width=width))
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_a_frame_of_1024_processes_fits_and_shows_what_to_look_at_first() -> None:
    """Failed on the old code: the training panel listed all 128 hosts (a frame of 140 lines on a
    50-line terminal), and the process table showed 2 rows."""
    lines = frame_lines(big_state())
    text = "\n".join(lines)
    assert len(lines) <= 50, len(lines)
    table = [line for line in lines if "│" in line and "┃" not in line]
    rows = [line for line in table if "node" in line and ("running" in line or "failed" in line)]
    assert "worker" in rows[0] and "500" in rows[0] and "failed (exit 3)" in rows[0]  # the failure first
    assert "917" in rows[1] and "running" in rows[1]  # then the slowest worker
    host_lines = [line for line in rows if "procs" in line]
    assert len(host_lines) >= 20 and all("running" in line and "server" in line for line in host_lines)
    assert "more processes on" in text and "hosts: " in text  # the rest counted
    assert "node077" in text and "+121 more" in text  # the busiest hosts, the rest in one line


def test_a_narrow_short_terminal_still_fits() -> None:
    lines = frame_lines(big_state(), width=80, height=40)
    assert len(lines) <= 40 and all(len(line) <= 80 for line in lines)
    assert any("500" in line and "failed" in line for line in lines)


def test_the_live_file_of_1024_processes_stays_small(tmp_path, monkeypatch) -> None:
    """Failed on the old code (version 1 carried every node's last 36 reports: 9.5 MB here)."""
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path))
    state = big_state()
    size = live.write(state).stat().st_size
    assert size < 300 * 1024, size
    view, why = live.read(state.job_id)
    assert why == "" and view is not None and view.state.rows == state.rows
    assert view.state.training == state.training
