"""trainer_core's scheduler with thousands of simulated nodes, in one process.

    python -m bench.scale_scheduler [--nodes 10000] [--servers 0] [--book all] [--json out.json]

The scheduler is the real one (``node.scheduler.Scheduler``, its ``handle`` and its ``run`` loop);
the nodes are simulated: each is a ``SimNode``, the ``reply`` the scheduler answers on, which
encodes every header the scheduler sends it exactly as a socket would (``wire.encode``) and counts
the messages and bytes, without a socket or an event fd per node (a ``MemoryChannel`` pair holds
two, and 10,000 nodes would pass the descriptor limit). What the nodes send is built as a real
node builds it (registration bodies of a real node's size). One node's book is decoded as a node
decodes it (``wire.decode``: it must fit ``MAX_HEADER_BYTES``). The workers ask for the part of the
book ``--book`` names (``all``: a worker of the collectives; ``servers``: the parameter server's);
the servers ask for the servers only, as theirs do.

Phases, each timed (wall s, and the scheduler's work per node in microseconds):

- **registration**: every node registers; the last one starts the job (the book to every node);
- **heartbeats through the run loop**: one heartbeat from every node, handed to ``Scheduler.run``
  one message per wake (the worst case of a loop that checks liveness after each wake);
- **barrier**: every worker enters one barrier (each gets its ``barrier_done``);
- **abort**: one worker aborts; every other node is told.

Memory: the scheduler's Python allocations after registration (``tracemalloc``), per node.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer_core.config import NodeConfig  # noqa: E402
from trainer_core.node import book, protocol  # noqa: E402
from trainer_core.node.scheduler import Scheduler  # noqa: E402
from trainer_core.transport import wire  # noqa: E402
from trainer_core.transport.channel import Payload, Peer, Received, Source  # noqa: E402

LOG = logging.getLogger("bench.scale_scheduler")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False


class SimNode(Peer):
    """One simulated node as the scheduler's reply target: what it is sent, encoded and counted."""

    def __init__(self, role: str, index: int, stats: Counter[str], needs: str = book.ALL) -> None:
        self.role, self.index, self.stats, self.needs = role, index, stats, needs
        self.name = ""
        self.last: bytes = b""  # the last header received, encoded (node 0 only)
        self.frames: list[bytes] = []
        self.ops: Counter[str] = Counter()

    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        raw = wire.encode(header)
        self.stats["messages"] += 1
        self.stats["bytes"] += len(raw) + sum(len(memoryview(f).cast("B")) for f in frames)
        self.ops[header.op] += 1
        if header.op == protocol.BOOK:
            self.name = str(header.body["name"])
        if self.index == 0 and self.role == "worker":  # one worker keeps what it got last (not n books)
            self.last = raw
            self.frames = [bytes(memoryview(f).cast("B")) for f in frames]

    def registration(self) -> wire.Header:
        """What a real node of this job sends (the sizes of a real node's fields)."""
        a, b = divmod(self.index, 250)
        ip = f"10.{a // 250}.{a % 250}.{b + 1}"
        body = {
            "role": self.role,
            "rank": self.index,
            "host": ip,
            "endpoint": f"tcp://{ip}:{40000 + self.index % 20000}" if self.role == "server" else "",
            "host_key": f"{ip}|{'0f3c2a9e-55d1-4b7e-9a3c-' + format(self.index, '012x')}",
            "pid": 100000 + self.index,
            "local": f"launchkit-1127-000000-abcdef-s-{100000 + self.index}-{self.index:08x}",
            "data": f"tcp://{ip}:{45000 + self.index % 20000}",
            "book": self.needs,
        }
        return wire.Header(op=protocol.REGISTER, body=body)


class OneAtATime(Source):
    """The scheduler's router in the simulation: hands ``run`` one queued message per wake."""

    def __init__(self) -> None:
        self.queue: list[Received] = []
        self.at = 0

    def pollable(self) -> Any:
        return -1

    def wait(self, timeout: float) -> bool:
        return self.at < len(self.queue)

    def receive(self, handle: Callable[[Received], None]) -> bool:
        if self.at < len(self.queue):
            self.at += 1
            handle(self.queue[self.at - 1])
        return True

    def close(self) -> None:
        return None


def config(workers: int, servers: int) -> NodeConfig:
    env = {
        "DMLC_ROLE": "scheduler",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9",
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "LAUNCHKIT_JOB_SECRET": "s",
        "PS_HEARTBEAT_INTERVAL": "1",
        "PS_HEARTBEAT_TIMEOUT": "60",
    }
    return NodeConfig.from_environ(env)


