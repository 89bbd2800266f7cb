"""scripts/gpu-check.sh's exit status, run for real by bash in a copy of the checkout's layout whose
GPU tests and benches are small stand-ins (passing or failing on demand) and whose ``cupy`` is a
stand-in module (a usable GPU, or none): 2 at once without a GPU, 1 where a test or a bench failed,
0 where everything passed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
GPU_TESTS = ("test_compression_cuda", "test_gpu", "test_gpu_jobs", "test_collective_nccl", "test_xp")

CUPY_USABLE = """
class _A:
    def sum(self):
        return self

    def item(self):
        return 0.0


def zeros(n):
    return _A()
"""

CUPY_NO_GPU = """
raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
"""

# a bench that writes its --json and exits 0, or fails (exit 3) where its --n is $FAIL_BENCH_N
BENCH = """
import json, os, sys
args = sys.argv[1:]
n = args[args.index("--n") + 1]
if n == os.environ.get("FAIL_BENCH_N"):
    print("bench stand-in: failing at n =", n)
    sys.exit(3)
with open(args[args.index("--json") + 1], "w") as f:
    json.dump({"n": n}, f)
print("bench stand-in: n =", n)
"""


def checkout(tmp_path: Path, *, gpu: bool, failing_test: str = "") -> Path:
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu-check.sh", tree / "scripts" / "gpu-check.sh")
    tests = tree / "tests" / "trainer_core"
    tests.mkdir(parents=True)
    for name in GPU_TESTS:
        body = "assert False, 'stand-in failure'" if name == failing_test else "pass"
        (tests / f"{name}.py").write_text(f"def test_stand_in():\n    {body}\n")
    (tree / "bench").mkdir()
    (tree / "bench" / "__init__.py").write_text("")
    (tree / "bench" / "compression_gpu.py").write_text(BENCH)
    (tree / "bench" / "gpu_transfers.py").write_text(BENCH)
    fakes = tmp_path / "fakes" / "cupy"
    fakes.mkdir(parents=True)
    (fakes / "__init__.py").write_text(CUPY_USABLE if gpu else CUPY_NO_GPU)
    return tree


def run_check(tmp_path: Path, tree: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    base["PYTHONPATH"] = str(tmp_path / "fakes")
    return subprocess.run(
        ["bash", str(tree / "scripts" / "gpu-check.sh"), str(tmp_path / "out")],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_a_failed_bench_makes_the_status_1_and_the_other_benches_still_run(tmp_path: Path) -> None:
    tree = checkout(tmp_path, gpu=True)
    done = run_check(tmp_path, tree, FAIL_BENCH_N="1e6")
    assert done.returncode == 1, done.stdout + done.stderr
    bench_md = (tmp_path / "out" / "bench.md").read_text()
    assert "bench failed (exit 3)" in bench_md and "--n 1e6" in bench_md
    assert "bench stand-in: n = 1e8" in bench_md  # the later benches ran
    assert "bench stand-in: n = 1e7" in bench_md  # gpu_transfers
    assert "a test or bench failed" in done.stderr
    compression = (tmp_path / "out" / "compression.json").read_text()
    assert '"comp-1e5"' in compression and '"comp-1e6"' not in compression


def test_everything_passing_gives_0(tmp_path: Path) -> None:
    done = run_check(tmp_path, checkout(tmp_path, gpu=True))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in (tmp_path / "out" / "tests.log").read_text()
    assert "bench failed" not in (tmp_path / "out" / "bench.md").read_text()


def test_a_failed_test_makes_the_status_1(tmp_path: Path) -> None:
    tree = checkout(tmp_path, gpu=True, failing_test="test_gpu")
    done = run_check(tmp_path, tree, GPU_CHECK_BENCH="0")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in (tmp_path / "out" / "tests.log").read_text()


def test_without_a_gpu_it_exits_2_before_running_anything(tmp_path: Path) -> None:
    done = run_check(tmp_path, checkout(tmp_path, gpu=False))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cupy has no usable GPU here: RuntimeError: cudaErrorNoDevice" in done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["no-gpu.txt"]
