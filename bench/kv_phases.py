"""Where one KV round trip goes, phase by phase: trainer_core's ``dist_sync`` push then pull on one host.

    python -m bench.kv_phases [--sizes 1e3,1e5] [--iters 300] [--workers 2] [--servers 2]

The job of ``bench.kv`` (scheduler, servers and workers as separate processes, same-host shared
memory), with timestamps (``time.perf_counter``: CLOCK_MONOTONIC, one clock for every process
of the host) taken around the calls that mark a round trip's phases: in each worker around
``WorkerClient.send`` and ``Poller._wait`` and when a reply is handed over, in the servers when
a wait returns something and around ``Server._handle``. Figures, each the median over the timed
round trips (µs):

- **worker: call -> send**: the push call's Python and its copy into the worker's segment;
- **worker: send**: building, encoding and writing the request's header;
- **worker send -> server wakes**: from the end of that write to the server's wait returning
  (the kernel's wake-up and the wait for a core);
- **server: wake -> handler**: reading and decoding the message;
- **server: handler, first / completing push**: the round's first push (lent, not copied) and
  the one that completes it (the sum, and the replies to every worker);
- **server replies -> worker wakes**, **worker: wake -> reply handed over**, **worker: reply ->
  call returns** (its copy out of the server's buffer);
- **spread of the workers' replies in a round**: from the first worker's reply to the last one's
  (the replies leave the server together: what is more is the workers taking turns on the cores);
- **CPU per round trip**: ``time.thread_time`` of a worker's main thread over the timed loop,
  divided by the round trips (the mean of the workers), and of the busiest server's main thread
  from the first request of the timed loop to the last, divided by the rounds between them.

The stamps cost about 1 µs each, so the round trip is slightly longer than ``bench.kv``'s. On a
shared machine the wake-ups grow with the load (other processes take the cores); the CPU
figures do not.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kv import run_job

WORKER = """
import json, os, time
import numpy as np
from trainer_core import kv as kvmod
from trainer_core.transport import channel
ev = []
kv = kvmod.create('dist_sync')
n, iters = int(os.environ['BENCH_N']), int(os.environ['BENCH_ITERS'])
kv.init('k', np.zeros(n, np.float32))
a, out = np.ones(n, np.float32), np.empty(n, np.float32)
for _ in range(20):
    kv.push('k', a)
    kv.pull('k', out)
kv.barrier()
client, pc = kv.client, time.perf_counter
send, deliver, wait = client.send, client._deliver, channel.Poller._wait
def timed_send(*args, **kwargs):
    ev.append(('send', pc()))
    seq = send(*args, **kwargs)
    ev.append(('sent', pc()))
    return seq
def timed_deliver(msg):
    ev.append(('reply', pc()))
    deliver(msg)
def timed_wait(self, timeout_s):
    keys = wait(self, timeout_s)
    ev.append(('woke', pc()))
    return keys
client.send, channel.Poller._wait = timed_send, timed_wait
client._pump = lambda: (client.check(), client._poller.serve(timed_deliver, 0.1, client._closed_source))
cpu = time.thread_time()
for _ in range(iters):
    ev.append(('call', pc()))
    kv.push('k', a)
    kv.pull('k', out)
    ev.append(('done', pc()))
cpu = time.thread_time() - cpu
assert out[0] == kv.num_workers, out[0]
with open(os.path.join(os.environ['BENCH_DIR'], 'worker%s.json' % os.environ['LAUNCHKIT_ROLE_RANK']), 'w') as f:
    json.dump({'events': ev, 'cpu': cpu}, f)
print('RESULT {}', flush=True)
kv.close()
"""

ROLE = """
import json, os, sys, time
if os.environ['DMLC_ROLE'] != 'server':
    import trainer_core  # the scheduler runs on import
role = os.environ.pop('DMLC_ROLE')  # (importing trainer_core would run the server unstamped)
from trainer_core.config import NodeConfig
from trainer_core.ps import server
from trainer_core.transport import channel
ev, cpu, pc = [], [], time.perf_counter
handle, wait = server.Server._handle, channel.Poller._wait
def timed_handle(self, msg):
    ev.append(('handle', pc()))
    cpu.append((pc(), time.thread_time()))
    handle(self, msg)
    ev.append(('handled', pc()))
def timed_wait(self, timeout_s):
    keys = wait(self, timeout_s)
    if keys:
        ev.append(('woke', pc()))
    return keys
server.Server._handle, channel.Poller._wait = timed_handle, timed_wait
code = server.Server(NodeConfig.from_environ(dict(os.environ, DMLC_ROLE=role), role='server')).run()
with open(os.path.join(os.environ['BENCH_DIR'], 'server%s.json' % os.environ['LAUNCHKIT_ROLE_RANK']), 'w') as f:
    json.dump({'events': ev, 'cpu': cpu}, f)
