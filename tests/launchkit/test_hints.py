"""The failure report's hint (``launchkit.hints``): a torch.distributed script launched with
servers (``-s`` defaults to ``-n``) failed naming a server, with torch's "environment variable
RANK expected, but not set" and nothing saying that ``-s 0`` was meant. Pure, and the report of
``launch`` in-process."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from launchkit.cli.launch import report
from launchkit.console import Ui
from launchkit.core.spec import LOCALHOST, JobResult, Task, TaskResult
from launchkit.hints import hint

TORCH = (
    '  File ".../torch/distributed/rendezvous.py", line 254, in _get_env_or_raise',
    "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
    "RANK expected, but not set",
)


@pytest.mark.parametrize(
    ("role", "lines", "said"),
    [
        ("server", TORCH, "the servers run the command too, and torch's variables (RANK,"),
        ("scheduler", TORCH, "the scheduler runs the command too"),
        ("server", ("KeyError: 'LOCAL_RANK'",), "(LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...)"),
        ("server", ("environment variable MASTER_ADDR expected, but not set",), "with -s 0"),
    ],
)
def test_a_torch_script_on_a_server_is_told_about_s_0(role: str, lines: tuple[str, ...], said: str) -> None:
    text = hint(role, lines)
    assert text is not None and said in text


@pytest.mark.parametrize(
    ("role", "lines"),
    [
        ("worker", TORCH),  # a worker that lacks them is another story
        ("server", ("KeyError: 'learning_rate'",)),
        ("server", ("MemoryError",)),
        ("server", ()),
    ],
)
def test_no_hint_where_nothing_is_known(role: str, lines: tuple[str, ...]) -> None:
    assert hint(role, lines) is None


def test_the_report_says_the_hint_below_the_last_lines() -> None:
    task = Task("server", 0, 1, LOCALHOST, 0, ("python", "ddp.py"))
    root = TaskResult(task, 1, None, 0.0, tail=TORCH)
    err = io.StringIO()
    report(Ui(err=Console(file=err, width=400)), JobResult("1201-000000-abcdef", 1, (root,), root_cause=root))
    text = err.getvalue()
    assert "failed: server 0 on localhost exited with code 1" in text
    assert text.index("RANK expected") < text.index("hint: the servers run the command too")
