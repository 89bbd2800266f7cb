"""Compressed KV-store round trips on loopback: trainer_core 2-bit / 1-bit vs MXNet 1.9.1 2-bit.

Usage: ``python bench/compressed_kv.py [--configs 2x2,4x2] [--sizes 1e6,1e7] [--repeat 1] [--json OUT]``

The loopback end-to-end target: a compressed 1e7-element push+pull takes at most half
of MXNet's 2-bit push+pull. For each configuration (W workers x S servers, all on this host) it
launches, with the real launcher (``launchkit launch -n W -s S --launcher local PYTHON SCRIPT``;
MXNet also with ``--env DMLC_INTERFACE:lo``), one job per system and compression:

* trainer_core ``dist_sync`` plain, with ``set_gradient_compression({'type': '2bit',
  'threshold': 0.5})`` and with ``{'type': '1bit'}`` (pushes and pulls compressed: the server
  decodes the pushes, sums, encodes the sum with its own residual, the worker decodes);
* MXNet 1.9.1 ``dist_sync`` plain and with ``{'type': '2bit', 'threshold': 0.5}`` (MXNet
  compresses pushes only; its pulls are 32-bit).

Every worker times ``push(N float32)`` followed by ``pull`` of the summed value, as
``bench/kv.py`` does (warm-up rounds, a barrier, then the median over iterations), and the
numbers are averaged over the workers. The pushed values are random normal (one seed per rank).
trainer_core also reports the payload bytes one worker sent and received per round trip
(``wire_stats``). ``--repeat R`` runs every job R times, interleaved, and keeps each cell's
median. Benchmarks are not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kv import ITERS, mean_of_workers
from bench.peers import mxnet_python

REPO = Path(__file__).resolve().parents[1]
WARMUP = 3
COMPRESSIONS = {
    "plain": None,
    "2bit": {"type": "2bit", "threshold": 0.5},
    "1bit": {"type": "1bit"},
}

OURS = """
import json, statistics, sys, time
import numpy as np
import trainer_core  # noqa: F401  (scheduler and server roles run here and exit)
from trainer_core import kv as kvmod

cfg = json.loads(sys.argv[1])
kv = kvmod.create('dist_sync')
if cfg['compression']:
    kv.set_gradient_compression(cfg['compression'])
rng = np.random.default_rng(kv.rank)
res = {}
for n in cfg['sizes']:
    key = 'k%d' % n
    kv.init(key, np.zeros(n, np.float32))
    a, out = rng.standard_normal(n).astype(np.float32), np.empty(n, np.float32)
    iters, warm = cfg['iters'][str(n)], cfg['warmup']
    times, before = [], None
    for i in range(iters + warm):
        if i == warm:
            kv.barrier()
            before = kv.wire_stats()
        t = time.perf_counter()
        kv.push(key, a)
        kv.pull(key, out)
        times.append(time.perf_counter() - t)
    after = kv.wire_stats()
    assert np.isfinite(out).all()
    moved = after['sent'] + after['received'] - before['sent'] - before['received']
    res['push+pull/%d' % n] = statistics.median(times[warm:]) * 1e3
    res['bytes/%d' % n] = moved / iters
print('RESULT ' + json.dumps(res), flush=True)
kv.close()
"""

MXNET = """
import json, statistics, sys, time
import numpy as np
import mxnet as mx  # scheduler and server roles run here and exit

cfg = json.loads(sys.argv[1])
kv = mx.kv.create('dist_sync')
if cfg['compression']:
    kv.set_gradient_compression(cfg['compression'])
rng = np.random.default_rng(kv.rank)
res = {}
for j, n in enumerate(cfg['sizes']):
    kv.init(j, mx.nd.zeros(n))
    a, out = mx.nd.array(rng.standard_normal(n).astype(np.float32)), mx.nd.zeros(n)
    iters, warm = cfg['iters'][str(n)], cfg['warmup']
    times = []
    for i in range(iters + warm):
        if i == warm:
            kv._barrier()
        t = time.perf_counter()
        kv.push(j, a)
        kv.pull(j, out=out)
        out.wait_to_read()
        times.append(time.perf_counter() - t)
    assert np.isfinite(out.asnumpy()).all()
    res['push+pull/%d' % n] = statistics.median(times[warm:]) * 1e3
