"""The real MXNet 1.9.1, in a virtual environment of its own (scripts/mxnet_venv.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "mxnet_venv.sh")], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, f"could not set up MXNet 1.9.1: {res.stderr[-2000:]}"
    return res.stdout.strip().splitlines()[-1]
