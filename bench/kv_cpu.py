"""CPU per KV round trip, summed over every process of the job: a figure the machine's load barely moves.

    python -m bench.kv_cpu [--sizes 1e5] [--rounds 2000] [--workers 2] [--servers 2]
                           [--trees DIR,DIR] [--repeat R] [--lean]

The job of ``bench.kv`` (scheduler, servers and workers as separate processes on this host,
authentication on, the same-host shared-memory path): each worker runs ``push(N float32)`` then
``pull`` of the sum, ``--rounds`` times after a warm-up and a barrier. Worker 0 reads the CPU time
of every process of the job (``/proc/PID/task/*/schedstat``: nanoseconds on a CPU, every thread)
after that barrier and again after a barrier that ends the loop; the difference, divided by the
rounds, is the CPU one round trip costs the whole job (each of the W workers' push+pull, the
servers' serving, the scheduler's share), shown by role beside the median wall time of a round.

On a machine shared with other jobs a round's wall time moves with the load (the job waits for
cores); its CPU does not, or much less (cache misses grow a little when the other jobs evict the
job's data). ``--trees OLD,NEW`` runs the same job on two source trees (each put first on ``sys.path``), alternated ``--repeat`` times, and gives each run's figures and the median of the
per-pair ratios NEW/OLD [min-max]. ``--lean`` replaces the workers' timed loop by a lean one (the
least a worker must do per round over today's servers: an experiment that sizes what the KV
calls' own code costs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kv import REPO, run_job

PIDFILE = """
import os, sys
sys.path.insert(0, os.environ['BENCH_TREE'])  # (before the working directory, which ``-c`` puts first)
with open(os.path.join(os.environ['BENCH_DIR'], 'pid-%s-%s' % (os.environ['DMLC_ROLE'],
          os.environ['LAUNCHKIT_ROLE_RANK'])), 'w') as f:
    f.write(str(os.getpid()))
"""

#: a worker's start: the store, key 'k' of BENCH_N float32 values, 50 rounds of push and pull,
#: a barrier (then ``kv``, ``n``, ``rounds``, ``a`` and ``out`` for the timed rounds)
WARMED = """
kv = kvmod.create('dist_sync')
n, rounds = int(os.environ['BENCH_N']), int(os.environ['BENCH_ROUNDS'])
kv.init('k', np.zeros(n, np.float32))
a, out = np.ones(n, np.float32), np.empty(n, np.float32)
for _ in range(50):
    kv.push('k', a)
    kv.pull('k', out)
kv.barrier()
"""

WORKER = (
    PIDFILE
    + """
import glob, json, statistics, time
import numpy as np
from trainer_core import kv as kvmod

def cpu_ns(pid):
    total = 0
    for path in glob.glob('/proc/%d/task/*/schedstat' % pid):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # (a thread that ended meanwhile)
    return total

def sample():
    out = {}
    for path in glob.glob(os.path.join(os.environ['BENCH_DIR'], 'pid-*')):
        with open(path) as f:
            out[os.path.basename(path)[4:]] = cpu_ns(int(f.read()))
    return out

"""
    + WARMED
    + """first = sample() if kv.rank == 0 else None
times, pc = [], time.perf_counter
if os.environ.get('BENCH_LEAN'):  # (``--lean``: see ``LEAN_DOC``)
    import select, struct
    from trainer_core.ps import protocol
    from trainer_core.transport import wire
    client = kv.client
    m = kv.meta['k']
    (part,) = m.parts
    segment = m.segments[0].view(m.dtype, part.size)
    channel = client.routes[part.server].fast
    sock, decoder, length = channel.sock, channel.headers, struct.Struct('<I')
    entries = (protocol.Entry('k', 0, part.size, m.dtype.str, m.segments[0].name),)
    src, body = client.book.name, {'rank': client.worker_id}
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    for _ in range(rounds):
        t = pc()
        np.copyto(segment, a)
        raw = wire.encode(protocol.Header(protocol.PUSHPULL, client.requests.next(), src, entries, body))
        sock.sendall(length.pack(len(raw)) + raw)
        poll.poll()
        reply = decoder.decode(sock.recv(65536)[length.size:])
        np.copyto(out, client.shared_view(part.server, reply.entries[0].shm, m.dtype, part.size))
        times.append(pc() - t)