print('RESULT ' + json.dumps(res), flush=True)
"""

RESULT = re.compile(r"^\[worker (\d+)\] RESULT (.*)$", re.M)


def launch(
    system: str,
    python: str,
    workers: int,
    servers: int,
    sizes: list[int],
    compression: dict | None,
    tmp: Path,
) -> dict[str, float]:
    """One job through ``launchkit launch --launcher local``; the workers' results, averaged."""
    script = tmp / f"{system}_kv.py"
    script.write_text(OURS if system == "ours" else MXNET)
    cfg = {
        "sizes": sizes,
        "iters": {str(n): ITERS.get(n, 20) for n in sizes},
        "warmup": WARMUP,
        "compression": compression,
    }
    argv = [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "-n",
        str(workers),
        "-s",
        str(servers),
        "--launcher",
        "local",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "LAUNCHKIT_"))}
    env["LAUNCHKIT_HOME"] = str(tmp / "home")
    if system == "mxnet":
        argv += ["--env", "DMLC_INTERFACE:lo", "--env", "OMP_NUM_THREADS:1"]
    else:
        env["PYTHONPATH"] = str(REPO)
    argv += [python, str(script), json.dumps(cfg)]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    results = [json.loads(m.group(2)) for m in RESULT.finditer(proc.stdout)]
    if proc.returncode != 0 or len(results) != workers:
        raise RuntimeError(
            f"{system} {compression} W={workers}/S={servers} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    return mean_of_workers(results)


JOBS = [("ours", "plain"), ("ours", "2bit"), ("ours", "1bit"), ("mxnet", "plain"), ("mxnet", "2bit")]
RATIOS = [
    ("ours_2bit_vs_mxnet_2bit", "ours_2bit_ms", "mxnet_2bit_ms"),
    ("ours_1bit_vs_mxnet_2bit", "ours_1bit_ms", "mxnet_2bit_ms"),
    ("ours_2bit_vs_ours_plain", "ours_2bit_ms", "ours_plain_ms"),
    ("ours_1bit_vs_ours_plain", "ours_1bit_ms", "ours_plain_ms"),
    ("mxnet_2bit_vs_mxnet_plain", "mxnet_2bit_ms", "mxnet_plain_ms"),
]


def measure(args: argparse.Namespace) -> list[dict]:
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    mx_py = None if args.skip_mxnet else mxnet_python()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lk-ckv-") as d:
        tmp = Path(d)
        for conf in args.configs.split(","):
            w, s = (int(x) for x in conf.lower().split("x"))
            runs: dict[tuple[str, str], list[dict[str, float]]] = {}
            for rep in range(args.repeat):
                for system, comp in JOBS:
                    if system == "mxnet" and mx_py is None:
                        continue
                    python = sys.executable if system == "ours" else str(mx_py)
                    res = launch(system, python, w, s, sizes, COMPRESSIONS[comp], tmp)
                    runs.setdefault((system, comp), []).append(res)
                    print(f"W={w}/S={s} {system} {comp} (run {rep + 1}): {res}", file=sys.stderr, flush=True)
            med = {job: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for job, rs in runs.items()}
            for n in sizes:
                row: dict = {"config": f"W={w}/S={s}", "n": n, "repeat": args.repeat}
                for system, comp in JOBS:
                    res = med.get((system, comp))
                    row[f"{system}_{comp}_ms"] = res[f"push+pull/{n}"] if res else None
                    if system == "ours":
                        row[f"ours_{comp}_bytes"] = res[f"bytes/{n}"] if res else None
                for name, a, b in RATIOS:
                    row[name] = row[a] / row[b] if row[a] and row[b] else None
                rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    out = [
        "| config | N float32 | ours plain ms | ours 2bit ms | ours 1bit ms | MXNet plain ms | MXNet 2bit ms "
        "| ours 2bit / MXNet 2bit | ours 1bit / MXNet 2bit | ours 2bit / ours plain | ours 1bit / ours plain "
        "| MXNet 2bit / MXNet plain | ours bytes per round trip (plain / 2bit / 1bit) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['config']} | {r['n']:.0e} | {fmt(r['ours_plain_ms'], '.2f')} | {fmt(r['ours_2bit_ms'], '.2f')} "
            f"| {fmt(r['ours_1bit_ms'], '.2f')} | {fmt(r['mxnet_plain_ms'], '.2f')} | {fmt(r['mxnet_2bit_ms'], '.2f')} "
            f"| {fmt(r['ours_2bit_vs_mxnet_2bit'], '.2f')} | {fmt(r['ours_1bit_vs_mxnet_2bit'], '.2f')} "
            f"| {fmt(r['ours_2bit_vs_ours_plain'], '.2f')} | {fmt(r['ours_1bit_vs_ours_plain'], '.2f')} "
            f"| {fmt(r['mxnet_2bit_vs_mxnet_plain'], '.2f')} "
            f"| {fmt(r['ours_plain_bytes'], '.0f')} / {fmt(r['ours_2bit_bytes'], '.0f')} / {fmt(r['ours_1bit_bytes'], '.0f')} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="2x2,4x2", help="WxS list")
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--repeat", type=int, default=1, help="run every job this many times; median per cell")
    ap.add_argument("--skip-mxnet", action="store_true")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = measure(args)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
