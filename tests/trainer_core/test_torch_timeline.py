"""Horovod's timeline in real jobs: ``HOROVOD_TIMELINE`` at ``init`` (and ``start_timeline``)
makes rank 0 write every collective operation's phases as a Chrome trace; the other ranks write
nothing but the process sets without rank 0 (their first member, a file of its own); the files are
complete JSON once the job ends."""

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


SETS_SCRIPT = """
import torch
import trainer_core.torch as hvd
first, second = hvd.ProcessSet([0, 1]), hvd.ProcessSet([1, 2])
hvd.init(process_sets=[first, second])
hvd.allreduce(torch.ones(100), name="grad")
if first.included():
    hvd.allreduce(torch.ones(100), name="grad", process_set=first)
if second.included():
    h = hvd.allreduce_async(torch.ones(100), name="grad", process_set=second)
    hvd.allgather(torch.ones(1), name="rows", process_set=second)
    hvd.synchronize(h)
hvd.barrier()
hvd.shutdown()
"""


def test_process_sets_operations_are_recorded_by_rank_0_or_the_sets_first_member(tmp_path: Path) -> None:
    """3 workers, sets [0, 1] and [1, 2]: rank 0's file has the global set's operations and those of
    [0, 1] (a row per name and set); [1, 2] is in rank 1's file beside it."""
    script = tmp_path / "job.py"
    script.write_text(SETS_SCRIPT)
    trace = tmp_path / "timeline.json"
    rc, out = run_marked(
        ["-n", "3", "-s", "0"],
        [sys.executable, str(script)],
        "TORCH_TIMELINE_SETS_TEST",
        120,
        env=[f"HOROVOD_TIMELINE:{trace}"],
    )
    assert rc == 0, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py", "timeline.json", "timeline.set-1-2.json"]

    def read(name: str) -> tuple[dict[str, int], list[dict[str, object]]]:
        events = json.loads((tmp_path / name).read_text())
        rows = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
        return rows, [e for e in events if e["ph"] == "X"]

    rows, spans = read("timeline.json")
    assert {"grad", "grad (process set 1 [0, 1])"} <= set(rows), rows
    assert not [r for r in rows if "process set 2" in r], rows
    on_set = [e["name"] for e in spans if e["pid"] == rows["grad (process set 1 [0, 1])"]]
    assert on_set == ["QUEUED", "NEGOTIATE_ALLREDUCE", "ALLREDUCE"], on_set
    assert {e["args"]["rank"] for e in spans} == {0}  # type: ignore[index]
    rows, spans = read("timeline.set-1-2.json")
    assert set(rows) == {"grad (process set 2 [1, 2])", "rows (process set 2 [1, 2])"}, rows
    assert [e["name"] for e in spans if e["pid"] == rows["rows (process set 2 [1, 2])"]][-1] == "ALLGATHER"
    assert {e["args"]["rank"] for e in spans} == {1}  # type: ignore[index]