def make_job(
    workers: int, servers: int, needs: str = book.ALL
) -> tuple[Scheduler, OneAtATime, list[SimNode], Counter[str]]:
    router = OneAtATime()
    sched = Scheduler(config(workers, servers), LOG, router=router)
    stats: Counter[str] = Counter()
    nodes = [SimNode("server", i, stats, book.SERVERS) for i in range(servers)] + [
        SimNode("worker", i, stats, needs) for i in range(workers)
    ]
    return sched, router, nodes, stats


def register(sched: Scheduler, nodes: list[SimNode]) -> None:
    for n in nodes:
        sched.handle(Received(n.registration(), [], n))


def heartbeats_through_run(sched: Scheduler, router: OneAtATime, nodes: list[SimNode]) -> int:
    """Every node's heartbeat through ``Scheduler.run`` (one per wake), then an abort that ends it."""
    for n in nodes:
        router.queue.append(Received(wire.Header(op=protocol.HEARTBEAT, src=n.name), [], n))
    last = nodes[-1]
    router.queue.append(
        Received(wire.Header(op=protocol.ABORT, src=last.name, body={"reason": "sim"}), [], last)
    )
    return sched._run()


def simulate(workers: int, servers: int, needs: str = book.ALL) -> dict[str, Any]:
    n = workers + servers
    out: dict[str, Any] = {"nodes": n, "workers": workers, "servers": servers}
    sched, router, nodes, stats = make_job(workers, servers, needs)
    tracemalloc.start()
    a = time.perf_counter()
    register(sched, nodes)
    out["registration s"] = time.perf_counter() - a
    out["memory per node (bytes, tracemalloc: the scheduler's records, the simulated nodes')"] = (
        tracemalloc.get_traced_memory()[0] // n
    )
    tracemalloc.stop()
    assert all(x.name for x in nodes), "not every node got its book"
    first = nodes[servers]  # worker 0
    out["book bytes (header + frame)"] = len(first.last) + sum(len(f) for f in first.frames)
    try:  # as the node reads it
        header = wire.decode(first.last, protocol.SCHEMA)
        frames = [Payload(memoryview(f)) for f in first.frames]
        got = book._book(header, frames)
        assert len(got.servers) == servers and len(got.workers) == (workers if needs == book.ALL else 0)
        out["book read by a node"] = "yes"
    except wire.WireError as exc:
        out["book read by a node"] = f"no: {exc}"
    out["registration: messages, MB sent"] = f"{stats['messages']}, {stats['bytes'] / 1e6:,.1f}"
    out["book bytes per node, mean"] = stats["bytes"] // n
    # heartbeats (each sets the node's ctl), one per wake of the run loop; an abort ends the loop
    stats.clear()
    a = time.perf_counter()
    code = heartbeats_through_run(sched, router, nodes)
    out["heartbeats through run() + abort s"] = time.perf_counter() - a
    out["abort: exit code, messages"] = f"{code}, {stats['messages'] - n}"
    # a barrier of every worker, on a fresh job (the one above was aborted)
    sched, router, nodes, stats = make_job(workers, servers, needs)
    register(sched, nodes)
    stats.clear()
    a = time.perf_counter()
    for x in nodes:
        if x.role == "worker":
            sched.handle(Received(wire.Header(op=protocol.BARRIER, seq=1, src=x.name), [], x))
    out["barrier s"] = time.perf_counter() - a
    done = sum(x.ops[protocol.BARRIER_DONE] for x in nodes)
    out["barrier: barrier_done messages"] = done
    a = time.perf_counter()
    x = nodes[0]
    sched.handle(Received(wire.Header(op=protocol.HEARTBEAT, src=x.name), [], x))
    for x in nodes:  # every node's heartbeat channel, so that the abort reaches it
        sched.handle(Received(wire.Header(op=protocol.HEARTBEAT, src=x.name), [], x))
    stats.clear()
    a = time.perf_counter()
    bad = nodes[-1]
    sched.handle(Received(wire.Header(op=protocol.ABORT, src=bad.name, body={"reason": "sim"}), [], bad))
    out["abort s"] = time.perf_counter() - a
    out["abort: nodes told"] = stats["messages"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 2000, 5000, 10000])
    p.add_argument("--servers", type=int, default=0, help="servers among the nodes (the rest are workers)")
    p.add_argument(
        "--book", choices=book.NEEDS, default=book.ALL, help="the part of the book workers ask for"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = [simulate(n - args.servers, args.servers, args.book) for n in args.nodes]
    keys = [k for k in results[0] if k not in ("nodes", "workers", "servers")]
    print("| | " + " | ".join(f"{r['nodes']:,} nodes" for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for k in keys:
        cells = [
            f"{r[k]:.3f}" if isinstance(r[k], float) else f"{r[k]:,}" if isinstance(r[k], int) else str(r[k])
            for r in results
        ]
        print(f"| {k} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
