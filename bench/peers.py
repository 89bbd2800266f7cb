"""The peers the benchmarks compare against, each in a virtual environment of its own, created on
first use: MXNet 1.9.1 (scripts/mxnet_venv.sh; the same venv as the compatibility tests) and
torch 2.13.0's CPU wheel (for gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MXNET_VENV = os.environ.get("MXNET_VENV", "/var/tmp/launchkit-test-venv-mxnet")
TORCH_VENV = ROOT / ".venv-torch"


def mxnet_python() -> str:
    env = {**os.environ, "MXNET_VENV": MXNET_VENV}
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "mxnet_venv.sh")], capture_output=True, text=True, check=True, env=env
    )
    return res.stdout.strip().splitlines()[-1]


def torch_python() -> str:
    py = TORCH_VENV / "bin" / "python"
    if (
        not py.exists()
        or subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode != 0
    ):
        print(
            f"creating {TORCH_VENV} (pip install torch==2.13.0, the CPU wheel) ...",
            file=sys.stderr,
            flush=True,
        )
        subprocess.run([sys.executable, "-m", "venv", str(TORCH_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0", "numpy"], check=True)
    return str(py)
