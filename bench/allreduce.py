"""Allreduce-equivalent: summing one float32 array over W worker processes on this machine,
trainer_core's parameter server (``pushpull``: push the array, pull the sum, one round trip)
beside ``torch.distributed`` with the gloo backend on CPU (``all_reduce``).

    python bench/allreduce.py [--workers 2 4] [--sizes 1e3 1e5 1e6 1e7] [--json OUT]

Both sides are launched with ``launchkit launch --launcher local``; torch runs in its own
virtual environment ``.venv-torch`` (``pip install torch==2.13.0``, the CPU wheel), created on
first use. Prints a Markdown table of median milliseconds per operation and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.peers import torch_python

ROOT = Path(__file__).resolve().parents[1]

TC_WORKER = r"""
import json, os, sys, time
import numpy as np
import trainer_core
from trainer_core import kv as kvs
sizes, reps = [int(float(s)) for s in sys.argv[1].split(",")], int(sys.argv[2])
kv = kvs.create("dist_sync")
out = {}
for n in sizes:
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    kv.init(f"k{n}", np.zeros(n, np.float32))
    times = []
    for i in range(reps + 2):
        t = time.perf_counter()
        kv.pushpull(f"k{n}", x, y)
        times.append(time.perf_counter() - t)
    assert float(y[0]) == kv.num_workers, y[0]
    out[n] = sorted(times[2:])[len(times[2:]) // 2]
if kv.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
kv.close()
"""

TORCH_WORKER = r"""
import json, os, sys, time
if os.environ.get("DMLC_ROLE") != "worker":
    sys.exit(0)
import torch, torch.distributed as dist
sizes, reps, port = [int(float(s)) for s in sys.argv[1].split(",")], int(sys.argv[2]), sys.argv[3]
rank, world = int(os.environ["LAUNCHKIT_ROLE_RANK"]), int(os.environ["DMLC_NUM_WORKER"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.set_num_threads(1)
out = {}
for n in sizes:
    x = torch.ones(n, dtype=torch.float32)
    times = []
    for i in range(reps + 2):
        x.fill_(1.0)
        t = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t)
    assert float(x[0]) == world
    out[n] = sorted(times[2:])[len(times[2:]) // 2]
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def launch(workers: int, servers: int, python: str, script: str, args: list[str]) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        argv = [sys.executable, "-m", "launchkit", "launch", "-n", str(workers), "-s", str(servers), "--launcher",
                "local", python, f.name, *args]  # fmt: skip
        res = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    finally:
        os.unlink(f.name)
    for line in res.stdout.splitlines():
        if "RESULT " in line:
            return {k: float(v) for k, v in json.loads(line.split("RESULT ", 1)[1]).items()}
    raise RuntimeError(f"no result (exit {res.returncode}): {res.stderr[-2000:]}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(workers_list: list[int], sizes: list[str], reps: int) -> list[dict[str, object]]:
    tpy = torch_python()
    rows = []
    for w in workers_list:
        tc = launch(w, 2, sys.executable, TC_WORKER, [",".join(sizes), str(reps)])
        th = launch(w, 0, tpy, TORCH_WORKER, [",".join(sizes), str(reps), str(free_port())])
        for n in tc:
            rows.append(
                {"workers": w, "size": int(n), "trainer_core_ms": tc[n] * 1e3, "torch_gloo_ms": th[n] * 1e3}
            )
    return rows


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| workers | float32 elements | trainer_core pushpull (ms) | torch gloo all_reduce (ms) | trainer_core / gloo |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        tc, th = float(r["trainer_core_ms"]), float(r["torch_gloo_ms"])  # type: ignore[arg-type]
        lines.append(f"| {r['workers']} | {int(r['size']):.0e} | {tc:.3f} | {th:.3f} | {tc / th:.2f}x |")  # type: ignore[call-overload]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["1e3", "1e5", "1e6", "1e7"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = run(args.workers, args.sizes, args.reps)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
