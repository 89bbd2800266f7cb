"""A worker's figures for the metrics reports (``trainer_core.metrics``, docs/metrics.md).

The KV calls only add integers (``Timing``; the byte counts are the codec's ``WireStats``);
``node_source`` turns them into figures when a report goes out, in the reporter's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from time import perf_counter_ns
from typing import Any, TypeVar

from trainer_core.compression.codec import WireStats
from trainer_core.node.liveness import Health


class Timing:
    """Calls and nanoseconds spent in them: pushes (until the call returns: a push does not wait
    for the server) and pulls (the round trip, a pushpull included)."""

    __slots__ = ("pull_n", "pull_ns", "push_n", "push_ns")

    def __init__(self) -> None:
        self.push_n = self.push_ns = self.pull_n = self.pull_ns = 0


F = TypeVar("F", bound=Callable[..., None])


def timed(exchange: F) -> F:
    """Around ``DistKVStore._exchange(op, pushes, pulls)``: its time into ``self.timing``."""

    @wraps(exchange)
    def run(self: Any, op: str, pushes: Any, pulls: Any) -> None:
        t = perf_counter_ns()
        exchange(self, op, pushes, pulls)
        t = perf_counter_ns() - t
        timing = self.timing
        if pulls is None:
            timing.push_n += 1
            timing.push_ns += t
        else:
            timing.pull_n += 1
            timing.pull_ns += t

    return run  # type: ignore[return-value]


def for_store(stats: WireStats, health: Health) -> tuple[Timing, Callable[[], dict[str, float]]]:
    """A worker's ``Timing`` and the metrics source reading it."""
    timing = Timing()
    return timing, node_source(stats, timing, health)


def node_source(stats: WireStats, timing: Timing, health: Health) -> Callable[[], dict[str, float]]:
    """The figures of one worker: ``bytes_pushed``, ``bytes_pulled``, ``pushes``, ``pulls``
    (cumulative), ``push_ms``/``pull_ms`` (mean since the previous report, when there were calls),
    ``compression_ratio`` (raw bytes pushed / bytes on the wire), ``heartbeat_age_s``."""
    last = [0, 0, 0, 0]

    def figures() -> dict[str, float]:
        now = [timing.push_n, timing.push_ns, timing.pull_n, timing.pull_ns]
        d = [a - b for a, b in zip(now, last, strict=True)]
        last[:] = now
        out: dict[str, float] = {
            "bytes_pushed": stats.sent,
            "bytes_pulled": stats.received,
            "pushes": now[0],
            "pulls": now[2],
        }
        if d[0]:
            out["push_ms"] = d[1] / d[0] / 1e6
        if d[2]:
            out["pull_ms"] = d[3] / d[2] / 1e6
        if stats.sent:
            out["compression_ratio"] = stats.raw_sent / stats.sent
        age = health.heartbeat_age()
        if age is not None:
            out["heartbeat_age_s"] = age
        return out

    return figures
