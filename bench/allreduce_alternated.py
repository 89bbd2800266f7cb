"""The allreduce against gloo, the peers' jobs alternated: ``python -m bench.allreduce --protocol
alternated``.

    python -m bench.allreduce --protocol alternated [--workers 2 4] [--sizes 1e5 1e6 1e7]
                              [--reps 15] [--rounds 3] [--trees DIR ...] [--json OUT]

For each W, ``rounds`` times: a gloo job, then a trainer_core job per tree (the order reversed
every other round), each a ``launchkit launch -n W -s 0 --launcher local`` job
(bench/allreduce_workers.py: ``TC_MODULE``, ``TORCH_GLOO_INPLACE``). Every job times each size
alike: 2 untimed operations, then the median of ``reps`` timed ones on rank 0.

* trainer_core: the module-level ``trainer_core.collective.allreduce(x, out=y)`` (the job's default
  group), ``x`` a float32 array of ones;
* gloo: ``dist.all_reduce(x)`` in place, ``x`` not refilled between operations, with
  ``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)``.

``--trees``: the checkouts whose trainer_core to time (``PYTHONPATH``), e.g. an old and a new one,
alternated within each round; default: this one. The ratio trainer_core / gloo is taken within a
round (jobs seconds apart); the table gives each round's. This is the protocol the figures of
docs/performance.md's allreduce section were checked with besides ``bench.allreduce``'s own
(back to back in one job per peer, gloo refilled before each operation, 10 warm-up operations,
more reps); docs/collectives.md says where the two differ.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench import allreduce_workers as programs

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2
Result = dict[str, object]


def gloo_python() -> str:
    """This interpreter where torch imports in it, else the bench's torch venv."""
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0:
        return sys.executable
    from bench.peers import torch_python

    return torch_python()


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, **more}


def run(workers_list: list[int], sizes: list[str], reps: int, rounds: int, trees: list[Path]) -> list[Result]:
    """One row per W and size: gloo's and every tree's median ms per round, and the ratios."""
    from bench.allreduce import free_port, launch

    gpy = gloo_python()
    spec = [",".join(sizes), str(reps), str(WARMUP)]
    rows: list[Result] = []
    for w in workers_list:
        gloo: list[Result] = []
        tcs: dict[int, list[Result]] = {i: [] for i in range(len(trees))}
        for r in range(rounds):
            jobs: list[int] = [-1, *range(len(trees))]  # -1: gloo
            for j in jobs if r % 2 == 0 else jobs[::-1]:
                if j < 0:
                    env = _env(OMP_NUM_THREADS="1")
                    gloo.append(
                        launch(w, 0, gpy, programs.TORCH_GLOO_INPLACE, [*spec, str(free_port())], "gloo", env)
                    )
                else:
                    path = os.pathsep.join([str(trees[j]), os.environ.get("PYTHONPATH", "")]).rstrip(
                        os.pathsep
                    )
                    env = _env(PYTHONPATH=path)
                    tcs[j].append(launch(w, 0, sys.executable, programs.TC_MODULE, spec, "trainer_core", env))
        for s in sizes:
            n = int(float(s))
            g = [float(res[f"gloo/{n}"]) * 1e3 for res in gloo]  # type: ignore[arg-type]
            row: Result = {"workers": w, "size": n, "gloo_ms": g}
            for i in range(len(trees)):
                t = [float(res[f"tc/{n}"]) * 1e3 for res in tcs[i]]  # type: ignore[arg-type]
                row[f"tc_ms/{i}"] = t
                row[f"tc_gloo/{i}"] = [a / b for a, b in zip(t, g, strict=True)]
                row[f"algorithm/{i}"] = tcs[i][-1].get(f"algorithm/{n}")
            rows.append(row)
    return rows


def _span(values: object, fmt: str = "{:.2f}") -> str:
    got = sorted(values)  # type: ignore[call-overload]
    return ", ".join(fmt.format(v) for v in got) if got else "n/a"


def table(rows: list[Result], trees: list[Path]) -> str:
    names = [t.name or str(t) for t in trees]
    head = "| W | elements | gloo ms, each round | " + " | ".join(
        f"tc {nm} ms, each round | tc {nm} / gloo, each round" for nm in names
    )
    if len(trees) == 2:
        head += f" | {names[1]} / {names[0]}, each round"
    lines = [
        f"# {os.cpu_count()} cores; median ms of rank 0 per job (2 warm-up, then timed operations);"
        " ratios within a round, sorted",
        "",
        head + " |",
        "|" + "---|" * (head.count("|")),
    ]
    for r in rows:
        cells = [str(r["workers"]), f"{int(r['size']):.0e}", _span(r["gloo_ms"], "{:.3f}")]  # type: ignore[call-overload]
        for i in range(len(trees)):
            cells += [
                _span(r[f"tc_ms/{i}"], "{:.3f}") + f" [{r[f'algorithm/{i}']}]",
                _span(r[f"tc_gloo/{i}"]),
            ]
        if len(trees) == 2:
            new, old = r["tc_ms/1"], r["tc_ms/0"]
            cells.append(_span([a / b for a, b in zip(new, old, strict=True)]))  # type: ignore[call-overload]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
