"""The kernel benchmark still runs (tiny array, ours only; the MXNet side needs its own venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_and_prints_every_kernel():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "compression.py"),
            "--no-mxnet",
            "--n",
            "5000",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for row in ("memcpy", "ours 2bit numpy", "ours 1bit numpy", "ours topk numpy", "ours powersgd rank 4"):
        assert f"| {row}" in proc.stdout, row
