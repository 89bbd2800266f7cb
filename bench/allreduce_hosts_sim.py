"""The compressed allreduce's CPU across simulated hosts, on this machine, without root.

    python -m bench.allreduce_hosts_sim [--hosts 3] [--per-host 2] [--sizes 1e7] [--reps 9]
                                        [--rounds 3] [--busy 2] [--trees DIR ...] [--json OUT]

bench/allreduce_hosts.py's trainer_core program (bench/allreduce_hosts_workers.py ``TC``: 32-bit
allreduce, then 1-bit compressed with error feedback; every rank's CPU seconds per operation,
summed over the ranks) in a ``launchkit launch -n HOSTS*PER_HOST -s 0 --launcher local`` job whose
workers each publish a loopback address of their own host, ``DMLC_NODE_HOST=127.0.0.<2+h>``
(``h`` = the worker's rank // PER_HOST): their machine identities differ by host, so the group's
topology has HOSTS hosts of PER_HOST ranks, the hosts' ranks share a segment and the leaders talk
over TCP on loopback. No link is capped: the times are CPU- and memory-bound, not the network's
(for that, bench/allreduce_hosts.py in namespaces, as root). ``--busy``: that many busy loops
(``while True: pass``) run beside every job. ``--trees``: the checkouts whose trainer_core to
time (``PYTHONPATH``), alternated within each round (order reversed every other round).
``--where``: instead, where each rank's CPU goes in the 1-bit operation (``WHERE``: the thread CPU
of the compressed path's encoding, decoding, host sum and stages, per operation, by wrapping
those functions, the garbage collector's, and the page faults per operation), every rank's row.
"sum+encode" is stage one's end where a tree has it apart (``twostage._second``: the owner's sum
of its chunk's payloads and their second-stage encoding, in one pass for 1 bit, then neither in
"decode" nor in "encode"; "stage 1" does not hold it). Where a leader of two ranks encodes its input plus the other
rank's slot without forming their sum (``Compressor.encodes_sum``), the host sum is inside its
encoding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import allreduce_hosts_workers as programs
from bench.allreduce import launch

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2
# every worker publishes its simulated host's loopback address before it joins
PREAMBLE = r"""
import os, sys
if os.environ.get("DMLC_ROLE") != "worker":
    import trainer_core
    sys.exit(0)
_h = int(os.environ["LAUNCHKIT_ROLE_RANK"]) // int(os.environ["BENCH_PER_HOST"])
os.environ["DMLC_NODE_HOST"] = f"127.0.0.{2 + _h}"
"""


# where the 1-bit operation's CPU goes on each rank: the compressed path's functions wrapped
WHERE = r"""
import gc, json, time, collections, resource
from inspect import signature
import numpy as np
from trainer_core import collective
from trainer_core.collective import ErrorFeedback
from trainer_core.collective.compressed import twostage
from trainer_core.collective.algorithms import shmreduce
n, reps = int(float(sys.argv[1].split(",")[0])), int(sys.argv[2])
spent = collections.defaultdict(float)
def wrap(mod, name, label):
    f = getattr(mod, name)
    def timed(*a, **k):
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            spent[label] += time.thread_time() - t
    setattr(mod, name, timed)
for mod, name, label in ((twostage, "_encode", "encode"), (twostage, "unpack", "decode"),
                         (twostage, "unpack_sum", "decode"), (shmreduce, "_reduce", "host sum"),
                         (twostage, "_reduce_scatter", "stage 1"), (twostage, "_allgather", "stage 2"),
                         (twostage, "_second", "sum+encode")):
    if hasattr(mod, name):  # (a tree without unpack_sum decodes stage one with unpack; _second: below)
        wrap(mod, name, label)
g = collective.group()
x = np.ones(n, np.float32)
state = ErrorFeedback({"type": "1bit"})
into = {"out": np.empty_like(x)} if "out" in signature(g.compressed_allreduce).parameters else {}
for _ in range(2):
    g.compressed_allreduce(x, state, key=0, op="sum", **into)
def collecting(phase, info, began=[0.0]):  # the cyclic garbage collector's own CPU
    if phase == "start":
        began[0] = time.thread_time()
    else:
        spent["gc"] += time.thread_time() - began[0]
gc.callbacks.append(collecting)
spent.clear()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
c0 = time.process_time()
for _ in range(reps):
    g.compressed_allreduce(x, state, key=0, op="sum", **into)
