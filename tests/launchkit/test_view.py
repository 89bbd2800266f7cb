"""The training panel's figures from a telemetry model (launchkit.telemetry.view)."""

from __future__ import annotations

import pytest

from launchkit.telemetry.model import JobMetrics, Series
from launchkit.telemetry.view import aligned_mean, lagging, rate, training
from tests.launchkit.dashstates import T0, model


def series(*points: tuple[float, dict[str, float]]) -> Series:
    s = Series()
    s.points.extend(points)
    return s


def test_rate_over_the_window_and_not_across_a_restarted_counter() -> None:
    s = series(*((T0 + t, {"n": 100.0 * t}) for t in range(20)))
    assert rate(s, "n") == pytest.approx(100.0)
    assert rate(series((T0, {"n": 5.0})), "n") is None
    assert rate(series((T0, {"n": 500.0}), (T0 + 1, {"n": 10.0})), "n") is None
    # after a drop (a counter that started again), the rate is taken from the reports since
    dropped = series((T0, {"n": 900.0}), (T0 + 1, {"n": 10.0}), (T0 + 2, {"n": 30.0}), (T0 + 3, {"n": 50.0}))
    assert rate(dropped, "n") == pytest.approx(20.0)
    # reports without the figure are skipped
    assert rate(series((T0, {"n": 0.0}), (T0 + 1, {}), (T0 + 2, {"n": 20.0})), "n") == pytest.approx(10.0)


def test_series_are_means_aligned_from_the_newest() -> None:
    a = series((1.0, {"loss": 4.0}), (2.0, {"loss": 2.0}))
    b = series((2.0, {"loss": 1.0}))
    assert aligned_mean([a, b], "loss") == (4.0, 1.5)
    assert aligned_mean([a, b], "accuracy") == ()


def test_a_healthy_job() -> None:
    t = training(model(), nodes_expected=3)
    assert t.nodes_reported == 3 and not t.waiting  # the servers and workers; not the scheduler
    assert t.step == 300
    assert t.loss == pytest.approx((2.0 / 31 + (2.0 / 31 + 0.01)) / 2)
    assert t.loss_series[0] > t.loss_series[-1] and len(t.loss_series) == 31
    assert t.accuracy == pytest.approx(0.99)
    assert t.samples_per_s == pytest.approx(2 * 320.0)
    assert t.samples_series[-1] == pytest.approx(640.0)
    assert t.compression_ratio == 16.0
    assert t.lagging is None
    (h,) = t.hosts
    assert (h.host, h.rx_mbps, h.tx_mbps, h.load1) == (
        "localhost",
        pytest.approx(2.0),
        pytest.approx(1.0),
        1.5,
    )


def test_a_worker_behind_is_named() -> None:
    t = training(model(slow_rank=1, workers=3), nodes_expected=5)
    assert t.lagging is not None
    assert (t.lagging.role, t.lagging.rank) == ("worker", 1)
    assert t.lagging.why == "step 150, median 300"


def test_a_slow_worker_is_named_by_its_rate() -> None:
    m = JobMetrics()
    for t in range(10):
        m.node_report("worker", 0, T0 + t, {"samples_total": 100.0 * t})
        m.node_report("worker", 1, T0 + t, {"samples_total": 30.0 * t})
    lag = training(m).lagging
    assert lag is not None and lag.rank == 1 and lag.why == "30 samples/s, median 65"


def test_a_silent_worker_is_named_but_not_one_that_ended() -> None:
    m = model(seconds=30)
    for t in range(31, 50):
        m.node_report("worker", 0, T0 + t, {"step": 10.0 * t})
    lag = training(m).lagging
    assert lag is not None and lag.rank == 1 and lag.why == "no report for 19s"
    assert training(m, running={("worker", 0)}).lagging is None
    assert lagging({}) is None


def test_nodes_still_registering() -> None:
    m = JobMetrics()
    m.node_report("scheduler", 0, T0, {})
    m.node_report("worker", 0, T0, {"registered": 1})
    m.node_report("worker", 1, T0, {"registered": 0})
    m.node_report("server", 0, T0, {})
    t = training(m, nodes_expected=4)
    assert t.waiting and (t.nodes_reported, t.nodes_expected) == (2, 4)
    assert t.step is None and t.samples_per_s is None and t.loss_series == ()
    assert not training(JobMetrics(), nodes_expected=4).waiting  # no report at all: not a telemetry job yet
