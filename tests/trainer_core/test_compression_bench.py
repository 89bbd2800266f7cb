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


def test_two_trees_alternated_print_each_encoder_and_a_bad_tree_is_refused(tmp_path: Path):
    cmd = [sys.executable, "-m", "bench.compression_trees", "--n", "5000", "--pairs", "1", "--repeat", "1"]
    proc = subprocess.run(
        [*cmd, "--old", str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    assert "1 runs per tree, alternated, cpu clock" in proc.stdout
    for row in ("2bit numba", "1bit numba", "topk numba"):
        assert f"| {row} |" in proc.stdout, row
    bad = subprocess.run([*cmd, "--old", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "holds no trainer_core/compression" in bad.stderr
    assert "Traceback" not in bad.stderr
