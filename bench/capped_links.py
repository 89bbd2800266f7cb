"""Compressed training over capped links: 32-bit vs 1-bit vs 2-bit steps of a 12.6M-parameter MLP.

Usage (root): ``python bench/capped_links.py [--bits 32,1,2] [--steps 15] [--rate 1gbit] [--json OUT]``

The capped-links end-to-end target: 2 workers and 1 server on three network-namespace
hosts, every veth capped at 1 Gbit/s in both directions, an MLP 1024-3072-3072-10 (12.6M
parameters), batch 64: a training step at 1 bit at least 3x faster than at 32 bits (5x stretch).

* Hosts: ``tests.cluster.netns.HostGroup.create(3)`` (the test fixtures' builder: a bridge at
  10.231.0.1, hosts 10.231.0.11-13, each with its own sshd, PID and mount namespaces; see
  docs/testing.md). Every veth pair gets ``tc qdisc add dev VETH root tbf rate RATE burst BURST
  latency LATENCY`` on both ends (the root-side end caps traffic into the host, the host's
  ``eth0`` traffic out of it). A stdlib TCP stream between two hosts checks the cap, both ways.
* Job: ``launchkit launch -H HOSTFILE -i KEY --known-hosts KH --sync-dst-dir /srv/job -n 2 -s 1
  PYTHON capped_step.py CFG`` from a temporary directory that holds the script and copies of the
  ``trainer_core`` and ``launchkit`` packages (the hosts' /root, /tmp and /srv are private, so the
  repo is synced, not shared). The server lands on host 1, the workers on hosts 2 and 3 (MXNet's
  placement), the scheduler on the launcher's side of the bridge. PYTHON is Debian's
  ``/usr/bin/python3`` when numpy, pyzmq and numba import there, else a venv made from it under
  /var/tmp (visible to the hosts) with those three installed (numba: the compiled compression
  kernels). BLAS runs one thread per process (the three hosts share this machine's cores).
* Step: each worker draws random batches of 64 (inputs standard normal, random labels),
  ``MLP([1024, 3072, 3072, 10])``, ``loss_and_grads`` then ``learner.update`` of a
  ``data_parallel_distributed_learner(momentum learner, num_quantization_bits=BITS)`` (one
  ``pushpull`` of every gradient per step; 1 and 2 bits compress pushes and pulls). After warm-up
  steps and a barrier, the median step time (and of the exchange alone) over the timed steps,
  averaged over the two workers; bytes per step per worker as the KV store counts the payloads
  (``wire_stats``) and as the worker's ``eth0`` counts them (``/proc/net/dev``, both directions,
  TCP/IP headers included). One job per bit width; everything is torn down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.cluster.netns import HostGroup  # noqa: E402

VENV = Path(os.environ.get("LAUNCHKIT_BENCH_SYS_VENV", "/var/tmp/launchkit-bench-sys-venv"))
SYNC_DIR = "/srv/job"
SIZES = [1024, 3072, 3072, 10]
NEEDS = "import numpy, zmq, numba"

STEP = """
import json, statistics, sys, time
import numpy as np
import trainer_core  # noqa: F401  (the scheduler and server roles run here and exit)
from trainer_core import kv as kvmod
from trainer_core.train.learners import data_parallel_distributed_learner
from trainer_core.train.nn import MLP
from trainer_core.optim.local import get_learner


def link_bytes(dev='eth0'):
    for line in open('/proc/net/dev'):
        name, _, rest = line.partition(':')
        if name.strip() == dev:
            f = rest.split()
            return int(f[0]) + int(f[8])  # received + transmitted bytes
    return 0


cfg = json.loads(sys.argv[1])
kv = kvmod.create('dist_sync')
model = MLP(cfg['sizes'], seed=0)
local = get_learner('momentum', model.params, lr=cfg['lr'], momentum=0.9)
learner = data_parallel_distributed_learner(
    local, num_quantization_bits=cfg['bits'], kv=kv, threshold=cfg['threshold'])
rng = np.random.default_rng(1 + kv.rank)
batches = [(rng.standard_normal((cfg['batch'], cfg['sizes'][0])).astype(np.float32),
            rng.integers(0, cfg['sizes'][-1], cfg['batch'])) for _ in range(8)]
