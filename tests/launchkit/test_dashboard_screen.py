"""The launch's screen in real terminals (tmux): a terminal that cannot draw the dashboard
(``TERM=dumb``) gets the plain merged output as the job runs; Ctrl-C under the dashboard shows the
launcher's ``received SIGINT`` line above one clean final frame; a 60x15 terminal keeps the
header's figures and one line per process."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launchkit.procs import until_exists_sh, wait_until

SOCKET = f"lk-screen-{uuid.uuid4().hex[:8]}"
PROMPT = "READY$ "
EXITED = re.compile(r"^EXIT=(\d+)$", re.M)

pytestmark = pytest.mark.timeout(90)


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=True).stdout


def screen(history: bool = False) -> str:
    """The pane as shown (with its scrolled-off lines when ``history``)."""
    return tmux("capture-pane", "-p", "-t", "lk", *(("-S", "-200") if history else ()))


@pytest.fixture
def terminal(launchkit_home: Path) -> Iterator[None]:
    # a tmux server of its own for each test: a new session on a socket whose server was just
    # killed fails now and then ("server exited unexpectedly", exit 1)
    global SOCKET
    SOCKET = f"lk-screen-{uuid.uuid4().hex[:8]}"
    yield
    subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)


def shell(width: int, height: int, env: str = "") -> None:
    """A shell with a known prompt, in a pane of a fixed size (pytest's environment may carry
    COLUMNS and LINES)."""
    tmux(
        "new-session",
        "-d",
        "-s",
        "lk",
        "-x",
        str(width),
        "-y",
        str(height),
        f"env -u COLUMNS -u LINES {env} PS1='{PROMPT}' sh",
    )


def launch(*args: str, script: str) -> None:
    cmd = shlex.join(
        [sys.executable, "-m", "launchkit", "launch", "--launcher", "local", *args, "--", "sh", "-c", script]
    )
    tmux("send-keys", "-t", "lk", f"{cmd}; echo EXIT=$?", "Enter")


def exit_code() -> int | None:
    m = EXITED.search(screen(history=True))
    return int(m[1]) if m else None


def test_a_terminal_that_cannot_draw_gets_the_plain_output_as_the_job_runs(terminal, tmp_path: Path) -> None:
    go = tmp_path / "go"
    shell(100, 30, "TERM=dumb")
    launch("-n", "1", "-s", "0", script=f"echo tick 1; {until_exists_sh(go)}; echo tick 2")
    # the job's line while it runs (it waits for go), not one frame at its end
    assert wait_until(lambda: "[worker 0] tick 1" in screen(), 20), screen()
    assert exit_code() is None
    go.touch()
    assert wait_until(lambda: exit_code() is not None, 20), screen()
    text = screen(history=True)
    assert exit_code() == 0 and "[worker 0] tick 2" in text and "all 1 processes succeeded" in text
    assert "╭" not in text and "│" not in text  # no dashboard frame


def test_dashboard_asked_for_where_it_cannot_be_drawn_says_why(terminal) -> None:
    """Was '--dashboard needs a terminal' in a terminal (one that cannot draw it)."""
    shell(220, 30, "TERM=dumb")  # the warning on one line
    launch("-n", "1", "-s", "0", "--dashboard", script="echo tick")
    assert wait_until(lambda: exit_code() is not None, 20), screen()
    text = " ".join(screen(history=True).split())
    assert exit_code() == 0 and "[worker 0] tick" in text
    assert (
        "launchkit: warning: --dashboard cannot be drawn on this terminal (TERM=dumb: it cannot move its "
        "cursor); showing the plain merged output instead"
    ) in text, text
    assert "needs a terminal" not in text


def test_ctrl_c_shows_the_signal_line_above_one_clean_final_frame(terminal) -> None:
    shell(100, 30)
    launch(
        "-n", "2", "-s", "1", "--dashboard", script="for i in $(seq 600); do echo tick $i; sleep 0.1; done"
    )
    assert wait_until(lambda: "4 running" in screen() and "] tick 5" in screen(), 30), screen()
    tmux("send-keys", "-t", "lk", "C-c")
    assert wait_until(lambda: exit_code() is not None, 30), screen()
    lines = screen(history=True).splitlines()
    assert exit_code() == 130
    assert any(line == "launchkit: warning: received SIGINT: ending the job" for line in lines), lines
    top = [i for i, line in enumerate(lines) if line.startswith("╭─ launchkit")]
    assert len(top) == 1, lines  # one frame: the final one
    before = lines[: top[0]]
    assert not any("│" in line or "╭" in line or "╰" in line for line in before), before  # nothing stale
    assert "4 ended" in lines[top[0]]


def test_a_60x15_terminal_keeps_the_headers_figures_and_one_line_per_process(terminal) -> None:
    shell(60, 15)
    launch(
        "-n", "2", "-s", "1", "--dashboard", script="for i in $(seq 600); do echo tick $i; sleep 0.1; done"
    )

    def framed() -> bool:
        text = screen()
        return "running" in text and "] tick" in text

    assert wait_until(framed, 30), screen()
    shown = screen().splitlines()
    head = next(line for line in shown if line.startswith("╭─ launchkit"))
    assert re.search(r"\d:\d\d:\d\d  4 running ─", head), head  # the elapsed time and the counts
    rule = next(i for i, line in enumerate(shown) if "━━" in line)
    rows = shown[rule + 1 : rule + 3]  # two rows fit, the others summed up below them
    assert [r.split("│")[1].strip() for r in rows] == ["scheduler", "server"], shown  # not wrapped
    assert all("running" in r for r in rows) and "... and 2 more processes: 2 running" in shown[rule + 3]
    assert len(shown) == 15 and shown[-1].startswith("╰"), shown  # the whole frame, on 15 lines
    tmux("send-keys", "-t", "lk", "C-c")
    assert wait_until(lambda: exit_code() is not None, 30), screen()