sys.exit(code)
"""


def _times(events: list[list], name: str) -> list[float]:
    return [t for k, t in events if k == name]


def _gaps(starts: list[float], ends: list[float]) -> list[float]:
    """For each start, the time to the first end after it (µs)."""
    out = []
    for t in starts:
        j = bisect.bisect_left(ends, t)
        if j < len(ends):
            out.append((ends[j] - t) * 1e6)
    return out


def _since(ends: list[float], starts: list[float]) -> list[float]:
    """For each end, the time since the last start before it (µs)."""
    out = []
    for t in ends:
        j = bisect.bisect_right(starts, t) - 1
        if j >= 0:
            out.append((t - starts[j]) * 1e6)
    return out


def phases(workers: list[dict], servers: list[dict], iters: int) -> dict[str, float]:
    """The medians of each phase over every worker's round trips (µs), and the CPU per round trip."""
    t0 = min(min(_times(w["events"], "call")) for w in workers)
    busy = [(k, t) for k, t in max(servers, key=lambda s: len(s["events"]))["events"] if t >= t0]
    handle, handled, woke = _times(busy, "handle"), _times(busy, "handled"), _times(busy, "woke")
    spans = [(b - a) * 1e6 for a, b in zip(handle, handled, strict=False)]
    n = len(workers)  # each round: n pushes, the last of which completes it
    completing = handle[n - 1 :: n]
    rows: dict[str, list[float]] = {}
    for w in workers:
        ev = w["events"]
        call, send, sent = _times(ev, "call"), _times(ev, "send"), _times(ev, "sent")
        reply, end, wwoke = _times(ev, "reply"), _times(ev, "done"), _times(ev, "woke")
        woke_for_reply = [wwoke[j] for j in (bisect.bisect_right(wwoke, t) - 1 for t in reply) if j >= 0]
        for name, values in (
            ("worker: call -> send", _gaps(call, send)),
            ("worker: send", _gaps(send, sent)),
            ("worker send -> server wakes", _gaps(sent, woke)),
            ("server: completing push starts -> worker wakes", _since(woke_for_reply, completing)),
            ("worker: wake -> reply handed over", _since(reply, wwoke)),
            ("worker: reply -> call returns", _gaps(reply, end)),
            ("round trip", _gaps(call, end)),
        ):
            rows.setdefault(name, []).extend(values)
    rows["server: wake -> handler"] = _since(handle, woke)
    rows["server: handler, first push"] = spans[0::n]
    rows["server: handler, completing push"] = spans[n - 1 :: n]
    replies = [_times(w["events"], "reply") for w in workers]
    rows["spread of the workers' replies in a round"] = [
        (max(r) - min(r)) * 1e6 for r in zip(*replies, strict=True)
    ]
    out = {k: statistics.median(v) for k, v in rows.items() if v}
    t1 = max(max(_times(w["events"], "done")) for w in workers)
    busiest = max(servers, key=lambda s: len(s["events"]))
    cpu = [c for t, c in busiest["cpu"] if t0 <= t <= t1]  # its main thread's, at each request
    rounds = (len(cpu) - 1) / n
    if rounds >= 1:
        out["CPU per round trip, the server's main thread"] = (cpu[-1] - cpu[0]) / rounds * 1e6
    out["CPU per round trip, a worker's main thread"] = (
        statistics.mean(w["cpu"] for w in workers) / iters * 1e6
    )
    return out


def run(n: int, iters: int, workers: int, servers: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="kv-phases-") as tmp:
        env = {
            "LAUNCHKIT_JOB_ID": "phases" + uuid.uuid4().hex[:6],
            "LAUNCHKIT_JOB_SECRET": uuid.uuid4().hex,
            "BENCH_N": str(n),
            "BENCH_ITERS": str(iters),
            "BENCH_DIR": tmp,
        }
        run_job(sys.executable, WORKER, ROLE, workers, servers, env)
        ws = [json.loads(Path(tmp, f"worker{r}.json").read_text()) for r in range(workers)]
        ss = [json.loads(Path(tmp, f"server{r}.json").read_text()) for r in range(servers)]
    return phases(ws, ss, iters)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e3,1e5")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    cols = [run(n, args.iters, args.workers, args.servers) for n in sizes]
    print(
        f"| W={args.workers}/S={args.servers}, µs (median) | " + " | ".join(f"{n:.0e}" for n in sizes) + " |"
    )
    print("|---|" + "---|" * len(sizes))
    for k in cols[0]:
        print(f"| {k} | " + " | ".join(f"{c.get(k, float('nan')):.0f}" for c in cols) + " |")
    print(f"_(load average {os.getloadavg()[0]:.1f})_")


if __name__ == "__main__":
    main()
