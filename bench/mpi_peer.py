"""Open MPI as a benchmark peer: mpi4py, built against the system's Open MPI (Debian's
``libopenmpi-dev`` gives it ``mpicc``): the one of this interpreter (the ``bench`` extra), else
one in torch's benchmark venv (bench/peers.py), installed there on first use; programs are
started with ``mpirun``."""

from __future__ import annotations

import shutil
import subprocess
import sys

from bench.peers import torch_python


def mpi_python() -> str | None:
    """An interpreter with mpi4py importable, or None (and why, on stderr) where
    there is no ``mpirun`` or mpi4py does not build."""
    if shutil.which("mpirun") is None:
        print("Open MPI: no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)", file=sys.stderr)
        return None
    for py in (sys.executable, torch_python()):  # the bench extra's mpi4py, else the peers' venv
        if subprocess.run([py, "-c", "from mpi4py import MPI"], capture_output=True).returncode == 0:
            return py
    py = torch_python()
    print("installing mpi4py into the benchmark venv (pip install mpi4py) ...", file=sys.stderr, flush=True)
    res = subprocess.run([py, "-m", "pip", "install", "-q", "mpi4py"], capture_output=True, text=True)
    if res.returncode != 0:
        print(
            f"Open MPI: mpi4py did not build (needs libopenmpi-dev):\n{res.stderr[-1500:]}", file=sys.stderr
        )
        return None
    return py


def mpirun_argv(workers: int, python: str, script: str, args: list[str]) -> list[str]:
    """``mpirun`` for ``workers`` ranks on this host, as root too, more ranks than cores allowed,
    unbound (as the other peers' processes are)."""
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-n",
        str(workers),
        python,
        script,
        *args,
    ]
