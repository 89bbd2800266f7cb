"""KV-store round-trip benchmark: trainer_core vs MXNet 1.9.1 dist_sync vs raw pyzmq (loopback).

Usage: ``python bench/kv.py [--configs 2x2,4x2] [--sizes 1e3,1e5,1e6,1e7] [--skip-mxnet] [--skip-zmq] [--netns] [--repeat R]``

``--netns`` (root) runs servers and workers on three network-namespace hosts instead of loopback
(10.231.0.11-13 on a bridge, placed as MXNet's launcher places them: server i on host i, then the
workers round-robin), the across-hosts measurement of the issue.

For each configuration (W workers x S servers, all on this host) it starts one job per system and
times, per worker, ``push(N float32)`` followed by ``pull`` of the summed value (the round trip),
median over iterations, averaged over workers. trainer_core runs with authentication on (CURVE,
keys from LAUNCHKIT_JOB_SECRET) and its same-host shared-memory path; its ``pushpull`` (one
message) is shown too. MXNet runs from its own venv (``bench/peers.py``, created on first
use with ``pip install mxnet==1.9.1 'numpy<1.24'``) with DMLC_INTERFACE=lo and
DMLC_NODE_HOST=127.0.0.1. The raw column is one pyzmq PUSH/PULL stream over tcp://127.0.0.1
moving the same bytes (2 x 4N per round trip) with ``copy=False``: the socket ceiling.
``--repeat R`` runs both jobs of a configuration R times, alternating trainer_core and MXNet (so
slow phases of a shared machine fall on both), and reports each system's median time, the median
of the R per-run ratios and their range. Benchmarks are not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.peers import mxnet_python

REPO = Path(__file__).resolve().parents[1]

ITERS = {1_000: 300, 100_000: 100, 1_000_000: 30, 10_000_000: 8}

OURS = """
import json, os, time
import numpy as np
from trainer_core import kv as kvmod
kv = kvmod.create('dist_sync')
sizes = json.loads(os.environ['BENCH_SIZES'])
iters = json.loads(os.environ['BENCH_ITERS'])
res = {}
for n in sizes:
    key = 'k%d' % n
    kv.init(key, np.zeros(n, np.float32))
    a, out = np.ones(n, np.float32), np.empty(n, np.float32)
    for mode in ('push+pull', 'pushpull'):
        times = []
        for i in range(iters[str(n)] + 3):
            kv.barrier() if i == 3 else None
            t = time.perf_counter()
            if mode == 'pushpull':
                kv.pushpull(key, a, out)
            else:
                kv.push(key, a)
                kv.pull(key, out)
            times.append(time.perf_counter() - t)
        assert out[0] == kv.num_workers, out[0]
        res['%s/%d' % (mode, n)] = statistics.median(times[3:]) * 1e3
print('RESULT ' + json.dumps(res), flush=True)
kv.close()
""".replace("import numpy as np\n", "import numpy as np, statistics\n", 1)

MXNET = """
import json, os, time, statistics
import mxnet as mx
kv = mx.kv.create('dist_sync')
sizes = json.loads(os.environ['BENCH_SIZES'])
iters = json.loads(os.environ['BENCH_ITERS'])
res = {}
for j, n in enumerate(sizes):
    kv.init(j, mx.nd.zeros(n))
    a, out = mx.nd.ones(n), mx.nd.zeros(n)
    times = []
    for i in range(iters[str(n)] + 3):
        if i == 3:
            kv._barrier()
        t = time.perf_counter()
        kv.push(j, a)
        kv.pull(j, out=out)
        out.wait_to_read()
        times.append(time.perf_counter() - t)
    res['value/%d' % n] = float(out.asnumpy()[0])
    res['push+pull/%d' % n] = statistics.median(times[3:]) * 1e3
