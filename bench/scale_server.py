"""One parameter-server shard with hundreds of simulated workers, in one process.

    python -m bench.scale_server [--workers 64 256 1024] [--rounds 20] [--json out.json]
    python -m bench.scale_server --trees OLD NEW [--runs 3] [--workers 2 4 8 256 1024] [--rounds 20]

The server is the real one: its request handling (``ps.handler.RequestHandler`` over its
``ps.store.Store``), fed by the server's own serving loop (``transport.channel.Poller.serve``, as
``ps/server.py`` runs it: an epoll set of every channel's descriptor, which hands back the ready
ones). Each worker is simulated as one
``transport.memory.MemoryChannel`` pair: what it sends is encoded as on a socket (``wire.encode``,
its frames copied), what the server answers is decoded on the worker's end. The server's ends
share one ``Trace`` (one header decoder, which remembers recent headers), as a server node's
channels do. A tiny model: 4 keys
of 256 float32 each, every request carrying all four (as a worker's client sends one message
per server). Scenarios, each for sync and async mode:

- **round**: every worker pushes its gradient of the 4 keys, then pulls them (sync: the pulls
  wait for the round; async: each push is applied at once);
- **ahead** (sync only): every worker but the last pushes twice (the second push is queued for the
  next round) and pulls (its pull goes after its queued push); then the last worker does the same,
  which ends two rounds. A queue of n pushes per key: the case of a per-pull scan of that queue.

Figures: time per round (wall, everything in the process: the workers' encoding included) and
the server's part of it (``RequestHandler.handle``) per request; the work per request, counted as
the Python lines the server's code executes (``trainer_core/ps``, ``sys.settrace``, one round
traced apart from the timed ones): flat in the workers where each request costs the same, growing
with them where a request scans something of every worker; the serving loop's turns per round,
and the time of one ``poll`` with one of the n channels ready (a server woken for one message at
a time pays it per message: with a ``zmq.Poller`` over every descriptor, as before the work on scale,
``poll(2)`` walked all n of them; the epoll set hands back the one); memory per worker (``tracemalloc``:
the server's records and channel ends per worker after the rounds, the simulated workers' ends
excluded by file); and the round's floor: the same rounds with the server's logic taken out
(``Shard.bare``: each pull answered at once, pushes dropped), what the simulated workers, their
channels and the serving loop cost alone. The machine's load and cores shift the times, not the
counts. Each round is
timed twice: wall and the process's CPU time (the bench is one process of one thread: its CPU
time is what the round cost, other work on the machine aside).

``--trees``: the checkouts whose ``trainer_core`` to time with this bench's code, each run in a
process of its own (``SCALE_SERVER_TREE`` names the tree it imports), alternated: ``--runs``
runs, the trees' order reversed every other run. The table gives each run's median round per
tree (CPU and wall) and the ratio of the last tree's CPU time to the first's, run by run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: the checkout whose trainer_core is timed (``--trees`` starts one process per tree)
TREE = Path(os.environ.get("SCALE_SERVER_TREE") or ROOT).resolve()
sys.path.insert(0, str(TREE))

from trainer_core.ps import protocol as ps  # noqa: E402
from trainer_core.ps.handler import RequestHandler  # noqa: E402
from trainer_core.transport.channel import Caps, Poller, Received, Trace  # noqa: E402
from trainer_core.transport.memory import MemoryChannel  # noqa: E402

try:
    from trainer_core.transport.devshm import job_prefix
except ImportError:  # a tree before transport/shm.py was renamed
    from trainer_core.transport.shm import job_prefix  # type: ignore[import-not-found,no-redef]

if not Path(ps.__file__).resolve().is_relative_to(TREE):
    sys.exit(f"scale_server: trainer_core came from {ps.__file__}, not from {TREE}")
LOG = logging.getLogger("bench.scale_server")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False
KEYS, SIZE = 4, 256
CAPS = Caps(direct=True)
PS_DIR = str(TREE / "trainer_core" / "ps")
SCENARIOS = ((True, "round"), (False, "round"), (True, "ahead"))


class Lines:
    """Counts the Python lines executed in ``trainer_core/ps`` while on (``sys.settrace``), by file."""

    def __init__(self) -> None:
        self.by_file: Counter[str] = Counter()

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.by_file[frame.f_code.co_filename.rsplit("/", 1)[-1]] += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._local if frame.f_code.co_filename.startswith(PS_DIR) else None

    def __enter__(self) -> Lines:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


class Shard:
    """One server shard and its ``n`` simulated workers."""

    def __init__(self, n: int, sync: bool) -> None:
        self.n = n
        self.handler = RequestHandler(n, job_prefix("bench-scale-server"), LOG, name="server 0")
        self.handler.store.sync = sync
        self.serve_with: Callable[[Received], None] = self.handler.handle
        self.poller = Poller()
        self.ends: list[MemoryChannel] = []
        self.seq = [0] * n
        self.entries = tuple(ps.Entry(f"k{k}", 0, SIZE, "<f4") for k in range(KEYS))
        self.grads = [np.full(SIZE, 1.0 + k, np.float32) for k in range(KEYS)]
        self.handled = 0
        self.handle_s = 0.0
        self.polls = 0
        # the server's channels share one ``Trace`` (one header decoder), as a server node's do;
        # each worker has its own, as each worker process does
        server_trace = Trace(LOG, schema=ps.SCHEMA)
        for _ in range(n):
            end = MemoryChannel(CAPS, Trace(LOG, schema=ps.SCHEMA))
            server_end = MemoryChannel(CAPS, server_trace)
            end.other, server_end.other = server_end, end
            server_end.place = self.handler.place
            self.poller.add(server_end)
            self.ends.append(end)
        self.send(0, ps.INIT, [np.zeros(SIZE, np.float32)] * KEYS)
        self.serve()
        self.replies(0)

    def close(self) -> None:
        for end in self.ends:
            end.close()
        for src in self.poller.sources():
            src.close()
        self.handler.close()

    def send(self, rank: int, op: str, frames: list[np.ndarray] | None = None) -> None:
        self.seq[rank] += 1
        h = ps.Header(
            op=op, seq=self.seq[rank], src=f"worker {rank}", entries=self.entries, body={"rank": rank}
        )
        self.ends[rank].send(h, frames or [])

    def _handle(self, msg: Received) -> None:
        a = time.perf_counter()
        self.serve_with(msg)
        self.handle_s += time.perf_counter() - a
        self.handled += 1

    def serve(self) -> None:
        """The server's loop until nothing waits: every message handed to the handler."""
        while self.poller.poll(0):
            self.poller.serve(self._handle, 0)
            self.polls += 1

    def poll_one_ready(self, times: int = 200) -> float:
        """Seconds one ``poll`` takes with one channel of ``n`` ready (a lightly loaded server: one
        message per wake), the median of ``times``."""
        self.ends[0].send(ps.Header(op=ps.REPLY, seq=0))  # waits unread: that channel stays ready
        took = []
        for _ in range(times):
            a = time.perf_counter()
            self.poller.poll(0)
            took.append(time.perf_counter() - a)
        self.poller.serve(lambda msg: None, 0)
        return statistics.median(took)

    def bare(self) -> None:
        """From now on no request reaches the server's logic (``RequestHandler``, its ``place``):
        each pull is answered at once with the keys' frames, pushes are dropped. What a round
        costs then is the simulation's floor: the workers, the channels, the serving loop."""
        values = [np.zeros(SIZE, np.float32) for _ in range(KEYS)]

        def answer(msg: Received) -> None:
            if msg.header.op == ps.PULL:
                msg.reply.post(ps.Header(op=ps.REPLY, seq=msg.header.seq), values)

        self.serve_with = answer
        for src in self.poller.sources():
            if isinstance(src, MemoryChannel):
                src.place = None

    def replies(self, rank: int) -> list[Received]:
        got: list[Received] = []
        self.ends[rank].receive(got.append)
        for msg in got:
            assert msg.header.op == ps.REPLY, msg.header.body
        return got

    def round(self) -> None:
        for r in range(self.n):
            self.send(r, ps.PUSH, self.grads)
            self.send(r, ps.PULL)
        self.serve()
        for r in range(self.n):
            (msg,) = self.replies(r)
            assert len(msg.frames) == KEYS

    def ahead(self) -> None:
        """Every worker but the last pushes twice, then pulls; then the last one: two rounds end."""
        for r in [*range(self.n - 1), self.n - 1]:
            self.send(r, ps.PUSH, self.grads)
            self.send(r, ps.PUSH, self.grads)
            self.send(r, ps.PULL)
            self.serve()
        for r in range(self.n):
            (msg,) = self.replies(r)
            assert len(msg.frames) == KEYS


