"""What the dashboard and the metrics cost: the digits example's time per epoch under
``launchkit launch`` with and without them, and a 64-process / 12-host job's refresh time.

    python -m bench.dashboard [--epochs 40] [--repeat 3] [--json out.json]

Part 1, the digits example (``examples/train_digits.py``, 2 workers, 1 server, local), three ways,
alternating, ``--repeat`` times each:

- *plain*: ``--no-dashboard``, the processes without ``LAUNCHKIT_METRICS_ADDR`` (``env -u``: they
  report nothing; the launcher still samples its host and writes the live file);
- *metrics*: ``--no-dashboard``, the processes report (the default);
- *dashboard + metrics*: ``--dashboard`` on a pseudo-terminal of 150x50, the processes report.

Besides the time per epoch, each run's wall time and the launcher's own CPU time (user + system
of the launcher process alone, read from ``/proc`` while it runs): on a 2-core machine, what the
launcher spends is what the job's processes may lose.

Each run's time per epoch is the mean of rank 0's own epoch times (its ``(0.05s)`` lines, read
back from the output the launcher keeps, ``launchkit logs``), the first epoch left out; the
table gives the median over runs, and each run's wall time.

Part 2, a synthetic state of 64 processes (1 scheduler, 15 servers, 48 workers) over 12 hosts
with a full telemetry history (240 reports per node and host): the time to compute the training
panel's figures, to render a frame for a 160x50 terminal, and to write the live file (median of
50, ms). Not run in CI.
"""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import pty
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EPOCH = re.compile(r"^\[worker 0\] epoch\s+\d+ .*\(([\d.]+)s\)$")
TITLE = "launchkit launch -n 2 -s 1 --dashboard python examples/train_digits.py --compression 2bit"
MODES = ("plain", "metrics", "dashboard + metrics")


