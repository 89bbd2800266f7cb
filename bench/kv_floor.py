"""The floor under a KV round trip: the same round as ``bench.kv``'s at W workers and one server,
with nothing but the copies, the sum and the wake-ups, beside trainer_core's job.

    python -m bench.kv_floor [--sizes 1e5] [--rounds 2000] [--workers 2] [--repeat 3]

Each worker of the floor does what a trainer_core worker must do per round on the same-host path
(``docs/wire.md``, "Shared memory"): copy its N float32 into its shared segment, send one 8-byte
message to the server on a Unix socket, sleep in ``poll`` until the answer, copy the sum out of
the server's shared buffer. The server sleeps in ``poll`` on the W sockets, reads the messages,
sums the W segments into a shared buffer once all came (the first push read in place, as
trainer_core's ``Store`` does) and answers each worker with one 8-byte write. No header, no
bookkeeping, no authentication: the 3 processes' copies, the sum, the system calls and the
wake-ups, nothing else. Beside it, the same with trainer_core's own headers (each message a
``pushpull`` or ``reply`` header of one key part in a segment, encoded and decoded by
``transport.wire``: "floor + headers"), and with no data (8-byte messages and no copies: "wake-ups
alone").

For each run, CPU per round summed over every process (``/proc/PID/task/*/schedstat``) and the
median round trip, beside ``bench.kv_cpu``'s figures of trainer_core's job (W workers, 2
servers, the key on one of them) and of the same job with the workers' loop on ``bench.kv_cpu``'s
``LEAN`` path (the least a worker must do over today's servers), alternated ``--repeat`` times:
what trainer_core spends beyond the floor is its Python per message, its headers and the job's
bookkeeping; the lean workers show how much of it is the KV calls' own code.
"""

from __future__ import annotations

import argparse
import mmap
import os
import select
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kv import REPO
from bench.kv_cpu import run as run_trainer_core


def _cpu_ns(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # (a thread that ended meanwhile)
    return total


def _shared(n: int) -> np.ndarray:
    return np.frombuffer(mmap.mmap(-1, max(4 * n, 4)), dtype=np.float32, count=n)


def _codec(headers: bool) -> tuple[Callable[[str, int], bytes], Callable[[bytes], Any]]:
    """How a message is made and read: 8 bytes, or (``headers``) trainer_core's own header of a
    pushpull of one key part in a segment and of its reply, encoded and decoded by ``wire``."""
    if not headers:
        return (lambda op, seq: b"pushpull" if op == "pushpull" else b"replyxxx"), (lambda raw: raw)
    from trainer_core.ps import protocol
    from trainer_core.transport import wire

    entry = protocol.Entry("k", 0, 100_000, "<f4", "launchkit-floor-w0-1")
    decoder = wire.Decoder(protocol.SCHEMA)

    def make(op: str, seq: int) -> bytes:
        return wire.encode(protocol.Header(op, seq, "worker-0", (entry,), {"rank": 0}))

    return make, decoder.decode


def floor(
    n: int, rounds: int, workers: int, data: bool = True, headers: bool = False, warmup: int = 50
) -> dict[str, float]:
    """One floor job: CPU per round (µs, every process) and the median round trip (µs)."""
    make, read = _codec(headers)
    segs = [_shared(n) for _ in range(workers)]
    sums = [_shared(n), _shared(n)]  # the stored value alternates, as ``Store``'s weight and acc
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(workers)]
    walls = _shared(rounds)
    total = rounds + warmup
    kids = []
    for w in range(workers):
        pid = os.fork()
        if pid == 0:  # a worker
            sock = pairs[w][1]
            poll = select.poll()
            poll.register(sock, select.POLLIN)
            a, out = np.ones(n, np.float32), np.empty(n, np.float32)
            for r in range(total):
                t = time.perf_counter()
                if data:
                    np.copyto(segs[w], a)
                sock.send(make("pushpull", r + 1))
                poll.poll()
                read(sock.recv(4096))
                if data:
                    np.copyto(out, sums[r % 2])
                if w == 0 and r >= warmup:
                    walls[r - warmup] = time.perf_counter() - t
            os._exit(0)
        kids.append(pid)
    poll = select.poll()
    socks = {}
    for w in range(workers):
        poll.register(pairs[w][0], select.POLLIN)
        socks[pairs[w][0].fileno()] = pairs[w][0]
    start = 0
    for r in range(total):
        if r == warmup:
            start = _cpu_ns([os.getpid(), *kids])
        came = 0
        while came < workers:
            for fd, _ in poll.poll():
                read(socks[fd].recv(4096))
                came += 1
        if data:
            np.add(segs[0], segs[1], out=sums[r % 2])
            for s in segs[2:]:
                np.add(sums[r % 2], s, out=sums[r % 2])
        for w in range(workers):
            pairs[w][0].send(make("reply", r + 1))
    cpu = _cpu_ns([os.getpid(), *kids]) - start
    for pid in kids:
        os.waitpid(pid, 0)
    for a, b in pairs:
        a.close()
        b.close()
    return {"cpu_us": cpu / rounds / 1e3, "wall_us": float(np.median(walls)) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e5")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tree", default=str(REPO), help="trainer_core's source tree")
    args = ap.parse_args()
    tree = Path(args.tree).resolve()
    print(f"W={args.workers}, {args.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    kinds = ["floor", "floor + headers", "wake-ups alone", "trainer_core", "trainer_core, lean workers"]
    print("| N | run | " + " | ".join(f"{k} CPU µs | {k} round µs" for k in kinds) + " |")
    print("|---|---|" + "---|---|" * len(kinds))
    for n in [int(float(s)) for s in args.sizes.split(",")]:
        rows = []
        for r in range(args.repeat):
            row = [
                floor(n, args.rounds, args.workers),
                floor(n, args.rounds, args.workers, headers=True),
                floor(n, args.rounds, args.workers, data=False),
                run_trainer_core(tree, n, args.rounds, args.workers, 2),
                run_trainer_core(tree, n, args.rounds, args.workers, 2, lean=True),
            ]
            rows.append(row)
            cells = " | ".join(f"{f['cpu_us']:.0f} | {f['wall_us']:.0f}" for f in row)
            print(f"| {n:.0e} | {r + 1} | {cells} |", flush=True)
        for key, title in (("cpu_us", "CPU"), ("wall_us", "round")):
            ratios = sorted(row[3][key] / row[0][key] for row in rows)
            print(
                f"_{n:.0e} {title}, trainer_core / floor: {statistics.median(ratios):.2f} "
                f"[{ratios[0]:.2f}-{ratios[-1]:.2f}]_"
            )
    print(f"_(load average at the end {os.getloadavg()[0]:.1f})_")


if __name__ == "__main__":
    main()
