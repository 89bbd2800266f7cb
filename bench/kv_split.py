"""Where a KV round trip's CPU goes, by process and by step: the job of ``bench.kv_cpu`` with the
thread CPU time of a few calls summed in each process.

    python -m bench.kv_split [--sizes 1e3,1e5] [--rounds 2000] [--tree DIR]

The job of ``bench.kv`` (W=2/S=2 on one host, authentication on, the same-host shared-memory
path; the key on one server): each worker runs ``push(N float32)`` then ``pull`` of the sum,
``--rounds`` times after a warm-up. In each worker and in the server that holds the key,
``time.thread_time_ns`` is taken around these calls and summed (about 1 µs per call for the
wrappers, so the figures are a little above ``bench.kv_cpu``'s):

- worker: **copy in** (``DistKVStore._pack_part``: the push's values into the worker's segment),
  **send** (``UnixChannel.send``: header encoded and written, the server woken), **wait**
  (``Poller._wait``: asleep until the reply, and woken), **copy out** (``Results.put``: the sum out
  of the server's buffer), **the rest** (every other line of the two calls), **main thread**;
- server: **wait** (``Poller._wait``), **sum** (``Store._sum_in``), **replies**
  (``RequestHandler._reply_shared``: built, encoded, written, each worker woken), **the rest of
  the handler**, **the rest of the loop** (reading, decoding, the serving loop), **main thread**.

Each figure is µs per round (a worker's: one worker; the server's: the whole round, both
workers' requests); **polls** is the waits per round (each one sleeps unless a message is there
already). ``python -m bench.kv_floor`` gives what the copies, the sum and the wake-ups
cost alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kv import REPO, run_job
from bench.kv_cpu import WARMED

TIMED = """
import json, os, sys, time
sys.path.insert(0, os.environ['BENCH_TREE'])  # (before the working directory, which ``-c`` puts first)
if os.environ['DMLC_ROLE'] == 'server':
    os.environ['TRAINER_CORE_AUTOSTART'] = '0'
acc, calls = {}, {}

def timed(cls, name, label):
    f, clock = getattr(cls, name), time.thread_time_ns
    def wrapper(*args, **kwargs):
        t = clock()
        try:
            return f(*args, **kwargs)
        finally:
            acc[label] = acc.get(label, 0) + clock() - t
            calls[label] = calls.get(label, 0) + 1
    setattr(cls, name, wrapper)
"""

WORKER = (
    TIMED
    + """
import numpy as np
from trainer_core import kv as kvmod
from trainer_core.kv import dist, results
from trainer_core.transport import channel, unix
timed(dist.DistKVStore, '_pack_part', 'copy in')
timed(unix.UnixChannel, 'send', 'send')
timed(channel.Poller, '_wait', 'wait')
timed(results.Results, 'put', 'copy out')
"""
    + WARMED
    + """acc.clear()
calls.clear()
t = time.thread_time_ns()
for _ in range(rounds):
    kv.push('k', a)
    kv.pull('k', out)
acc['main thread'] = time.thread_time_ns() - t
acc['the rest'] = acc['main thread'] - sum(v for k, v in acc.items() if k != 'main thread')
assert out[0] == kv.num_workers, out[0]
kv.barrier()
res = {k: v / rounds / 1e3 for k, v in acc.items()}
res['polls'] = calls['wait'] / rounds
print('RESULT ' + json.dumps(res), flush=True)
kv.close()
"""
)

ROLE = (
    TIMED
    + """
if os.environ['DMLC_ROLE'] == 'server':
    from trainer_core.ps import handler, server, store
    from trainer_core.transport import channel
    timed(channel.Poller, '_wait', 'wait')
    timed(store.Store, '_sum_in', 'sum')
    timed(handler.RequestHandler, '_reply_shared', 'replies')
    timed(handler.RequestHandler, 'handle', 'handler')
    t = time.thread_time_ns()
    try:
        server.main()
    finally:
        acc['main thread'] = time.thread_time_ns() - t
        if calls.get('handler', 0) > 1000:  # the server holding the key: per round (two requests)
            rounds = calls['handler'] / int(os.environ['BENCH_WORKERS'])
            out = {k: v / rounds / 1e3 for k, v in acc.items()}
            out['polls'] = calls['wait'] / rounds
            out['the rest of the handler'] = out.pop('handler') - out['sum'] - out['replies']
            out['the rest of the loop'] = (
                out['main thread'] - out['wait'] - out['sum'] - out['replies'] - out['the rest of the handler']
            )
            with open(os.path.join(os.environ['BENCH_DIR'], 'server.json'), 'w') as f:
                json.dump(out, f)
else:
    import trainer_core
"""
)

WORKER_ROWS = ["copy in", "send", "wait", "copy out", "the rest", "main thread", "polls"]
SERVER_ROWS = [
    "wait",
    "sum",
    "replies",
    "the rest of the handler",
    "the rest of the loop",
    "main thread",
    "polls",
]


def run(tree: Path, n: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """One job: a worker's figures (the mean of the two) and the server's, µs per round."""
    with tempfile.TemporaryDirectory(prefix="kv-split-") as tmp:
        env = {
            "LAUNCHKIT_JOB_ID": "kvsplit" + uuid.uuid4().hex[:6],
            "LAUNCHKIT_JOB_SECRET": uuid.uuid4().hex,
            "BENCH_N": str(n),
            "BENCH_ROUNDS": str(rounds),
            "BENCH_DIR": tmp,
            "BENCH_WORKERS": "2",
            "PYTHONPATH": str(tree),
            "BENCH_TREE": str(tree),
        }
        results = run_job(sys.executable, WORKER, ROLE, 2, 2, env)
        with open(os.path.join(tmp, "server.json")) as f:
            server = json.load(f)
    worker = {k: sum(r[k] for r in results) / len(results) for k in WORKER_ROWS}
    return worker, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e3,1e5")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--tree", default=str(REPO))
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    tree = Path(args.tree).resolve()
    figures = {n: run(tree, n, args.rounds) for n in sizes}
    print(f"W=2/S=2, {args.rounds} rounds, µs per round; load average {os.getloadavg()[0]:.1f}")
    print("| process: step | " + " | ".join(f"{n:.0e}" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for who, rows, i in (("a worker", WORKER_ROWS, 0), ("the server", SERVER_ROWS, 1)):
        for row in rows:
            fmt = ".2f" if row == "polls" else ".0f"
            print(f"| {who}: {row} | " + " | ".join(f"{figures[n][i][row]:{fmt}}" for n in sizes) + " |")
    print(f"_(load average at the end {os.getloadavg()[0]:.1f})_")


if __name__ == "__main__":
    main()
