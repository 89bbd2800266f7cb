"""Allreduce: summing one float32 array over W worker processes on this machine, side by side in
one run: trainer_core's collective allreduce (``collective.join()`` in a ``-s 0`` job; its default
algorithm choice, and ring and recursive doubling each forced), ``torch.distributed`` with the
gloo backend on CPU (``all_reduce``), Open MPI's ``MPI_Allreduce`` through mpi4py, and
trainer_core's parameter server (``pushpull``: push the array, pull the sum, one round trip).

    python bench/allreduce.py [--workers 2 4] [--sizes 1e3 1e4 1e5 1e6 1e7] [--reps 30] [--rounds 1]
                              [--no-mpi] [--json OUT]
    python -m bench.allreduce --protocol alternated [--trees OLD NEW] ...

trainer_core and torch are launched with ``launchkit launch --launcher local`` (the parameter
server with 2 servers), Open MPI with ``mpirun --allow-run-as-root --oversubscribe --bind-to none
-n W``. torch runs in this interpreter where it imports, else in a virtual environment
``.venv-torch`` (``pip install torch==2.13.0``, the CPU wheel), and mpi4py likewise (``pip install
mpi4py``, built against the system's Open MPI: needs ``libopenmpi-dev``), created on first use;
without ``mpirun`` or mpi4py, or with ``--no-mpi``, the MPI column says n/a. Every peer times the
same thing alike (bench/allreduce_workers.py): warm-up operations, then the median of
back-to-back operations on rank 0. Prints a Markdown table of median milliseconds per operation
and the ratios trainer_core / gloo and trainer_core / MPI. ``--protocol alternated``: gloo and
trainer_core jobs alternated round by round instead, the module-level call against gloo in place
(bench/allreduce_alternated.py; docs/performance.md says where the two protocols differ).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import allreduce_workers as programs
from bench.mpi_peer import mpi_python, mpirun_argv

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 10
Result = dict[str, object]


def _result(res: subprocess.CompletedProcess[str], what: str) -> Result:
    for line in res.stdout.splitlines():
        if "RESULT " in line:
            out: Result = json.loads(line.split("RESULT ", 1)[1])
            return out
    raise RuntimeError(f"{what}: no result (exit {res.returncode}): {res.stderr[-2000:]}{res.stdout[-1000:]}")


def _run(argv_of: list[str], script: str, what: str, env: dict[str, str] | None = None) -> Result:
    """Run ``argv_of + [script file]`` plus the program's arguments (after the ``{script}``
    placeholder) and return rank 0's result."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        argv = [f.name if a == "{script}" else a for a in argv_of]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    finally:
        os.unlink(f.name)
    return _result(res, what)


def launch(
    workers: int,
    servers: int,
    python: str,
    script: str,
    args: list[str],
    what: str,
    env: dict[str, str] | None = None,
) -> Result:
    argv = [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "-n",
        str(workers),
        "-s",
        str(servers),
        "--launcher",
        "local",
        python,
        "{script}",
        *args,
    ]
    return _run(argv, script, what, env)


def mpirun(workers: int, python: str, args: list[str]) -> Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_", "PS_"))}
    return _run(mpirun_argv(workers, python, "{script}", args), programs.MPI_ALLREDUCE, "Open MPI", env)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(
    workers_list: list[int], sizes: list[str], reps: int, rounds: int = 1, with_mpi: bool = True
) -> tuple[list[Result], str | None]:
    """The rows (one per W and size) and Open MPI's library version (None: not measured).

    With several ``rounds``, every peer runs once per round, one after the other, and each figure
    is the median over the rounds; ``tc_mpi`` and ``tc_gloo`` keep every round's ratio (each
    taken between peers measured minutes apart at most: on a shared machine the load changes
    between them, so one round's ratio at a size is only indicative)."""
    from bench.allreduce_alternated import gloo_python

    tpy, mpy = gloo_python(), mpi_python() if with_mpi else None
    spec = [",".join(sizes), str(reps), str(WARMUP)]
    rows: list[Result] = []
    library = None
    for w in workers_list:
        per: list[tuple[Result, Result, Result, Result]] = []
        for _ in range(rounds):
            tc = launch(w, 0, sys.executable, programs.TC_COLLECTIVE, spec, "trainer_core allreduce")
            gloo = launch(w, 0, tpy, programs.TORCH_GLOO, [*spec, str(free_port())], "torch gloo")
            mpi = mpirun(w, mpy, spec) if mpy else {}
            pp = launch(w, 2, sys.executable, programs.TC_PUSHPULL, spec, "trainer_core pushpull")
            library = str(mpi["library"]) if mpi else None
            per.append((tc, gloo, mpi, pp))
        for s in sizes:
            n = int(float(s))
            tcs = [_ms_of(tc, "default", n) for tc, _, _, _ in per]
            glo = [_ms_of(gloo, "gloo", n) for _, gloo, _, _ in per]
            mps = [_ms_of(mpi, "mpi", n) for _, _, mpi, _ in per]
            rows.append(
                {
                    "workers": w,
                    "size": n,
                    "trainer_core_ms": _median(tcs),
                    "algorithm": per[-1][0].get(f"algorithm/{n}"),
                    "ring_ms": _median([_ms_of(tc, "ring", n) for tc, _, _, _ in per]),
                    "doubling_ms": _median([_ms_of(tc, "doubling", n) for tc, _, _, _ in per]),
                    "torch_gloo_ms": _median(glo),
                    "mpi_ms": _median(mps),
                    "pushpull_ms": _median([_ms_of(pp, "pushpull", n) for _, _, _, pp in per]),
                    "tc_gloo": [
                        None if a is None or b is None else a / b for a, b in zip(tcs, glo, strict=True)
                    ],
                    "tc_mpi": [
                        None if a is None or b is None else a / b for a, b in zip(tcs, mps, strict=True)
                    ],
                }
            )
    return rows, library