steps, comm, losses = [], [], []
for i in range(cfg['warmup'] + cfg['steps']):
    if i == cfg['warmup']:
        kv.barrier()
        stats0, link0 = kv.wire_stats(), link_bytes()
    x, y = batches[i % len(batches)]
    t0 = time.perf_counter()
    loss, grads = model.loss_and_grads(x, y)
    t1 = time.perf_counter()
    learner.update(grads, len(y))
    t2 = time.perf_counter()
    steps.append(t2 - t0)
    comm.append(t2 - t1)
    losses.append(loss)
stats1, link1 = kv.wire_stats(), link_bytes()
n, w = cfg['steps'], cfg['warmup']
res = {
    'step_ms': statistics.median(steps[w:]) * 1e3,
    'exchange_ms': statistics.median(comm[w:]) * 1e3,
    'compute_ms': statistics.median(s - c for s, c in zip(steps[w:], comm[w:])) * 1e3,
    'payload_bytes': (stats1['sent'] + stats1['received'] - stats0['sent'] - stats0['received']) / n,
    'raw_bytes': (stats1['raw_sent'] + stats1['raw_received'] - stats0['raw_sent'] - stats0['raw_received']) / n,
    'link_bytes': (link1 - link0) / n,
    'loss_first': losses[0], 'loss_last': losses[-1],
    'params': model.num_parameters(),
}
print('RESULT ' + json.dumps(res), flush=True)
kv.barrier()
kv.close()
"""

RECV = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print('ready', flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t = None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    if t is None:
        t = time.perf_counter()
    n += k
print(n, time.perf_counter() - t, flush=True)
"""

SEND = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
buf = b'x' * (1 << 20)
for _ in range(int(sys.argv[3])):
    c.sendall(buf)
c.close()
"""


def system_python() -> str:
    """A python3 the hosts can run with numpy, pyzmq and numba: Debian's, or a venv made from it."""
    if subprocess.run(["/usr/bin/python3", "-c", NEEDS], capture_output=True).returncode == 0:
        return "/usr/bin/python3"
    py = VENV / "bin" / "python"
    if subprocess.run([str(py), "-c", NEEDS], capture_output=True).returncode != 0:
        print(f"creating {VENV} (/usr/bin/python3; pip install numpy pyzmq numba) ...", file=sys.stderr)
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "numpy", "pyzmq", "numba"], check=True)
        subprocess.run([str(py), "-c", NEEDS], check=True)
    return str(py)


