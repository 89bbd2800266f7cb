"""Start-up CPU of the processes the tests start by the hundred, two trees side by side.

    python -m bench.cli_cpu OLD_TREE NEW_TREE [--repeat 8] [--only launch_dry,ps]

Each case is one process (``python -m launchkit ...``, the reaper, the shim, an import of
trainer_core's scheduler or KV store), run with ``PYTHONPATH`` set to one tree, then to the other,
alternated, ``--repeat`` times each (in a directory of neither tree: ``-m`` and ``-c`` put the
current one first on the path); the figure is the CPU it took (user + system, of it and of the
children it waited for), the median over runs, with the ratio new / old. CPU, not wall time: on a
shared machine the wall time says more about the neighbours than about the code. Bytecode is
cached (``PYTHONDONTWRITEBYTECODE`` is dropped; a first run of each case, not counted, writes it).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PY = sys.executable
CASES: dict[str, list[str]] = {
    "help": [PY, "-m", "launchkit", "--help"],
    "launch_help": [PY, "-m", "launchkit", "launch", "--help"],
    "launch_dry": [
        PY,
        "-m",
        "launchkit",
        "launch",
        "-n",
        "2",
        "-s",
        "0",
        "--launcher",
        "local",
        "--dry-run",
        "true",
    ],
    "launch": [PY, "-m", "launchkit", "launch", "-n", "2", "-s", "0", "--launcher", "local", "true"],
    "ps": [PY, "-m", "launchkit", "ps"],
    "reaper": [PY, "-m", "launchkit.jobs.reaper", "0101-000000-abcdef", "0"],
    "shim": [PY, "-m", "launchkit.hostside.shim", "--", "true"],  # exits 2: no engine job around it
    "scheduler_import": [PY, "-c", "import trainer_core.ps.scheduler"],
    "kv_import": [PY, "-c", "import trainer_core.kv"],
}


def cpu_of(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """Seconds of CPU (user + system) that ``argv`` and the children it waited for took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != (2 if "launchkit.hostside.shim" in argv else 0):
        raise SystemExit(f"{argv[2:5]}: exit {done.returncode}\n{done.stderr.decode()[-1500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--only", default=",".join(CASES))
    args = ap.parse_args()
    names = args.only.split(",")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[tuple[str, str], list[float]] = {(n, t): [] for n in names for t in trees}
    with tempfile.TemporaryDirectory() as home:
        base = {**os.environ, "LAUNCHKIT_HOME": home, "NO_COLOR": "1", "TRAINER_CORE_AUTOSTART": "0"}
        base.pop("PYTHONDONTWRITEBYTECODE", None)  # as a test run: the bytecode cached, after the first
        for path in trees.values():  # each run loads its own tree's code, nothing else's
            where = subprocess.run(
                [
                    PY,
                    "-c",
                    "import launchkit, trainer_core; print(launchkit.__file__, trainer_core.__file__)",
                ],
                env={**base, "PYTHONPATH": str(path)},
                cwd=home,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            if not all(Path(w).is_relative_to(path) for w in where):
                raise SystemExit(f"PYTHONPATH={path} loads {where}")
        for name in names:  # (that first run, which writes it, is not counted)
            for path in trees.values():
                cpu_of(CASES[name], {**base, "PYTHONPATH": str(path)}, home)
        for _ in range(args.repeat):
            for name in names:
                for tree, path in trees.items():
                    runs[(name, tree)].append(cpu_of(CASES[name], {**base, "PYTHONPATH": str(path)}, home))
    print(f"# CPU seconds (user + system) per process start; medians of {args.repeat}, alternated [min-max]")
    print("| process | old | new | new / old |")
    print("|---|---|---|---|")
    for name in names:
        old, new = (statistics.median(runs[(name, t)]) for t in trees)
        cells = [
            f"{statistics.median(runs[(name, t)]):.3f} [{min(runs[(name, t)]):.2f}-{max(runs[(name, t)]):.2f}]"
            for t in trees
        ]
        print(f"| {name} | {cells[0]} | {cells[1]} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