def _median(values: list[float | None]) -> float | None:
    got = sorted(v for v in values if v is not None)
    return got[len(got) // 2] if got else None


def _ms_of(res: Result, key: str, n: int) -> float | None:
    v = res.get(f"{key}/{n}")
    return None if v is None else float(v) * 1e3  # type: ignore[arg-type]


def _ms(v: object) -> str:
    return "n/a" if v is None else f"{float(v):.3f}"  # type: ignore[arg-type]


def _ratio(a: object, b: object) -> str:
    return "n/a" if a is None or b is None else f"{float(a) / float(b):.2f}x"  # type: ignore[arg-type]


def table(rows: list[Result], library: str | None) -> str:
    algo = {"recursive_doubling": "doubling", "ring": "ring", "hierarchical": "hierarchical"}
    lines = [
        f"# median ms per allreduce of a float32 array on one host (rank 0); {library or 'Open MPI not measured'}",
        f"# {os.cpu_count()} cores here: W above that is oversubscribed, for every peer alike",
        "",
        "| W | float32 elements | trainer_core allreduce (ms) [chose] | tc ring forced | tc doubling forced "
        "| torch gloo all_reduce | Open MPI MPI_Allreduce | tc pushpull (-s 2) | tc / gloo | tc / MPI "
        "| tc / MPI, each round |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tc, gloo, mpi = r["trainer_core_ms"], r["torch_gloo_ms"], r["mpi_ms"]
        chose = algo.get(str(r["algorithm"]), str(r["algorithm"]))
        lines.append(
            f"| {r['workers']} | {int(r['size']):.0e} | {_ms(tc)} [{chose}] | {_ms(r['ring_ms'])} "  # type: ignore[call-overload]
            f"| {_ms(r['doubling_ms'])} | {_ms(gloo)} | {_ms(mpi)} | {_ms(r['pushpull_ms'])} "
            f"| {_ratio(tc, gloo)} | {_ratio(tc, mpi)} | {_rounds(r.get('tc_mpi'))} |"
        )
    return "\n".join(lines)


def _rounds(ratios: object) -> str:
    got = [f"{v:.2f}" for v in ratios or [] if v is not None]  # type: ignore[attr-defined]
    return ", ".join(got) if got else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--protocol",
        choices=("back-to-back", "alternated"),
        default="back-to-back",
        help="back-to-back: every peer's sizes in one job each (this module's docstring); alternated:"
        " gloo and trainer_core jobs alternated, 2 warm-up then --reps (bench/allreduce_alternated.py)",
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", help="default: 1e3 ... 1e7 (alternated: 1e5 1e6 1e7)")
    ap.add_argument(
        "--reps",
        type=int,
        help="timed operations per size (default 30, 5x that up to 1e5; alternated: 15, at every size)",
    )
    ap.add_argument(
        "--rounds", type=int, help="run every peer this many times, alternating (default 1; alternated: 3)"
    )
    ap.add_argument(
        "--trees",
        nargs="+",
        type=Path,
        default=[ROOT],
        help="alternated: the checkouts whose trainer_core is timed, alternated (default: this one)",
    )
    ap.add_argument("--no-mpi", action="store_true", help="back-to-back: leave Open MPI out (n/a)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args()
    if args.protocol == "alternated":
        from bench import allreduce_alternated as alt

        trees = [t.resolve() for t in args.trees]
        sizes = args.sizes or ["1e5", "1e6", "1e7"]
        rows = alt.run(args.workers, sizes, args.reps or 15, args.rounds or 3, trees)
        print(alt.table(rows, trees))
    else:
        sizes = args.sizes or ["1e3", "1e4", "1e5", "1e6", "1e7"]
        rows, library = run(args.workers, sizes, args.reps or 30, args.rounds or 1, not args.no_mpi)
        print(table(rows, library))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
