"""Horovod's timeline in a real job: ``HOROVOD_TIMELINE`` at ``init`` (and ``start_timeline``)
makes rank 0 write every collective operation's phases as a Chrome trace; the other ranks write
nothing; the file is complete JSON once the job ends."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

from tests.trainer_core.markedjob import run_marked

SCRIPT = """
import sys
import torch
import trainer_core.torch as hvd
hvd.init()
for step in range(3):
    hvd.allreduce(torch.ones(1000) * hvd.rank(), name="grad.w")
h = hvd.allreduce_async(torch.ones(10), name="grad.b")
hvd.broadcast(torch.zeros(4), root_rank=0, name="weights")
hvd.synchronize(h)
hvd.allgather(torch.ones(2))
hvd.stop_timeline()
hvd.allreduce(torch.ones(3), name="after.stop")
hvd.shutdown()
"""


def test_rank_0_writes_each_operations_phases(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "timeline.json"
    argv = [sys.executable, str(script)]
    rc, out = run_marked(
        ["-n", "2", "-s", "0"], argv, "TORCH_TIMELINE_TEST", 120, env=[f"HOROVOD_TIMELINE:{trace}"]
    )
    assert rc == 0, out
    events = json.loads(trace.read_text())
    rows = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert {"grad.w", "grad.b", "weights"} <= set(rows) and "after.stop" not in rows, rows
    spans = [e for e in events if e["ph"] == "X"]
    on_w = [e["name"] for e in spans if e["pid"] == rows["grad.w"]]
    assert on_w == ["QUEUED", "NEGOTIATE_ALLREDUCE", "ALLREDUCE"] * 3, on_w
    assert [e["name"] for e in spans if e["pid"] == rows["weights"]][-1] == "BROADCAST"
    assert {e["args"]["rank"] for e in spans} == {0}
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0