def launch_argv(mode: str, epochs: int) -> list[str]:
    show = "--dashboard" if mode.startswith("dashboard") else "--no-dashboard"
    prog = [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--epochs", str(epochs)]
    if mode == "plain":
        prog = ["env", "-u", "LAUNCHKIT_METRICS_ADDR", *prog]
    return [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "-n",
        "2",
        "-s",
        "1",
        "--launcher",
        "local",
        show,
        *prog,
    ]


def own_cpu(pid: int) -> float | None:
    """User + system seconds of process ``pid`` itself (not its children)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def watched(proc: subprocess.Popen[bytes]) -> float:
    """Wait for ``proc``; its own CPU seconds as last seen (sampled every 50 ms)."""
    last = 0.0
    while proc.poll() is None:
        cpu = own_cpu(proc.pid)
        last = cpu if cpu is not None else last
        time.sleep(0.05)
    return last


def run_on_pty(argv: list[str], env: dict[str, str]) -> tuple[int, float]:
    """Run ``argv`` with a 150x50 pseudo-terminal as its stdout and stderr, output discarded:
    its exit code and its own CPU seconds."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)

    def drain() -> None:
        while True:
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    cpu = watched(proc)
    reader.join(timeout=5)
    os.close(master)
    return proc.returncode, cpu


def one_run(mode: str, epochs: int) -> tuple[float, float, float]:
    """(mean seconds per epoch of rank 0, wall seconds, the launcher's own CPU seconds) of one launch."""
    with tempfile.TemporaryDirectory(prefix="lk-bench-dash-") as home:
        env = {**os.environ, "LAUNCHKIT_HOME": home}
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
        t0 = time.monotonic()
        argv = launch_argv(mode, epochs)
        if mode.startswith("dashboard"):
            code, cpu = run_on_pty(argv, env)
        else:
            with tempfile.TemporaryFile() as out:
                proc = subprocess.Popen(
                    argv, env=env, cwd=ROOT, stdout=out, stderr=out, stdin=subprocess.DEVNULL
                )
                cpu = watched(proc)
                code = proc.returncode
        wall = time.monotonic() - t0
        if code != 0:
            raise SystemExit(f"{mode}: the launch ended with exit {code}")
        (job,) = [p.stem for p in (Path(home) / "jobs").glob("*.json")]
        logs = subprocess.run(
            [sys.executable, "-m", "launchkit", "logs", job, "--role", "worker", "--rank", "0"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        times = [float(m[1]) for line in logs.stdout.splitlines() if (m := EPOCH.match(line))]
        if len(times) < 3:
            raise SystemExit(f"{mode}: found {len(times)} epoch lines in worker 0's output")
        return statistics.fmean(times[1:]), wall, cpu


def digits(epochs: int, repeat: int) -> dict[str, Any]:
    runs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
    for _ in range(repeat):
        for mode in MODES:
            runs[mode].append(one_run(mode, epochs))
    return {
        m: {
            "epoch_ms": 1000 * statistics.median(r[0] for r in runs[m]),
            "epoch_ms_runs": [round(1000 * r[0], 1) for r in runs[m]],
            "wall_s": statistics.median(r[1] for r in runs[m]),
            "launcher_cpu_s": statistics.median(r[2] for r in runs[m]),
        }
        for m in MODES
    }


def synthetic(n: int = 50) -> dict[str, float]:
    from rich.console import Console

    from launchkit.dashboard import DashboardState, ProcRow, fit, render
    from launchkit.jobs import live
    from launchkit.telemetry.model import HISTORY, JobMetrics
    from launchkit.telemetry.view import training

    hosts = [f"node{i:02d}" for i in range(12)]
    names = [("scheduler", 0)] + [("server", r) for r in range(15)] + [("worker", r) for r in range(48)]
    model = JobMetrics()
    t0 = time.time() - HISTORY
    for t in range(HISTORY):
        for role, rank in names[1:]:
            figures = {
                "step": 10.0 * t,
                "loss": 2.0 / (1 + t),
                "samples_total": 320.0 * t,
                "compression_ratio": 16.0,
                "bytes_pushed": 1e6 * t,
                "bytes_pulled": 1e6 * t,
                "push_ms": 1.0,
                "pull_ms": 1.2,
                "heartbeat_age_s": 0.2,
                "registered": 1.0,
            }
            model.node_report(role, rank, t0 + t, figures)
        for h in hosts:
            model.host_report(
                h,
                t0 + t,
                {
                    "load1": 3.0,
                    "mem_used": 2**33,
                    "mem_total": 2**35,
                    "net_rx_bytes": 1e8 * t,
                    "net_tx_bytes": 9e7 * t,
                },
            )
    for i in range(64):
        model.procs[(hosts[i % 12], 1000 + i)] = (50.0, 2**29)
    rows = tuple(
        ProcRow(role, rank, hosts[i % 12], 1000 + i, "running", "", 50.0, 2**29, f"{role} {rank}: step {i}")
        for i, (role, rank) in enumerate(names)
    )
    log = tuple((f"worker {i}", f"epoch {i} loss 0.1") for i in range(12))
    out: dict[str, list[float]] = {"figures": [], "render": [], "live file": []}
    with tempfile.TemporaryDirectory() as home:
        os.environ["LAUNCHKIT_HOME"] = home
        for _ in range(n):
            a = time.perf_counter()
            fig = training(model, 63, {n for n in names})
            b = time.perf_counter()
            state = DashboardState("1123-000000-abcdef", "big", "ssh", 100.0, rows, log, training=fig)
            console = Console(
                file=io.StringIO(), width=160, height=50, force_terminal=True, color_system="truecolor"
            )
            console.print(render(state, *fit(state, 50)))
            c = time.perf_counter()
            live.write(state)
            d = time.perf_counter()
            out["figures"].append(b - a)
            out["render"].append(c - b)
            out["live file"].append(d - c)
    return {k: 1000 * statistics.median(v) for k, v in out.items()}


def svg(path: Path, epochs: int = 300) -> None:
    """The dashboard during a real digits run, as an SVG: the job's live file, read while it
    trains (once its sparklines hold 12 reports), rendered as ``launchkit top`` renders it."""
    from rich.console import Console

    from launchkit.cli.top import from_live
    from launchkit.dashboard import fit, render
    from launchkit.jobs import live
    from launchkit.jobs import records as jobs

    with tempfile.TemporaryDirectory(prefix="lk-bench-svg-") as home:
        os.environ["LAUNCHKIT_HOME"] = home
        argv = launch_argv("metrics", epochs)
        proc = subprocess.Popen(
            [*argv, "--compression", "2bit"],
            env=os.environ,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.5)
                ids = [p.stem for p in (Path(home) / "jobs").glob("*.json")]
                view = live.read(ids[0])[0] if ids else None
                t = view.state.training if view else None
                if view and t and len(t.loss_series) >= 12 and t.accuracy is not None:
                    state = from_live(
                        jobs.load(ids[0]) or jobs.read(Path(home) / "jobs" / f"{ids[0]}.json"),
                        view,
                        view.written_at,
                    )
                    console = Console(
                        record=True, width=130, height=40, file=io.StringIO(), force_terminal=True
                    )
                    console.print(render(state, *fit(state, 40)))
                    print(console.export_text(clear=False))
                    console.save_svg(str(path), title=TITLE)
                    print(f"wrote {path}")
                    return
            raise SystemExit("the digits run never showed 12 reports")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument(
        "--svg", default=None, help="only write the dashboard of a real digits run to this SVG file"
    )
    args = p.parse_args()
    if args.svg:
        svg(Path(args.svg))
        return
    result = {"digits": digits(args.epochs, args.repeat), "synthetic_64x12": synthetic()}
    print(
        "| digits example, 2 workers 1 server | ms per epoch (median of runs) | runs | wall s | launcher CPU s |"
    )
    print("|---|---|---|---|---|")
    for m, r in result["digits"].items():
        runs = ", ".join(map(str, r["epoch_ms_runs"]))
        print(f"| {m} | {r['epoch_ms']:.1f} | {runs} | {r['wall_s']:.2f} | {r['launcher_cpu_s']:.2f} |")
    print()
    print("| 64 processes, 12 hosts, 240 reports each | ms (median of 50) |")
    print("|---|---|")
    for k, v in result["synthetic_64x12"].items():
        print(f"| {k} | {v:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
