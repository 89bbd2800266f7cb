"""The time from a worker's SIGKILL to the first completed training step after it, side by side on
one small model (``bench/elastic_worker.py``), 4 workers on this machine:

* ``trainer_core``: ``launchkit launch -n 2:4 -s 0`` with ``hvd.elastic`` (the survivors re-form
  in their processes and go on from their last commit);
* ``torchrun``: ``python -m torch.distributed.run --standalone --nnodes 1:4 --nproc-per-node 4
  --max-restarts 3`` of a DDP (gloo) script that resumes from its snapshot (every worker restarts);
* ``launchkit --max-restarts``: ``launchkit launch -n 4 -s 0 --max-restarts 1`` of the same DDP
  script (the whole job restarts).

Each run waits until every worker has done ``--warm`` steps, SIGKILLs worker 2, and takes the
first step completed after the kill by the group of after the change (the re-formed one, or
the workers started again): a step that a survivor completes with the dead worker's part already
in does not count. The systems alternate run by run; medians and
ratios to torchrun's are printed as a markdown table (docs/performance.md).

    python -m bench.elastic [--runs 3] [--warm 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = str(Path(__file__).with_name("elastic_worker.py"))
LAUNCHKIT = [sys.executable, "-m", "launchkit", "launch", "--no-dashboard", "--launcher", "local"]
SYSTEMS = {
    "trainer_core elastic (-n 2:4)": [
        *LAUNCHKIT,
        "-n",
        "2:4",
        "-s",
        "0",
        "--blacklist-cooldown",
        "600",
        "--env",
        "PS_HEARTBEAT_INTERVAL:0.2",
        "--env",
        "PS_HEARTBEAT_TIMEOUT:6",
        "{env}",
        sys.executable,
        WORKER,
        "hvd",
    ],
    "torchrun --nnodes 1:4 --max-restarts 3": [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1:4",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "3",
        WORKER,
        "ddp",
    ],
    "launchkit --max-restarts 1": [
        *LAUNCHKIT,
        "-n",
        "4",
        "-s",
        "0",
        "--max-restarts",
        "1",
        "{env}",
        sys.executable,
        WORKER,
        "ddp",
    ],
}
PEER = "torchrun --nnodes 1:4 --max-restarts 3"


def steps(out: Path) -> list[float]:
    return [
        json.loads(x)["t"] for f in out.glob("steps-*") for x in f.read_text().splitlines() if x.endswith("}")
    ]


def wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def one(name: str, warm: int, timeout: float) -> float:
    """Seconds from the SIGKILL of worker 2 to the first step completed after it."""
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as d:
        out = Path(d)
        argv = []
        for a in SYSTEMS[name]:
            argv += ["--env", f"OUT:{out}"] if a == "{env}" else [a]
        env = {**os.environ, "OUT": str(out), "LAUNCHKIT_HOME": str(out / "home")}
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            firsts = [out / f"steps-{i}-0" for i in range(4)]
            ok = wait(
                lambda: all(f.exists() and len(f.read_text().splitlines()) >= warm for f in firsts), timeout
            )
            if not ok:
                raise RuntimeError(f"{name}: no {warm} steps on every worker within {timeout} s")
            killed = time.time()
            os.kill(int((out / "pid-2").read_text()), signal.SIGKILL)
            if not wait(lambda: any(t > killed for t in steps(out)), timeout):
                raise RuntimeError(f"{name}: no step within {timeout} s of the kill")
            first = min(t for t in steps(out) if t > killed)
            (out / "stop").write_text("")
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: exit {proc.returncode}: {err[-2000:]}")
            return first - killed
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warm", type=int, default=20, help="steps every worker does before the kill")
    p.add_argument("--timeout", type=float, default=180.0)
    args = p.parse_args()
    if args.runs < 1 or args.warm < 1:
        p.error("--runs and --warm take a number of 1 or more")
    got: dict[str, list[float | None]] = {n: [] for n in SYSTEMS}
    for r in range(args.runs):
        order = list(SYSTEMS) if r % 2 == 0 else list(reversed(SYSTEMS))
        for name in order:
            try:
                got[name].append(one(name, args.warm, args.timeout))
                print(f"run {r + 1} {name}: {got[name][-1]:.2f} s", file=sys.stderr, flush=True)
            except RuntimeError as exc:  # (a run that did not recover is a result too: said, kept)
                got[name].append(None)
                print(f"run {r + 1} {exc}", file=sys.stderr, flush=True)

    def median(xs: list[float | None]) -> float | None:
        done = [x for x in xs if x is not None]
        return statistics.median(done) if done else None

    peer = median(got[PEER])
    print(f"| system | runs (s; -: no step within {args.timeout:g} s) | median s | ratio to torchrun |")
    print("|---|---|---|---|")
    for name, xs in got.items():
        med = median(xs)
        runs = ", ".join("-" if x is None else f"{x:.2f}" for x in xs)
        ratio = f"{med / peer:.2f}x" if med is not None and peer else "-"
        print(f"| {name} | {runs} | {'-' if med is None else f'{med:.2f}'} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