else:
    for _ in range(rounds):
        t = pc()
        kv.push('k', a)
        kv.pull('k', out)
        times.append(pc() - t)
kv.barrier()
res = {'wall_us': statistics.median(times) * 1e6}
if first is not None:
    last = sample()
    res['cpu'] = {k: (last[k] - first[k]) / rounds / 1e3 for k in first if k in last}
assert out[0] == kv.num_workers, out[0]
print('RESULT ' + json.dumps(res), flush=True)
kv.close()
"""
)

ROLE = PIDFILE + "import trainer_core\n"

#: ``--lean`` (``BENCH_LEAN=1`` in the workers): their timed loop on the least a worker must do
#: over today's servers (an experiment, not an API: it reaches into the client): the push's copy
#: into its segment, one ``pushpull`` header encoded and written on the same-host channel, a
#: ``poll`` of that channel alone, the reply read and decoded, the sum copied out of the server's
#: buffer. No error replies, stall warnings, figures or held pushes: what the KV calls' own code
#: costs is the difference with the plain loop. One key part, on a server of this host.
LEAN_DOC = "the workers' timed loop on the least a worker must do over today's servers"


def run(tree: Path, n: int, rounds: int, workers: int, servers: int, lean: bool = False) -> dict[str, float]:
    """One job on ``tree``: CPU per round trip (µs) by role and in all, and the median wall time
    (``lean``: the workers' timed loop is the lean one, ``LEAN_DOC``)."""
    with tempfile.TemporaryDirectory(prefix="kv-cpu-") as tmp:
        env = {
            "LAUNCHKIT_JOB_ID": "kvcpu" + uuid.uuid4().hex[:6],
            "LAUNCHKIT_JOB_SECRET": uuid.uuid4().hex,
            "BENCH_N": str(n),
            "BENCH_ROUNDS": str(rounds),
            "BENCH_DIR": tmp,
            "PYTHONPATH": str(tree),
            "BENCH_TREE": str(tree),
        }
        if lean:
            env["BENCH_LEAN"] = "1"
        results = run_job(sys.executable, WORKER, ROLE, workers, servers, env)
    cpu = next(r["cpu"] for r in results if "cpu" in r)
    out = {"wall_us": statistics.mean(r["wall_us"] for r in results)}
    for role in ("worker", "server", "scheduler"):
        out[f"cpu_{role}_us"] = sum(v for k, v in cpu.items() if k.startswith(role + "-"))
    out["cpu_us"] = sum(cpu.values())
    return out


COLUMNS = [
    ("cpu_us", "CPU per round, all processes µs"),
    ("cpu_worker_us", "workers µs"),
    ("cpu_server_us", "servers µs"),
    ("cpu_scheduler_us", "scheduler µs"),
    ("wall_us", "round trip µs (median)"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e5")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--trees", default=str(REPO), help="comma-separated source trees, alternated")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--lean", action="store_true", help=LEAN_DOC)
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(f"W={args.workers}/S={args.servers}, {args.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    print("| N | tree | run | " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for n in sizes:
        runs: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
        for r in range(args.repeat):
            for tree in trees:
                res = run(tree, n, args.rounds, args.workers, args.servers, args.lean)
                runs[tree].append(res)
                cells = " | ".join(f"{res[k]:.0f}" for k, _ in COLUMNS)
                print(f"| {n:.0e} | {tree.name} | {r + 1} | {cells} |", flush=True)
        if len(trees) == 2:
            old, new = runs[trees[0]], runs[trees[1]]
            for key, title in (("cpu_us", "CPU"), ("wall_us", "wall")):
                ratios = sorted(b[key] / a[key] for a, b in zip(old, new, strict=True))
                print(
                    f"_{n:.0e} {title} {trees[1].name}/{trees[0].name}: {statistics.median(ratios):.2f} "
                    f"[{ratios[0]:.2f}-{ratios[-1]:.2f}]_"
                )
    print(f"_(load average at the end {os.getloadavg()[0]:.1f})_")


if __name__ == "__main__":
    main()