row = {"rank": g.rank, "local": g.local_rank, "cpu": (time.process_time() - c0) / reps,
       "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / reps}
row.update({k: v / reps for k, v in spent.items()})
text = json.dumps(row).encode().ljust(512)
rows = g.allgather(np.frombuffer(text, np.uint8).reshape(1, -1))
if g.rank == 0:
    print("RESULT " + json.dumps([json.loads(bytes(r).decode()) for r in rows]), flush=True)
collective.shutdown()
"""


def where(tree: Path, hosts: int, per_host: int, size: str, reps: int) -> list[dict[str, float]]:
    """Every rank's CPU seconds per 1-bit operation, in all and by part (``WHERE``)."""
    path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path, "BENCH_PER_HOST": str(per_host), "OMP_NUM_THREADS": "1"}
    res = launch(
        hosts * per_host, 0, sys.executable, PREAMBLE + WHERE, [size, str(reps)], f"where {tree}", env
    )
    return res  # type: ignore[return-value]


def where_table(rows: list[tuple[str, list[dict[str, float]]]]) -> str:
    parts = ["encode", "decode", "host sum", "stage 1", "sum+encode", "stage 2", "gc"]
    lines = [
        "| tree | rank (local) | CPU ms/op | page faults/op | " + " | ".join(f"{p} ms" for p in parts) + " |",
        "|---|---|---|---|" + "---|" * len(parts),
    ]
    for name, ranks in rows:
        for r in ranks:
            cells = [f"{r.get(p, 0.0) * 1e3:.1f}" for p in parts]
            lines.append(
                f"| {name} | {int(r['rank'])} ({int(r['local'])}) | {r['cpu'] * 1e3:.1f} | {r.get('faults', 0.0):.0f} | "
                + " | ".join(cells)
                + " |"
            )
        total = sum(r["cpu"] for r in ranks) * 1e3
        lines.append(
            f"| {name} | all | {total:.1f} | {sum(r.get('faults', 0.0) for r in ranks):.0f} |"
            + " |" * len(parts)
        )
    return "\n".join(lines)


def one(tree: Path, hosts: int, per_host: int, sizes: list[str], reps: int) -> dict[str, object]:
    path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path, "BENCH_PER_HOST": str(per_host), "OMP_NUM_THREADS": "1"}
    spec = [",".join(sizes), str(reps), str(WARMUP)]
    res = launch(
        hosts * per_host, 0, sys.executable, PREAMBLE + programs.TC, spec, f"trainer_core {tree}", env
    )
    if res.get("hosts") != hosts or res.get("local_size") != per_host:
        raise RuntimeError(f"the job's topology is not {hosts} x {per_host}: {res}")
    return res


def run(
    hosts: int, per_host: int, sizes: list[str], reps: int, rounds: int, busy: int, trees: list[Path]
) -> list[dict[str, object]]:
    """Every job's result, with its tree's index and round."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        out = []
        for r in range(rounds):
            order = list(range(len(trees)))
            for i in order if r % 2 == 0 else order[::-1]:
                out.append({"tree": i, "round": r, **one(trees[i], hosts, per_host, sizes, reps)})
        return out
    finally:
        for p in loops:
            p.kill()
            p.wait()


def table(results: list[dict[str, object]], sizes: list[str], trees: list[Path]) -> str:
    lines = [
        "| tree | elements | 32-bit ms, each round | 1-bit ms, each round | 1-bit speedup | "
        "32-bit CPU ms/op (all ranks) | 1-bit CPU ms/op (all ranks) |",
        "|---|---|---|---|---|---|---|",
    ]

    def cells(i: int, key: str, scale: float = 1e3) -> list[float]:
        return sorted(float(r[key]) * scale for r in results if r["tree"] == i)  # type: ignore[arg-type]

    def fmt(v: list[float]) -> str:
        return ", ".join(f"{x:.1f}" for x in v)

    for s in sizes:
        n = int(float(s))
        for i, t in enumerate(trees):
            t32, t1 = cells(i, f"tc32/{n}"), cells(i, f"tc1/{n}")
            speed = sorted(a / b for a, b in zip(t32, t1, strict=True))
            lines.append(
                f"| {t.name} | {n:.0e} | {fmt(t32)} | {fmt(t1)} | {', '.join(f'{v:.1f}x' for v in speed)} "
                f"| {fmt(cells(i, f'cpu_tc32/{n}'))} | {fmt(cells(i, f'cpu_tc1/{n}'))} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--sizes", nargs="+", default=["1e7"])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside every job")
    ap.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    ap.add_argument("--where", action="store_true", help="where each rank's 1-bit CPU goes, instead")
    ap.add_argument("--json")
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    if args.where:
        got = [
            (trees[i].name, where(trees[i], args.hosts, args.per_host, args.sizes[0], args.reps))
            for r in range(args.rounds)
            for i in (range(len(trees)) if r % 2 == 0 else reversed(range(len(trees))))
        ]
        print(where_table(got))
        return
    results = run(args.hosts, args.per_host, args.sizes, args.reps, args.rounds, args.busy, trees)
    print(table(results, args.sizes, trees))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
