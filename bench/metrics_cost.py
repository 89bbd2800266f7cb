"""What the metrics reports cost a KV round trip: bench/kv.py's trainer_core job (push + pull,
and pushpull, of N float32; median per worker, averaged over workers), run with and without
``LAUNCHKIT_METRICS_ADDR`` (an endpoint in this process, as the launcher serves it), alternating.

Usage: ``python bench/metrics_cost.py [--config 2x2] [--sizes 1e3,1e5] [--repeat 5]``

With the address set, each process's reporter thread sends one signed datagram a second and the
KV calls add two clock reads and a few integer adds (trainer_core/kv/figures.py). Prints each
mode's median over the runs and the median of the per-run ratios. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kv import ITERS, OURS, mean_of_workers, run_job
from launchkit.telemetry.endpoint import Telemetry


def once(workers: int, servers: int, sizes: list[int], metrics: bool) -> tuple[dict[str, float], int]:
    """One job: each mode's round trip in ms, and the reports the endpoint took."""
    job, secret = "bench" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    env = {
        "LAUNCHKIT_JOB_ID": job,
        "LAUNCHKIT_JOB_SECRET": secret,
        "BENCH_SIZES": json.dumps(sizes),
        "BENCH_ITERS": json.dumps({str(n): ITERS.get(n, 20) for n in sizes}),
    }
    endpoint = Telemetry(job, secret, "127.0.0.1") if metrics else None
    try:
        if endpoint is not None:
            env["LAUNCHKIT_METRICS_ADDR"] = endpoint.address
        result = mean_of_workers(run_job(sys.executable, OURS, "import trainer_core", workers, servers, env))
    finally:
        if endpoint is not None:
            endpoint.close()
    return result, endpoint.received if endpoint is not None else 0


def micro() -> None:
    """In one process: what the hot path and the reporter pay per call (ns, best of 5)."""
    import timeit

    from trainer_core import metrics
    from trainer_core.kv.figures import Timing, timed
    from trainer_core.transport.datagram import DatagramPeer

    class Store:
        timing = Timing()

        def plain(self, op: str, pushes: object, pulls: object) -> None:
            return None

        wrapped = timed(plain)

    store, n = Store(), 200_000
    endpoint = Telemetry("micro", "s" * 64, "127.0.0.1")
    r = metrics.Reporter(
        lambda: DatagramPeer(endpoint.address, "s" * 64, "micro"), "worker", 0, interval=3600
    )
    r._peer = DatagramPeer(endpoint.address, "s" * 64, "micro")
    r.report(**{f"figure_{i}": float(i) for i in range(12)})
    cases = {
        "KV call, untimed (no-op body)": lambda: store.plain("push", (), None),
        "KV call, timed (kv/figures.timed)": lambda: store.wrapped("push", (), None),
        "metrics.report(step, loss, samples)": lambda: r.report(step=1, loss=0.5, samples=32),
        "one report sent (15 figures)": r.send,
    }
    for name, fn in cases.items():
        count = n if "sent" not in name else 20_000
        best = min(timeit.repeat(fn, number=count, repeat=5)) / count * 1e9
        print(f"{name:>40} {best:9.0f} ns")
    endpoint.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="2x2", help="WxS")
    ap.add_argument("--sizes", default="1e3,1e5")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--micro", action="store_true", help="only the per-call costs, in one process")
    args = ap.parse_args()
    if args.micro:
        micro()
        return
    workers, servers = (int(x) for x in args.config.split("x"))
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    reports = []
    for _ in range(args.repeat):
        for metrics in (False, True):
            result, received = once(workers, servers, sizes, metrics)
            runs[metrics].append(result)
            if metrics:
                reports.append(received)
    print(f"{workers}x{servers}, {args.repeat} runs each, reports received per run: {reports}")
    print(f"{'mode/size':>18} {'without ms':>11} {'with ms':>9} {'ratio (median of runs)':>23} {'range':>13}")
    for name in runs[False][0]:
        off = statistics.median(r[name] for r in runs[False])
        on = statistics.median(r[name] for r in runs[True])
        ratios = [b[name] / a[name] for a, b in zip(runs[False], runs[True], strict=True)]
        print(
            f"{name:>18} {off:11.3f} {on:9.3f} {statistics.median(ratios):23.3f} "
            f"{min(ratios):6.3f}-{max(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
