"""The dashboard in a real terminal (tmux): the digits example trains under ``launch
--dashboard``; the training panel shows loss, accuracy and samples/s, and they change;
``launchkit top JOB_ID`` in a second window shows the same panel; the screen ends cleanly."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.launchkit.procs import wait_until

ROOT = Path(__file__).resolve().parents[2]
SOCKET = f"lk-dash-{uuid.uuid4().hex[:8]}"
PROMPT = "READY$ "
JOB_ID = re.compile(r"\d{4}-\d{6}-[0-9a-f]{6}")
EXITED = re.compile(r"^EXIT=\d+$", re.M)
# the launcher's end, then the shell's prompt
PROMPT_BACK = re.compile(r"^EXIT=0\n" + re.escape(PROMPT.rstrip()), re.M)
FIGURE = re.compile(r"│ (step|loss|accuracy|samples/s)\s+([-\d.,e+]+) ")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=True).stdout


def screen(target: str) -> str:
    return tmux("capture-pane", "-p", "-t", target)


def figures(text: str) -> dict[str, str]:
    """The training panel's figures on a screen: {"step": "1,234", "loss": ...}."""
    return {m[1]: m[2] for m in FIGURE.finditer(text)}


def panel(text: str) -> list[str]:
    """The lines of the training panel (its box), as shown."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "─ training ─" in line)
    end = next(i for i in range(start + 1, len(lines)) if "╰" in lines[i])
    return lines[start : end + 1]


def test_digits_with_the_dashboard_and_top_from_a_second_window() -> None:
    launch = shlex.join(
        [
            sys.executable,
            "-m",
            "launchkit",
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--launcher",
            "local",
            "--dashboard",
            sys.executable,
            str(ROOT / "examples" / "train_digits.py"),
            "--epochs",
            "150",
        ]
    )
    # a shell with a known prompt, in a pane of fixed size (pytest's environment may carry 80x24)
    shell = "env -u COLUMNS -u LINES PS1='READY$ ' sh"
    tmux("new-session", "-d", "-s", "dash", "-x", "150", "-y", "50", shell)
    try:
        tmux("send-keys", "-t", "dash:0", f"{launch}; echo EXIT=$?", "Enter")
        seen: list[dict[str, str]] = []

        def training_shown() -> bool:
            text = screen("dash:0")
            f = figures(text)
            if f.get("step", "-") != "-" and not EXITED.search(text):
                seen.append(f)
            return len({s["step"] for s in seen}) >= 2

        def ended() -> bool:
            training_shown()  # frames go on being collected until the job ends
            return PROMPT_BACK.search(screen("dash:0")) is not None

        assert wait_until(training_shown, 60, interval=0.3), screen("dash:0")
        first = screen("dash:0")
        job = JOB_ID.search(first)
        assert job is not None, first
        tmux(
            "new-window",
            "-t",
            "dash",
            "-n",
            "top",
            f"env -u COLUMNS -u LINES {shlex.join([sys.executable, '-m', 'launchkit', 'top', job[0], '--interval', '0.5'])}; echo TOP=$?; sleep 60",
        )
        # the four figures on one capture (a capture can catch a frame half drawn)
        assert wait_until(
            lambda: {"step", "loss", "accuracy", "samples/s"} <= figures(screen("dash:top")).keys(), 15
        ), screen("dash:top")
        assert wait_until(ended, 90, interval=0.3), screen("dash:0")
        assert wait_until(lambda: "TOP=0" in screen("dash:top"), 10), screen("dash:top")
        final, top_final = screen("dash:0"), screen("dash:top")
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
    # the figures changed while the job ran: loss, accuracy and samples/s, each a number
    steps = [int(s["step"].replace(",", "")) for s in seen]
    assert steps == sorted(steps) and len(set(steps)) >= 2
    losses = {float(s["loss"]) for s in seen}
    rates = {float(s["samples/s"].replace(",", "")) for s in seen if s["samples/s"] != "-"}
    accuracies = {float(s["accuracy"]) for s in seen if s["accuracy"] != "-"}
    assert len(losses) >= 2 and min(losses) > 0, seen
    # (a steady rate can show the same rounded figure in every frame captured: a number is enough)
    assert rates and min(rates) > 0, seen
    assert accuracies and max(accuracies) <= 1.0, seen
    assert 0.5 < float(figures(final)["accuracy"]) <= 1.0  # the example's test accuracy at the end
    # top shows the same final panel as the launching terminal (the same live state)
    assert panel(top_final) == panel(final)
    assert "job succeeded" in top_final
    # the screen ends cleanly: one final frame, the launcher's last word, the prompt back
    assert final.count("╭─ launchkit train_digits") == 1 and "4 ok" in final
    tail = [line for line in final.splitlines() if line.strip()]
    assert "all 4 processes succeeded" in tail[-3] and tail[-2] == "EXIT=0" and tail[-1] == PROMPT.rstrip()
    assert "\x1b" not in final and "^[" not in final
