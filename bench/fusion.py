"""Tensor fusion (``HOROVOD_FUSION_THRESHOLD``, ``HOROVOD_CYCLE_TIME``) in trainer_core.torch, its
jobs alternated:

    python bench/fusion.py [--workers 2 3] [--sizes 1e5 1e6 1e7] [--reps 20] [--rounds 3]
                           [--base DIR] [--json OUT]

For each W, ``rounds`` times, one ``launchkit launch -n W -s 0 --launcher local`` job per
configuration (the order reversed every other round): this tree with Horovod's defaults
(``fused``), this tree with ``HOROVOD_FUSION_THRESHOLD=0`` (``off``), and, with ``--base``, the
trainer_core of another checkout (``base``: e.g. the tree before fusion, ``git archive`` of it).
Each job times on rank 0, as medians of ``reps`` timed runs after 3 untimed ones:

* ``small``: one step of 100 float32 tensors of 1e3 elements, ``allreduce_async`` each (named),
  then ``synchronize`` each (a step of small gradients, as a Horovod script without
  DistributedOptimizer submits them);
* ``sync/N``: ``hvd.allreduce`` of one float32 tensor of N elements;
* ``async/N``: ``hvd.synchronize(hvd.allreduce_async(...))`` of the same.

The table gives each configuration's ms per round and the ratios to ``off`` and ``base`` within
each round (jobs seconds apart on a shared machine: read the ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
Result = dict[str, object]

WORKER = r"""
import json, sys, time
import torch
import trainer_core.torch as hvd
sizes = [int(float(s)) for s in sys.argv[1].split(",")]
reps = int(sys.argv[2])
hvd.init()
torch.set_num_threads(1)
def median(op, n):
    for _ in range(3):
        op()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        op()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]
small = [torch.full((1000,), float(i)) for i in range(100)]
def step():
    hs = [hvd.allreduce_async(t, name=f"g{i}", op=hvd.Sum) for i, t in enumerate(small)]
    got = [hvd.synchronize(h) for h in hs]
    assert float(got[7][0]) == 7.0 * hvd.size()
from trainer_core.torch.runtime import default
group = default.backend().group
count = lambda: getattr(group, "collectives", 0)  # (a tree before fusion counts none)
c0, s0 = count(), group.slots
out = {"small": median(step, reps)}
out["small/collectives"] = (count() - c0) / (reps + 3)
out["small/slots"] = (group.slots - s0) / (reps + 3)
for n in sizes:
    x = torch.ones(n)
    out[f"sync/{n}"] = median(lambda: hvd.allreduce(x, op=hvd.Sum, name="big"), reps)
    out[f"async/{n}"] = median(lambda: hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="big")), reps)
    assert float(hvd.allreduce(x, op=hvd.Sum)[0]) == hvd.size()
if hvd.rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
hvd.shutdown()
"""


def configs(base: Path | None) -> list[tuple[str, dict[str, str]]]:
    """(name, environment) of each configuration."""
    here = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    out = [
        ("fused", {**env, "PYTHONPATH": here}),
        ("off", {**env, "PYTHONPATH": here, "HOROVOD_FUSION_THRESHOLD": "0"}),
    ]
    if base is not None:
        there = os.pathsep.join([str(base), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        out.append(("base", {**env, "PYTHONPATH": there}))
    return out


def run(workers: list[int], sizes: list[str], reps: int, rounds: int, base: Path | None) -> list[Result]:
    from bench.allreduce import launch

    rows: list[Result] = []
    cfgs = configs(base)
    for w in workers:
        got: dict[str, list[Result]] = {name: [] for name, _ in cfgs}
        for r in range(rounds):
            for name, env in cfgs if r % 2 == 0 else cfgs[::-1]:
                got[name].append(
                    launch(w, 0, sys.executable, WORKER, [",".join(sizes), str(reps)], f"fusion {name}", env)
                )
        for what in ["small", *[f"{k}/{int(float(s))}" for s in sizes for k in ("sync", "async")]]:
            row: Result = {"workers": w, "what": what}
            for name, _ in cfgs:
                row[name] = [float(res[what]) * 1e3 for res in got[name]]  # type: ignore[arg-type]
                if what == "small":  # how many collectives and slots (agreements) a step took
                    row[f"{name}/per_step"] = [
                        f"{res.get('small/collectives', 0):.1f}/{res.get('small/slots', 0):.1f}"
                        for res in got[name]
                    ]
            rows.append(row)
    return rows


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    return ", ".join(fmt.format(v) for v in sorted(values))


def table(rows: list[Result]) -> str:
    names = [n for n in ("fused", "off", "base") if rows and n in rows[0]]
    head = "| W | operation | " + " | ".join(f"{n} ms" for n in names) + " | fused / off"
    head += " | fused / base" if "base" in names else ""
    lines = [
        f"# {os.cpu_count()} cores; median ms on rank 0 per job, each round (sorted); ratios within a round",
        "",
        head + " |",
        "|" + "---|" * head.count("|"),
    ]
    for r in rows:
        cells = [str(r["workers"]), str(r["what"])] + [_span(r[n], "{:.3f}") for n in names]  # type: ignore[arg-type]
        for other in ("off", "base"):
            if other in names:
                pairs = zip(r["fused"], r[other], strict=True)  # type: ignore[call-overload]
                cells.append(_span([a / b for a, b in pairs]))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "collectives/slots per step of `small`, each round:"]
    lines += [
        f"- W={r['workers']} {n}: {', '.join(r[f'{n}/per_step'])}"
        for r in rows
        for n in names
        if f"{n}/per_step" in r
    ]  # type: ignore[arg-type]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    p.add_argument("--sizes", nargs="+", default=["1e5", "1e6", "1e7"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--base", type=Path, default=None, help="another checkout's trainer_core, timed alike")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    rows = run(a.workers, a.sizes, a.reps, a.rounds, a.base)
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
