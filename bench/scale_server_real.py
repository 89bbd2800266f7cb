"""Real processes: one server and n workers on this machine, launched by launchkit.

    python -m bench.scale_server_real [--workers 64 128 256] [--json out.json]

``launchkit launch -n N -s 1 --launcher local --no-dashboard`` runs ``PROGRAM`` below in every
worker: it creates trainer_core's ``dist_sync`` KV store (the join: it returns once every node has
registered and this worker has its book), inits one key of 256 float32, enters a barrier twice
(the second timed), does one push and pull, and prints its figures: when it joined, its barrier
time, its RSS and PSS (``/proc/self/smaps_rollup``: shared pages divided among the processes that
map them). Figures of a launch:

- **all registered**: from the launch's start to the last worker's join (every process started,
  its Python and trainer_core imported, the scheduler's book received);
- **barrier**: from the last worker entering the timed barrier to the last one leaving it, and
  the median of each worker's own wait;
- **memory**: each worker's RSS and PSS (median); the sum of every job process's PSS and the
  server's RSS and PSS, read by worker 0 while every worker waits in a barrier (the processes
  that run this program: ``/proc/PID/cmdline``, their role from ``/proc/PID/environ``).

The machine has 2 cores: n Python processes starting at once share them, so the start is bound
by their imports (about 0.25 s of CPU each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAUNCHKIT = str(Path(sys.executable).with_name("launchkit"))

PROGRAM = r"""
import json, os, re, time
import numpy as np
from trainer_core import kv as kvmod

def pss_rss(pid='self'):
    with open('/proc/%s/smaps_rollup' % pid) as f:
        roll = f.read()
    return [int(re.search(name + r':\s+(\d+)', roll).group(1)) * 1024 for name in ('Pss', 'Rss')]

def job():  # {role: [pss, ...]} of every process of this job (they all run this file)
    me, roles = os.path.abspath(__file__), {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/cmdline' % pid, 'rb') as f:
                if me.encode() not in f.read():
                    continue
            with open('/proc/%s/environ' % pid, 'rb') as f:
                role = re.search(rb'(?:^|\0)DMLC_ROLE=(\w+)', f.read()).group(1).decode()
            roles.setdefault(role, []).append(pss_rss(pid))
        except (OSError, AttributeError):
            pass
    return roles

kv = kvmod.create('dist_sync')
joined = time.time()
kv.init('w', np.zeros(256, np.float32))
kv.barrier()
entered = time.time()
kv.barrier()
left = time.time()
pss, rss = pss_rss()
roles = job() if kv.rank == 0 else {}
kv.barrier()  # (rank 0 has read every process's figures while all of them waited)
a, out = np.ones(256, np.float32), np.empty(256, np.float32)
t = time.time()
kv.push('w', a)
kv.pull('w', out=out)
round_s = time.time() - t
assert out[0] == kv.num_workers, out[0]
print('SCALE ' + json.dumps({'rank': kv.rank, 'joined': joined, 'entered': entered, 'left': left,
      'rss': rss, 'pss': pss, 'roles': roles, 'round_s': round_s}), flush=True)
kv.close()
"""


def launch(n: int, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp, "tiny.py")
        prog.write_text(PROGRAM)
        cmd = [LAUNCHKIT, "launch", "-n", str(n), "-s", "1", "--launcher", "local", "--no-dashboard"]
        cmd += ["--", sys.executable, str(prog)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PS_START_TIMEOUT": str(timeout_s)}
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s + 60)
        ended = time.time()
    rows = [json.loads(line.split("SCALE ", 1)[1]) for line in proc.stdout.splitlines() if "SCALE " in line]
    out: dict[str, Any] = {"workers": n, "exit code": proc.returncode, "workers reporting": len(rows)}
    if len(rows) != n:
        out["stderr tail"] = (proc.stderr or proc.stdout)[-2000:]
        return out
    waits = [r["left"] - r["entered"] for r in rows]
    roles = next(r["roles"] for r in rows if r["rank"] == 0)
    server_pss, server_rss = roles.get("server", [[0, 0]])[0]
    out.update(
        {
            "all registered s (from the launch)": max(r["joined"] for r in rows) - start,
            "first registered s": min(r["joined"] for r in rows) - start,
            "barrier s (last in to last out)": max(r["left"] for r in rows) - max(r["entered"] for r in rows),
            "barrier s (median wait of a worker)": statistics.median(waits),
            "push+pull ms (median)": 1e3 * statistics.median(r["round_s"] for r in rows),
            "launch to exit s": ended - start,
            "worker RSS MiB (median)": statistics.median(r["rss"] for r in rows) / 2**20,
            "worker PSS MiB (median)": statistics.median(r["pss"] for r in rows) / 2**20,
            "job processes seen": " ".join(f"{k} {len(v)}" for k, v in sorted(roles.items())),
            "every job process's PSS, sum, MiB": sum(p for v in roles.values() for p, _ in v) / 2**20,
            "server RSS MiB": server_rss / 2**20,
            "server PSS MiB": server_pss / 2**20,
        }
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--timeout", type=float, default=300.0, help="PS_START_TIMEOUT and the launch's bound")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = []
    for n in args.workers:
        results.append(launch(n, args.timeout))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    keys = [k for k in results[-1] if k != "workers"]
    print("| | " + " | ".join(f"{r['workers']} workers" for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for k in keys:
        cells = [
            f"{r.get(k, ''):,.2f}" if isinstance(r.get(k), float) else str(r.get(k, "")) for r in results
        ]
        print(f"| {k} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
