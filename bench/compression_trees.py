"""Two trees' compression kernels side by side, alternated: this tree's ``bench/compression.py``
timing each tree's trainer_core (``--tree``).

    git worktree add --detach /tmp/old <commit>
    .venv/bin/python -m bench.compression_trees --old /tmp/old --n 1e6 1e7 --pairs 3

Per size, the runs go old, new, old, new, ... (``--pairs`` of each), every run a fresh process
running ``bench/compression.py --no-mxnet --clock cpu --tree TREE --json`` (so each tree compiles,
or loads from its own cache, its own kernels; warm-up rounds are inside; by default the process's
CPU time, which the other work of a shared machine does not inflate; ``--clock wall`` for the
wall clock). From every run: the median time of
each encoder, and its ratio to that run's memcpy median (``numpy.copyto`` of the same array;
higher is faster). The table gives, per tree, the median over the runs and, in brackets, the
lowest and highest, and new / old of the median ratios. On a shared machine the spread says how
far a difference can be trusted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("2bit numba", "1bit numba", "topk numba")


def run_tree(tree: Path, n: int, repeat: int, clock: str = "cpu") -> dict[str, Any]:
    """One run of ``tree``'s bench: ``{kernel: (encode median s, ratio to memcpy)}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, str(ROOT / "bench" / "compression.py"), "--no-mxnet", "--clock", clock]
        cmd += ["--tree", str(tree), "--n", str(n), "--repeat", str(repeat), "--json", str(out)]
        subprocess.run(cmd, check=True, capture_output=True)
        ours = json.loads(out.read_text())["ours"]
    memcpy = ours["memcpy"]["copy"]["median_s"]
    return {k: (ours[k]["encode"]["median_s"], memcpy / ours[k]["encode"]["median_s"]) for k in KERNELS}


def spread(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"


def table(n: int, runs: dict[str, list[dict[str, Any]]], clock: str) -> str:
    rows = [
        f"n = {n:.0e} float32, {len(runs['old'])} runs per tree, alternated, {clock} clock",
        "",
        "| encoder | old ms | new ms | old / memcpy | new / memcpy | new / old (ratio to memcpy) |",
        "|---|---|---|---|---|---|",
    ]
    for k in KERNELS:
        ms = {t: [1e3 * r[k][0] for r in rs] for t, rs in runs.items()}
        ratio = {t: [r[k][1] for r in rs] for t, rs in runs.items()}
        gain = statistics.median(ratio["new"]) / statistics.median(ratio["old"])
        rows.append(
            f"| {k} | {spread(ms['old'], '.2f')} | {spread(ms['new'], '.2f')} | "
            f"{spread(ratio['old'], '.2f')} | {spread(ratio['new'], '.2f')} | {gain:.2f}x |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the other tree (a worktree of an older commit)")
    ap.add_argument("--new", type=Path, default=ROOT, help="this tree unless given")
    ap.add_argument("--n", type=float, nargs="+", default=[1e6, 1e7])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7, help="timed rounds inside each run")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="bench/compression.py's --clock")
    args = ap.parse_args(argv)
    for tree in (args.old, args.new):
        if not (tree / "trainer_core" / "compression").is_dir():
            print(f"error: {tree} holds no trainer_core/compression (want a launchkit tree)", file=sys.stderr)
            return 2
    for n in (int(x) for x in args.n):
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        for _ in range(args.pairs):
            for name, tree in (("old", args.old), ("new", args.new)):
                runs[name].append(run_tree(tree, n, args.repeat, args.clock))
        print(table(n, runs, args.clock))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
