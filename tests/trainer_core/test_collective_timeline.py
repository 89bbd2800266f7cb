"""The timeline's file (trainer_core.collective.timeline), in process: Chrome's trace format, one
row per operation name, three spans per operation in order, and a file that loads even when the
writer never closed it."""

from __future__ import annotations

import json
from pathlib import Path

from trainer_core.collective.timeline import Phases, Timeline, set_path, writer_of


def test_each_operation_is_three_spans_on_the_row_of_its_name(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tl = Timeline(str(path), rank=0)
    t = tl._origin
    tl.operation("grad.0", "allreduce", 4, Phases(t + 0.001, t + 0.002, t + 0.0035, t + 0.006), 400, None)
    tl.operation("w", "broadcast", 5, Phases(t + 0.01, t + 0.01, t + 0.011, t + 0.02), 8, "LinkError: gone")
    tl.operation("grad.0", "allreduce", 6, Phases(t + 0.03, t + 0.03, t + 0.03, t + 0.031), 400, None)
    tl.close()
    events = json.loads(path.read_text())
    rows = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert rows == {"grad.0": 1, "w": 2}
    spans = [
        (e["pid"], e["name"], e["ts"], e["dur"], e["args"]["operation"]) for e in events if e["ph"] == "X"
    ]
    assert spans[:3] == [
        (1, "QUEUED", 1000, 1000, 4),
        (1, "NEGOTIATE_ALLREDUCE", 2000, 1500, 4),
        (1, "ALLREDUCE", 3500, 2500, 4),
    ]
    assert [s[1] for s in spans[3:6]] == ["QUEUED", "NEGOTIATE_BROADCAST", "BROADCAST"]
    failed = [e for e in events if e["ph"] == "X" and e["pid"] == 2]
    assert {e["args"]["error"] for e in failed} == {"LinkError: gone"}
    assert len(spans) == 9 and spans[6][0] == 1  # the second grad.0 on its row again


def test_a_file_cut_short_still_loads_and_close_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tl = Timeline(str(path), rank=1, mark_cycles=True)
    t = tl._origin
    tl.operation("x", "allgather", 0, Phases(t, t, t, t + 0.001), 0, None)
    text = path.read_text()  # flushed after each operation
    events = json.loads(text + "]")  # what a viewer does with a file whose writer died
    assert [e["name"] for e in events if e["ph"] in ("X", "i")] == [
        "QUEUED",
        "NEGOTIATE_ALLGATHER",
        "ALLGATHER",
        "CYCLE_START",
    ]
    tl.close()
    tl.close()
    tl.operation("late", "allreduce", 1, Phases(t, t, t, t), 0, None)  # after close: dropped
    assert "late" not in path.read_text()


def test_a_sets_operations_have_rows_of_their_own_naming_the_set(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tl = Timeline(str(path), rank=0)
    t = tl._origin
    tl.operation("grad", "allreduce", 0, Phases(t, t, t, t + 0.001), 8, None)
    tl.for_set(1, [0, 2]).operation("grad", "allreduce", 0, Phases(t, t, t, t + 0.002), 8, None)
    tl.for_set(2, (0, 1)).operation("grad", "allgather", 1, Phases(t, t, t, t + 0.003), 4, None)
    tl.close()
    events = json.loads(path.read_text())
    rows = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert rows == {"grad": 1, "grad (process set 1 [0, 2])": 2, "grad (process set 2 [0, 1])": 3}
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["pid"] for e in spans] == [1] * 3 + [2] * 3 + [3] * 3
    assert "process_set" not in spans[0]["args"]
    assert {e["args"]["process_set"] for e in spans[3:6]} == {"process set 1 [0, 2]"}
    assert spans[-1]["name"] == "ALLGATHER"


def test_who_writes_a_set_and_where() -> None:
    assert writer_of([0, 2]) == 0  # Horovod's coordinator, where it is a member
    assert writer_of([3, 1]) == 1  # else the set's first member
    assert set_path("/tmp/run/timeline.json", [2, 1]) == "/tmp/run/timeline.set-1-2.json"
    assert set_path("trace", [1]) == "trace.set-1"
