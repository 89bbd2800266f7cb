"""The launcher's telemetry model (launchkit.telemetry.model), in process."""

from __future__ import annotations

from launchkit.telemetry.model import HISTORY, JobMetrics


def test_a_copy_is_cut_to_its_last_reports_and_does_not_follow_later_ones() -> None:
    m = JobMetrics()
    for i in range(10):
        m.node_report("worker", 0, float(i), {"step": i})
        m.host_report("a", float(i), {"load1": i}, {7: (float(i), i)})
    c = m.copy(4)
    m.node_report("worker", 0, 10.0, {"step": 10})
    m.host_report("a", 10.0, {"load1": 10}, {7: (10.0, 10)})
    assert [f["step"] for _, f in c.nodes["worker", 0].points] == [6, 7, 8, 9]
    assert [t for t, _ in c.hosts["a"].points] == [6.0, 7.0, 8.0, 9.0]
    assert c.procs == {("a", 7): (9.0, 9)}
    assert c.hosts["a"].points.maxlen == HISTORY and len(m.copy().nodes["worker", 0].points) == 11