def run(n: int, sync: bool, scenario: str, rounds: int) -> dict[str, Any]:
    mode = "sync" if sync else "async"
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    shard = Shard(n, sync)
    step = shard.round if scenario == "round" else shard.ahead
    step()  # warm: buffers made, views cached
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    server_side = [
        tracemalloc.Filter(True, str(TREE / "trainer_core" / "ps" / "*")),
        tracemalloc.Filter(True, "*/numpy/*"),
    ]
    per_worker = sum(
        s.size_diff
        for s in snap.filter_traces(server_side).compare_to(base.filter_traces(server_side), "filename")
    )
    total = sum(s.size_diff for s in snap.compare_to(base, "filename"))
    shard.handled = shard.polls = 0
    shard.handle_s = 0.0
    times, cpu = [], []
    for _ in range(rounds):
        a, c = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - a)
        cpu.append(time.process_time() - c)
    handled, handle_s, polls = shard.handled, shard.handle_s, shard.polls
    poll_s = shard.poll_one_ready()
    with Lines() as lines:
        step()
    floor = []  # the same rounds with the server's logic taken out: what remains is the simulation's
    shard.bare()
    step()
    for _ in range(rounds):
        c = time.process_time()
        step()
        floor.append(time.process_time() - c)
    traced_requests = 3 * (n - 1) + 3 if scenario == "ahead" else 2 * n
    rounds_per_step = 2 if scenario == "ahead" else 1
    shard.close()
    return {
        "workers": n,
        "mode": mode,
        "scenario": scenario,
        "round ms": 1e3 * statistics.median(times) / rounds_per_step,
        "round CPU ms": 1e3 * statistics.median(cpu) / rounds_per_step,
        "round CPU ms without the server's logic": 1e3 * statistics.median(floor) / rounds_per_step,
        "server us per request": 1e6 * handle_s / handled,
        "server lines per request (trainer_core/ps)": sum(lines.by_file.values()) / traced_requests,
        "store.py lines per request": lines.by_file["store.py"] / traced_requests,
        "serving loop turns per round": polls / rounds / rounds_per_step,
        "one poll, one channel of n ready (us)": 1e6 * poll_s,
        "memory per worker, server side (bytes)": per_worker // n,
        "memory per worker, all (bytes)": total // n,
    }