def job_dir(root: Path) -> Path:
    """The directory synced to the hosts: the step script and copies of the two packages."""
    d = root / "job"
    d.mkdir()
    for pkg in ("trainer_core", "dmlc_env", "launchkit"):
        shutil.copytree(REPO / pkg, d / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (d / "capped_step.py").write_text(STEP)
    return d


def cap(group: HostGroup, rate: str, burst: str, latency: str) -> list[str]:
    """tbf on both ends of every host's veth pair; returns the commands run."""
    tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
    done = []
    for h in group:
        for argv in (
            ["tc", "qdisc", "add", "dev", h.veth, *tbf],
            ["ip", "netns", "exec", h.netns, "tc", "qdisc", "add", "dev", "eth0", *tbf],
        ):
            subprocess.run(argv, check=True, capture_output=True)
            done.append(" ".join(argv))
    return done


def stream_gbps(group: HostGroup, src: int, dst: int, mbytes: int = 100, port: int = 5201) -> float:
    """One TCP stream from host ``src`` to host ``dst`` (indexes), Gbit/s as the receiver sees it."""
    a, b = group[dst], group[src]
    recv = subprocess.Popen(
        ["ip", "netns", "exec", a.netns, "/usr/bin/python3", "-c", RECV, a.address, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert recv.stdout is not None
    try:
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError("stream receiver did not start")
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                b.netns,
                "/usr/bin/python3",
                "-c",
                SEND,
                a.address,
                str(port),
                str(mbytes),
            ],
            check=True,
            timeout=120,
        )
        n, secs = recv.stdout.readline().split()
        recv.wait(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return int(n) * 8 / float(secs) / 1e9


RESULT = re.compile(r"^\[worker (\d+)\] RESULT (.*)$", re.M)


def launch(group: HostGroup, hostfile: Path, jobdir: Path, python: str, cfg: dict, home: str) -> dict:
    argv = [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "-H",
        str(hostfile),
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
        "--sync-dst-dir",
        SYNC_DIR,
        "-n",
        "2",
        "-s",
        "1",
        "--env",
        "OMP_NUM_THREADS:1",
        "--env",
        "OPENBLAS_NUM_THREADS:1",
        "--env",
        "MKL_NUM_THREADS:1",
        python,
        "capped_step.py",
        json.dumps(cfg),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "LAUNCHKIT_", "PYTHON"))}
    env["LAUNCHKIT_HOME"] = home
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=jobdir, env=env, capture_output=True, text=True, timeout=900, check=False)
    results = [json.loads(m.group(2)) for m in RESULT.finditer(proc.stdout)]
    if proc.returncode != 0 or len(results) != 2:
        raise RuntimeError(
            f"{cfg['bits']}-bit job failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    out = {k: statistics.mean(r[k] for r in results) for k in results[0]}
    out["job_s"] = time.monotonic() - t0
    return out


def measure(args: argparse.Namespace) -> dict:
    python = system_python()
    bits = [int(b) for b in args.bits.split(",")]
    info: dict = {"python": python, "rate": args.rate, "burst": args.burst, "latency": args.latency}
    rows = []
    with tempfile.TemporaryDirectory(prefix="lk-capped-") as d:
        root = Path(d)
        jobdir = job_dir(root)
        (root / "home").mkdir()
        group = HostGroup.create(3)
        try:
            hostfile = group.write_hostfile(root / "hosts")
            if args.rate != "none":
                info["tc"] = cap(group, args.rate, args.burst, args.latency)
            info["stream_gbps"] = {
                "node2->node1": stream_gbps(group, 1, 0),
                "node1->node2": stream_gbps(group, 0, 1),
            }
            print(f"link check: {info['stream_gbps']}", file=sys.stderr, flush=True)
            for b in bits:
                cfg = {
                    "sizes": SIZES,
                    "bits": b,
                    "batch": args.batch,
                    "lr": args.lr,
                    "threshold": args.threshold,
                    "warmup": args.warmup,
                    "steps": args.steps,
                }
                res = launch(group, hostfile, jobdir, python, cfg, str(root / "home"))
                res["bits"] = b
                rows.append(res)
                print(f"{b}-bit: {res}", file=sys.stderr, flush=True)
        finally:
            group.close()
    base = next((r for r in rows if r["bits"] == 32), None)
    for r in rows:
        r["speedup"] = base["step_ms"] / r["step_ms"] if base else None
        r["payload_reduction"] = base["payload_bytes"] / r["payload_bytes"] if base else None
    info["rows"] = rows
    return info


def table(info: dict) -> str:
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    out = [
        "| gradients | step ms (median) | of which exchange ms | compute ms | speedup vs 32-bit "
        "| payload bytes per step per worker (KV store) | eth0 bytes per step per worker (both ways) | loss first / last |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in info["rows"]:
        label = "32-bit" if r["bits"] == 32 else f"{r['bits']}-bit"
        out.append(
            f"| {label} | {r['step_ms']:.1f} | {r['exchange_ms']:.1f} | {r['compute_ms']:.1f} "
            f"| {fmt(r['speedup'], '.2f')}x | {r['payload_bytes']:.0f} | {r['link_bytes']:.0f} "
            f"| {r['loss_first']:.3f} / {r['loss_last']:.3f} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bits", default="32,1,2", help="num_quantization_bits, one job each")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per job")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--threshold", type=float, default=0.5, help="2-bit threshold")
    ap.add_argument("--rate", default="1gbit", help="tbf rate on every veth end ('none': uncapped)")
    ap.add_argument("--burst", default="256kb")
    ap.add_argument("--latency", default="50ms")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, tc)")
    info = measure(args)
    streams = ", ".join(f"{k} {v:.2f} Gbit/s" for k, v in info["stream_gbps"].items())
    print(f"rate {info['rate']} on every veth end; one TCP stream: {streams}; python {info['python']}")
    print(table(info))
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
