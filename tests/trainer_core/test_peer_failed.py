"""A node that ends because another failed says so (dmlc_env.ending) where a launcher reading its
output finds it: a worker whose NodeFailure ends it says it after the traceback, as its last line
(a launcher keeps a process's last lines; a line said only when the failure was learned can be
followed by a traceback longer than what it keeps)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dmlc_env.ending import peer_failed_line

REPO = Path(__file__).resolve().parents[2]
# 25 nested calls (distinct, so that Python does not fold the repeated frames): a long traceback
PROG = "\n".join(
    ["from trainer_core.errors import NodeFailure", "from trainer_core.kv.excepthook import install_excepthook",
     "install_excepthook()", "def f25():", "    raise {error}"]
    + [f"def f{i}():\n    f{i + 1}()" for i in range(25)]
    + ["f0()"]
)  # fmt: skip


def run(error: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROG.format(error=error)], capture_output=True, text=True, cwd=REPO, timeout=30
    )


def test_a_worker_ended_by_another_nodes_failure_says_so_last() -> None:
    res = run('NodeFailure("job aborted by the scheduler: worker 1 failed", node="worker 1")')
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) > 25 and lines[-1] == peer_failed_line("worker 1"), lines[-3:]


def test_its_own_failure_says_nothing_of_the_kind() -> None:
    res = run('ValueError("boom")')
    assert res.returncode == 1 and res.stderr.splitlines()[-1] == "ValueError: boom"
    assert "dmlc_env:" not in res.stderr