print('RESULT ' + json.dumps(res), flush=True)
"""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


NETNS_HOSTS = 3
NETNS_ROOT = "10.231.0.1"


_CLUSTER: list[Any] = []  # the HostGroup while --netns runs


def netns_up() -> None:
    """Three hosts in network namespaces on a bridge (10.231.0.11-13): the test fixtures' own
    builder (tests/cluster/netns.py), which holds the machine-wide cluster lock."""
    from tests.cluster.netns import HostGroup

    _CLUSTER.append(HostGroup.create(NETNS_HOSTS))


def netns_down() -> None:
    while _CLUSTER:
        _CLUSTER.pop().close()


def run_job(
    python: str,
    worker_code: str,
    role_code: str,
    workers: int,
    servers: int,
    env_extra: dict[str, str],
    netns: bool = False,
) -> list[dict[str, float]]:
    """Start scheduler, servers and workers; return each worker's RESULT dict. With ``netns`` the
    servers and workers are placed on three namespace hosts as MXNet's launcher places them
    (server i on host i, then workers round-robin), the scheduler on the bridge."""
    port = free_port("0.0.0.0" if netns else "127.0.0.1")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "LAUNCHKIT_"))}
    base.update(
        {
            "DMLC_PS_ROOT_URI": NETNS_ROOT if netns else "127.0.0.1",
            "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(servers),
            "DMLC_NUM_WORKER": str(workers),
            "DMLC_NODE_HOST": "127.0.0.1",
            "DMLC_INTERFACE": "lo",
            "PYTHONPATH": str(REPO),
            **env_extra,
        }
    )
    roles = (
        [("scheduler", 0)] + [("server", i) for i in range(servers)] + [("worker", i) for i in range(workers)]
    )
    procs, logs = [], []
    tmp = Path(tempfile.mkdtemp(prefix="lk-bench-"))
    try:
        for task, (role, rank) in enumerate(roles):
            env = dict(base, DMLC_ROLE=role, DMLC_TASK_ID=str(task), LAUNCHKIT_ROLE_RANK=str(rank))
            prefix: list[str] = []
            if netns:
                group = _CLUSTER[-1]
                if role == "scheduler":
                    env.update(DMLC_NODE_HOST=NETNS_ROOT, DMLC_INTERFACE=group.bridge)
                else:
                    host = group[(task - 1) % NETNS_HOSTS]
                    env.update(DMLC_NODE_HOST=host.address, DMLC_INTERFACE="eth0")
                    prefix = ["ip", "netns", "exec", host.netns]
            log = tmp / f"{role}{rank}.log"
            logs.append(log)
            with open(log, "wb") as out:
                code = worker_code if role == "worker" else role_code
                procs.append(
                    subprocess.Popen(
                        [*prefix, python, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT
                    )
                )
        for p in procs:
            p.wait(timeout=900)
        results = []
        for (role, _), log in zip(roles, logs, strict=True):
            for line in log.read_text(errors="replace").splitlines():
                if role == "worker" and line.startswith("RESULT "):
                    results.append(json.loads(line[7:]))
        if len(results) != workers:
            raise RuntimeError(
                "a worker failed:\n" + "\n".join(log.read_text(errors="replace")[-2000:] for log in logs)
            )
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def mean_of_workers(results: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.mean(r[k] for r in results) for k in results[0]}


def ours(workers: int, servers: int, sizes: list[int], netns: bool = False) -> dict[str, float]:
    env = {
        "LAUNCHKIT_JOB_ID": "bench" + uuid.uuid4().hex[:6],
        "LAUNCHKIT_JOB_SECRET": uuid.uuid4().hex,
        "BENCH_SIZES": json.dumps(sizes),
        "BENCH_ITERS": json.dumps({str(n): ITERS.get(n, 20) for n in sizes}),
    }
    return mean_of_workers(run_job(sys.executable, OURS, "import trainer_core", workers, servers, env, netns))


def mxnet(workers: int, servers: int, sizes: list[int], netns: bool = False) -> dict[str, float]:
    env = {
        "BENCH_SIZES": json.dumps(sizes),
        "BENCH_ITERS": json.dumps({str(n): ITERS.get(n, 20) for n in sizes}),
        "OMP_NUM_THREADS": "1",
    }
    return mean_of_workers(run_job(mxnet_python(), MXNET, "import mxnet", workers, servers, env, netns))


def raw_zmq_gbps(nbytes: int, repeats: int) -> float:
    """One PUSH/PULL stream over loopback TCP, zero-copy sends: GB/s."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    buf = np.ones(nbytes // 4, np.float32)
    elapsed: list[float] = []

    def receiver() -> None:
        pull.recv(copy=False)
        t = time.perf_counter()
        for _ in range(repeats):
            pull.recv(copy=False)
        elapsed.append(time.perf_counter() - t)

    th = threading.Thread(target=receiver)
    th.start()
    for _ in range(repeats + 1):
        push.send(buf, copy=False)
    th.join()
    push.close(linger=0)
    pull.close(linger=0)
    ctx.term()
    return nbytes * repeats / elapsed[0] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="2x2,4x2", help="WxS list")
    ap.add_argument("--sizes", default="1e3,1e5,1e6,1e7")
    ap.add_argument("--skip-mxnet", action="store_true")
    ap.add_argument("--skip-zmq", action="store_true")
    ap.add_argument("--json", help="also write the raw numbers here")
    ap.add_argument(
        "--repeat", type=int, default=1, help="alternate the two jobs this many times; medians per cell"
    )
    ap.add_argument(
        "--netns", action="store_true", help="across hosts: three network-namespace hosts (root; CLUSTER.md)"
    )
    args = ap.parse_args()
    if args.netns:
        netns_up()
        try:
            report(args)
        finally:
            netns_down()
    else:
        report(args)


