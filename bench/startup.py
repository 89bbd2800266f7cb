"""Launch start-up: from the launcher's start to every worker's first KV call, beside MXNet.

    python -m bench.startup [--workers 8] [--servers 8] [--repeat 3] [--json out.json]

Runs ``launchkit launch -n W -s S --launcher local`` and MXNet 1.9.1's own ``tools/launch.py -n W
-s S --launcher local`` (alternating, ``--repeat`` times each) on programs that do the same: import
the KV store, create a ``dist_sync`` store, then init, push and pull one small key. Each worker
prints when it reached each point; the figures are seconds since the launcher was started, for the
slowest worker (the job can train only once every worker is there), with the median over runs.

MXNet's tracker calls ``Thread.isAlive``, gone since Python 3.9: it is restored before its
``launch.py`` runs (otherwise the tracker dies at once and leaves its scheduler running).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.peers import mxnet_python

REPO = Path(__file__).resolve().parents[1]
POINTS = ("python", "imported", "created", "first_call")

OURS = textwrap.dedent(
    """
    import json, os, time
    t = {"python": time.time()}
    import numpy as np
    import trainer_core.kv
    t["imported"] = time.time()
    kv = trainer_core.kv.create("dist_sync")
    t["created"] = time.time()
    kv.init(3, np.zeros(10, np.float32))
    kv.push(3, np.ones(10, np.float32))
    out = np.empty(10, np.float32)
    kv.pull(3, out=out)
    t["first_call"] = time.time()
    print("STARTUP " + json.dumps(t), flush=True)
    kv.close()
    """
)

MXNET = textwrap.dedent(
    """
    import json, os, time
    t = {"python": time.time()}
    import mxnet as mx
    t["imported"] = time.time()
    kv = mx.kv.create("dist_sync")
    t["created"] = time.time()
    kv.init(3, mx.nd.zeros(10))
    kv.push(3, mx.nd.ones(10))
    out = mx.nd.zeros(10)
    kv.pull(3, out=out)
    out.wait_to_read()
    t["first_call"] = time.time()
    print("STARTUP " + json.dumps(t), flush=True)
    """
)


def run_job(argv: list[str], env: dict[str, str], workers: int, cwd: str) -> dict[str, float]:
    """Start the launcher, wait for the job; each point's latest worker time, in seconds since start."""
    t0 = time.time()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    rows = [json.loads(m) for m in re.findall(r"STARTUP (\{[^}]*\})", out)]
    if proc.returncode != 0 or len(rows) != workers:
        raise SystemExit(
            f"{argv[:3]}... exit {proc.returncode}, {len(rows)} of {workers} workers:\n{err[-2000:]}"
        )
    return {p: max(r[p] for r in rows) - t0 for p in POINTS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the raw numbers here")
    args = ap.parse_args()
    mx_py = mxnet_python()
    launch_py = str(
        Path(
            subprocess.run(
                [
                    mx_py,
                    "-c",
                    "import importlib.util as u; print(u.find_spec('mxnet').submodule_search_locations[0])",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        / "tools"
        / "launch.py"
    )
    w, s = str(args.workers), str(args.servers)
    runs: dict[str, list[dict[str, float]]] = {"launchkit + trainer_core": [], "MXNet launch.py + MXNet": []}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "ours.py").write_text(OURS)
        (Path(d) / "mx.py").write_text(MXNET)
        ours_env = {**os.environ, "PYTHONPATH": str(REPO)}
        mx_args = [launch_py, "-n", w, "-s", s, "--launcher", "local", mx_py, "mx.py"]
        mx_run = (
            "import runpy, sys, threading; threading.Thread.isAlive = threading.Thread.is_alive; "
            f"sys.argv = {mx_args!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        mx_env = {**os.environ, "DMLC_INTERFACE": "lo", "LAUNCHKIT_JOB_SECRET": secrets.token_hex(8)}
        for _ in range(args.repeat):
            ours = [sys.executable, "-m", "launchkit", "launch", "-n", w, "-s", s, "--launcher", "local"]
            ours_run = run_job([*ours, sys.executable, "ours.py"], ours_env, args.workers, d)
            runs["launchkit + trainer_core"].append(ours_run)
            runs["MXNet launch.py + MXNet"].append(run_job([mx_py, "-c", mx_run], mx_env, args.workers, d))
    print(f"# W={w}/S={s} on one host, --launcher local; seconds since the launcher started, for the slowest")
    print(f"# worker; medians of {args.repeat} alternating runs [min-max]")
    print(
        "| launcher + KV store | python started | KV store imported | store created (all joined) | first KV call done |"
    )
    print("|---|---|---|---|---|")
    rows = []
    for name, results in runs.items():
        cells = []
        for p in POINTS:
            vals = [r[p] for r in results]
            cells.append(f"{statistics.median(vals):.2f} [{min(vals):.2f}-{max(vals):.2f}]")
            rows.append({"launcher": name, "point": p, "median_s": statistics.median(vals), "runs": vals})
        print(f"| {name} | " + " | ".join(cells) + " |")
    ours = statistics.median(r["first_call"] for r in runs["launchkit + trainer_core"])
    theirs = statistics.median(r["first_call"] for r in runs["MXNet launch.py + MXNet"])
    print(f"\n# ratio (first KV call, launchkit / MXNet): {ours / theirs:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
