"""The real MXNet 1.9.1, in a virtual environment of its own (scripts/mxnet_venv.sh)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# /var/tmp is shared with the network-namespace test hosts (their /root, /tmp, /srv and
# /dev/shm are private), so the ssh tests can run the same interpreter there.
SHARED_VENV = "/var/tmp/launchkit-test-venv-mxnet"


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    env = {**os.environ, "MXNET_VENV": os.environ.get("MXNET_VENV", SHARED_VENV)}
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "mxnet_venv.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, f"could not set up MXNet 1.9.1: {res.stderr[-2000:]}"
    return res.stdout.strip().splitlines()[-1]


from tests.cluster.conftest import slurm_local  # noqa: E402, F401  (MXNet as a Slurm batch job)
