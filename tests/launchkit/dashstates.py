"""Known states of a job for the dashboard's tests: a telemetry model and the rows beside it."""

from __future__ import annotations

from launchkit.telemetry.model import JobMetrics
from launchkit.telemetry.view import training
from launchkit.view.state import DashboardState, ProcRow, RootCause

T0 = 1_700_000_000.0


def model(
    seconds: int = 30, slow_rank: int | None = None, hosts: tuple[str, ...] = ("localhost",), workers: int = 2
) -> JobMetrics:
    """Workers reporting once a second: 10 steps/s (5 for ``slow_rank``), 320 samples/s each,
    the loss falling from 2.0 and the accuracy rising; each host 2 MB/s in, 1 MB/s out."""
    m = JobMetrics()
    for t in range(seconds + 1):
        at = T0 + t
        for rank in range(workers):
            pace = 5 if rank == slow_rank else 10
            m.node_report(
                "worker",
                rank,
                at,
                {
                    "step": pace * t,
                    "loss": 2.0 / (1 + t) + rank * 0.01,
                    "accuracy": min(0.99, 0.1 + 0.03 * t),
                    "samples_total": 32 * pace * t,
                    "compression_ratio": 16.0,
                    "bytes_pushed": 1000 * t,
                },
            )
        m.node_report("server", 0, at, {"bytes_pushed": 0})
        m.node_report("scheduler", 0, at, {"heartbeat_age_s": 0.1})
        for h in hosts:
            m.host_report(
                h,
                at,
                {
                    "load1": 1.5,
                    "mem_used": 3 * 2**30,
                    "mem_total": 8 * 2**30,
                    "net_rx_bytes": 2_000_000 * t,
                    "net_tx_bytes": 1_000_000 * t,
                },
                {100 + i: (50.0 + i, (100 + i) * 2**20) for i in range(4)},
            )
    return m


def rows(states: dict[tuple[str, int], str] | None = None, workers: int = 2) -> tuple[ProcRow, ...]:
    names = [("scheduler", 0), ("server", 0)] + [("worker", r) for r in range(workers)]
    states = states or {}
    out = []
    for i, (role, rank) in enumerate(names):
        state = states.get((role, rank), "running")
        detail = "exit 3" if state == "failed" else "signal 15" if state == "ended" else ""
        out.append(
            ProcRow(
                role,
                rank,
                "localhost",
                100 + i,
                state,
                detail,
                50.0 + i,
                (100 + i) * 2**20,
                f"{role} {rank} line",
            )
        )
    return tuple(out)


def healthy(slow_rank: int | None = None) -> DashboardState:
    m = model(slow_rank=slow_rank)
    r = rows()
    return DashboardState(
        "1122-000000-abcdef",
        "train_digits",
        "local",
        65.0,
        r,
        log=(("worker 0", "epoch 1 loss 0.51"),),
        training=training(m, len(r) - 1),
    )


def failed() -> DashboardState:
    m = model()
    r = rows(
        {("worker", 1): "failed", ("worker", 0): "ended", ("server", 0): "ended", ("scheduler", 0): "ended"}
    )
    cause = RootCause(
        "worker",
        1,
        "localhost",
        "exit 3",
        ("epoch 3", "Traceback (most recent call last):", "ValueError: the data went bad"),
    )
    return DashboardState(
        "1122-000000-abcdef",
        "train_digits",
        "local",
        12.0,
        r,
        training=training(m, len(r) - 1, set()),
        root_cause=cause,
        finished=True,
    )