def one_tree(workers: list[int], rounds: int) -> list[dict[str, Any]]:
    results = []
    for sync, scenario in SCENARIOS:
        for n in workers:
            results.append(run(n, sync, scenario, rounds))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def in_tree(tree: Path, workers: list[int], rounds: int, out: Path) -> list[dict[str, Any]]:
    """This bench run in a process of its own against ``tree``'s trainer_core."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--rounds", str(rounds), "--json", str(out)]
    env = {**os.environ, "SCALE_SERVER_TREE": str(tree)}
    done = subprocess.run([*argv, "--workers", *map(str, workers)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"scale_server in {tree} failed (exit {done.returncode}):\n{done.stderr}")
    got: list[dict[str, Any]] = json.loads(out.read_text())
    return got


def alternated(
    trees: list[Path], runs: int, workers: list[int], rounds: int, tmp: Path
) -> list[dict[str, Any]]:
    """Every tree's results, ``runs`` times, the trees' order reversed every other run; each result
    with its tree's index and its run."""
    out = []
    for r in range(runs):
        order = list(range(len(trees)))
        for i in order if r % 2 == 0 else order[::-1]:
            print(f"run {r + 1}/{runs}: {trees[i]}", file=sys.stderr, flush=True)
            for res in in_tree(trees[i], workers, rounds, tmp / f"tree{i}-run{r}.json"):
                out.append({"tree": i, "run": r, **res})
    return out


def _each(values: list[float], spec: str = "") -> str:
    return ", ".join(f"{x:{spec or ('.3f' if x < 10 else '.1f')}}" for x in values)


def trees_table(results: list[dict[str, Any]], trees: list[Path]) -> str:
    """A row per scenario and worker count: each tree's median round in each run (CPU, wall), the
    ratio of the last tree's CPU to the first's run by run, the server's lines per request, and
    each tree's round without the server's logic (``Shard.bare``)."""
    names = [t.name for t in trees]
    head = ["scenario, workers"]
    head += [f"{n} CPU ms" for n in names] + [f"{names[-1]}/{names[0]} CPU"]
    head += [f"{n} wall ms" for n in names] + ["server lines per request " + " / ".join(names)]
    head += [f"{n} CPU ms without the server's logic" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    rows: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in results:
        rows.setdefault((r["mode"], r["scenario"], r["workers"]), []).append(r)
    for (mode, scenario, n), got in rows.items():
        by_tree = [
            sorted((r for r in got if r["tree"] == i), key=lambda r: r["run"]) for i in range(len(trees))
        ]
        cpu = [[r["round CPU ms"] for r in t] for t in by_tree]
        ratios = sorted(b / a for a, b in zip(cpu[0], cpu[-1], strict=True))
        cells = [f"{mode} {scenario}, {n:,}"] + [_each(sorted(c)) for c in cpu] + [_each(ratios, ".2f")]
        cells += [_each(sorted(r["round ms"] for r in t)) for t in by_tree]
        cells.append(" / ".join(f"{t[0]['server lines per request (trainer_core/ps)']:.0f}" for t in by_tree))
        cells += [_each(sorted(r["round CPU ms without the server's logic"] for r in t)) for t in by_tree]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--trees", nargs="+", type=Path, default=None, help="checkouts to time, alternated")
    p.add_argument("--runs", type=int, default=3, help="with --trees: runs of every tree")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.trees:
        trees = [t.resolve() for t in args.trees]
        for t in trees:
            if not (t / "trainer_core" / "ps" / "handler.py").is_file():
                p.error(
                    f"--trees: {t} is not a checkout with trainer_core/ps (expected a tree of this project)"
                )
        with tempfile.TemporaryDirectory() as tmp:
            got = alternated(trees, args.runs, args.workers, args.rounds, Path(tmp))
        print(trees_table(got, trees))
        if args.json:
            Path(args.json).write_text(
                json.dumps({"trees": [str(t) for t in trees], "results": got}, indent=1)
            )
        return
    results = one_tree(args.workers, args.rounds)
    keys = [k for k in results[0] if k not in ("workers", "mode", "scenario")]
    print("| | " + " | ".join(f"{r['mode']} {r['scenario']}, {r['workers']:,}" for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for k in keys:
        cells = [f"{r[k]:,.1f}" if isinstance(r[k], float) else f"{r[k]:,}" for r in results]
        print(f"| {k} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
