"""A job's live file (launchkit.jobs.live): what the supervisor writes, what top and ps read."""

from __future__ import annotations

import dataclasses
import json

from launchkit.jobs import live
from launchkit.telemetry.view import training
from tests.launchkit import dashstates


def test_round_trip_gives_the_same_view() -> None:
    state = dashstates.healthy(slow_rank=1)
    model = dashstates.model(slow_rank=1)
    live.write(state, at=dashstates.T0 + 30)
    view, why = live.read(state.job_id)
    assert why == "" and view is not None
    assert view.written_at == dashstates.T0 + 30
    assert view.state.rows == state.rows and view.state.log == state.log
    assert view.state.training == training(model, 3, state.running())
    assert view.state.training.lagging is not None and view.state.training.lagging.rank == 1
    assert live.step_loss(state.job_id) == (300, state.training.loss)


def test_a_failure_round_trips_with_its_root_cause() -> None:
    state = dashstates.failed()
    live.write(dataclasses.replace(state, training=None))
    view, _ = live.read(state.job_id)
    assert view is not None
    assert view.state.root_cause == state.root_cause and view.state.finished
    assert view.state.training is None
    assert live.step_loss(state.job_id) == (None, None)


def test_the_file_carries_the_figures_not_the_reports() -> None:
    """Version 1 carried every node's and host's last 36 reports: 9.5 MB at 1024 processes over
    128 hosts, written every second (bench/scale_views.py)."""
    state = dashstates.healthy(slow_rank=1)
    live.write(state)
    doc = json.loads(live.path(state.job_id).read_text())
    assert "metrics" not in doc and doc["training"]["step"] == state.training.step
    view, _ = live.read(state.job_id)
    assert view is not None and view.state.training == state.training


def test_missing_corrupt_old_or_malformed_files_read_as_none_with_the_reason() -> None:
    state = dashstates.healthy()
    assert live.read(state.job_id) == (None, "")
    assert live.read("../etc") == (None, "")
    live.write(state)
    p = live.path(state.job_id)
    text = p.read_text()
    for content, reason in (
        (text[: len(text) // 2], "not valid JSON (cut short?)"),
        ("[1, 2]", "not a JSON object"),
        (text.replace('"version":2', '"version":1'), "version 1, this launchkit reads version 2"),
        (text.replace('"written_at":', '"written_at":"x","w":'), "'written_at' missing or not a number"),
        (text.replace('"job_id":', '"job_id":1,"x":'), "field 'job_id' missing or of the wrong type"),
        (text.replace('"rank":0,', '"rank":"zero",', 1), "process row field 'rank'"),
    ):
        p.write_text(content)
        view, why = live.read(state.job_id)
        assert view is None and reason in why and str(p) in why, (content[:80], why)
    p.write_bytes(b"\xff\xfe")
    assert "cannot read" in live.read(state.job_id)[1]
    # a training part of the wrong shape is ignored, not trusted
    doc = json.loads(text)
    p.write_text(json.dumps({**doc, "training": {**doc["training"], "step": "x", "hosts": 7, "loss": 1e999}}))
    view, why = live.read(state.job_id)
    assert view is not None and view.state.training is not None and view.state.training.step is None
    assert view.state.training.hosts == () and view.state.training.loss is None
    p.write_text(json.dumps({**json.loads(text), "training": [1, 2]}))
    view, why = live.read(state.job_id)
    assert view is not None and view.state.training is None


def test_odd_values_in_the_metrics_part_are_skipped_not_a_crash() -> None:
    """A number too large for a float, a time that is not a number, points or rows of the wrong
    shape: each is left out (a traceback in top or ps before)."""
    from launchkit.telemetry.model import JobMetrics

    model = JobMetrics.from_json(
        {
            "nodes": [
                {
                    "role": "worker",
                    "rank": 0,
                    "points": [[1.0, {"loss": 10**400, "step": 3}], [{}, {"loss": 1}]],
                },
                {"role": "worker", "rank": 1, "points": 5},
                "not an object",
            ],
            "hosts": [{"host": "h", "points": [[10**400, {"load1": 1}], [2.0, {"load1": 2}]]}],
            "procs": [["h", 7, 10**400, 5], ["h", 8, 12.5, 6]],
        }
    )
    assert model.nodes[("worker", 0)].last() == [(1.0, {"step": 3.0})]
    assert ("worker", 1) not in model.nodes
    assert model.hosts["h"].last() == [(2.0, {"load1": 2.0})]
    assert model.procs == {("h", 7): (None, 5), ("h", 8): (12.5, 6)}