def report(args: argparse.Namespace) -> None:
    """Run every configuration and print the table."""
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    rows = []
    for conf in args.configs.split(","):
        w, s = (int(x) for x in conf.lower().split("x"))
        mine_runs: list[dict[str, float]] = []
        theirs_runs: list[dict[str, float]] = []
        for _ in range(max(1, args.repeat)):
            mine_runs.append(ours(w, s, sizes, args.netns))
            theirs_runs.append({} if args.skip_mxnet else mxnet(w, s, sizes, args.netns))
        for n in sizes:
            rts = [m[f"push+pull/{n}"] for m in mine_runs]
            pps = [m[f"pushpull/{n}"] for m in mine_runs]
            mxs = [t[f"push+pull/{n}"] for t in theirs_runs if f"push+pull/{n}" in t]
            rt, pp = statistics.median(rts), statistics.median(pps)
            mx_rt = statistics.median(mxs) if mxs else None
            ratios = [a / b for a, b in zip(rts, mxs, strict=True)] if mxs else []
            ratios_pp = [a / b for a, b in zip(pps, mxs, strict=True)] if mxs else []
            raw = (
                None
                if args.skip_zmq
                else raw_zmq_gbps(4 * n, max(3, min(200, 4_000_000_000 // (4 * n * 100))))
            )
            rows.append(
                {
                    "config": f"W={w}/S={s}" + (" 3 hosts" if args.netns else ""),
                    "n": n,
                    "ours_ms": rt,
                    "ours_pushpull_ms": pp,
                    "mxnet_ms": mx_rt,
                    "ratio": statistics.median(ratios) if ratios else None,
                    "ratio_pushpull": statistics.median(ratios_pp) if ratios_pp else None,
                    "ratio_range": [min(ratios), max(ratios)] if ratios else None,
                    "ratio_pushpull_range": [min(ratios_pp), max(ratios_pp)] if ratios_pp else None,
                    "repeat": len(rts),
                    "ours_gbps": 2 * 4 * n / rt / 1e6,
                    "raw_zmq_gbps": raw,
                    "raw_zmq_ms": 2 * 4 * n / raw / 1e6 if raw else None,
                }
            )
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    rng = lambda r: "" if args.repeat <= 1 or r is None else f" [{r[0]:.2f}-{r[1]:.2f}]"  # noqa: E731
    names = ["config", "N float32", "trainer_core push+pull ms", "trainer_core pushpull ms", "MXNet 1.9.1 ms"]
    names += ["ratio push+pull", "ratio pushpull"]
    if args.repeat > 1:
        print(f"# medians of {args.repeat} alternating runs; ratio = median of the per-run ratios [min-max]")
    else:  # one run: its throughput and the socket ceiling beside it
        names += ["trainer_core GB/s per worker", "raw pyzmq GB/s (ms for the same bytes)"]
    print("| " + " | ".join(names) + " |")
    print("|" + "---|" * len(names))
    for r in rows:
        cells = [r["config"], f"{r['n']:.0e}", fmt(r["ours_ms"], ".3f"), fmt(r["ours_pushpull_ms"], ".3f")]
        cells += [fmt(r["mxnet_ms"], ".3f"), fmt(r["ratio"], ".2f") + rng(r["ratio_range"])]
        cells += [fmt(r["ratio_pushpull"], ".2f") + rng(r["ratio_pushpull_range"])]
        if args.repeat <= 1:
            cells += [
                fmt(r["ours_gbps"], ".2f"),
                f"{fmt(r['raw_zmq_gbps'], '.2f')} ({fmt(r['raw_zmq_ms'], '.3f')})",
            ]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
