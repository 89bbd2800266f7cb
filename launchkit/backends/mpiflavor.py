"""Which MPI ``mpirun`` is (Open MPI, MPICH's Hydra, Intel MPI), told apart from ``mpirun
--version``, and what the mpi backend does differently for each: how a stop reaches the ranks,
the note for a launch as root."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from launchkit.errors import BackendError

EXIT_ENGINE_SETUP = 2


def detect_flavor(version_text: str) -> str:
    """The MPI implementation from ``mpirun --version``'s output. Raises ValueError."""
    text = version_text.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "intel(r) mpi" in text or "intel mpi" in text:
        return "intel"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    first = version_text.strip().splitlines()[0] if version_text.strip() else "(no output)"
    raise ValueError(f"unknown MPI implementation: `mpirun --version` said {first!r}")


def stop_signal(flavor: str) -> int | None:
    """What the launcher sends mpirun to stop the ranks: SIGUSR2 for Open MPI (forwarded at
    once); Hydra forwards SIGTERM itself."""
    return signal.SIGUSR2 if flavor == "openmpi" else None


def root_note(flavor: str) -> str | None:
    if flavor == "openmpi" and os.geteuid() == 0:
        return "running as root: --allow-run-as-root added (Open MPI refuses root without it)"
    return None


def find_flavor(mpirun: str) -> str:
    """Run ``mpirun --version`` and tell the implementation; a clear error when it cannot."""
    path = shutil.which(mpirun)
    if path is None:
        raise BackendError(
            "mpi",
            f"{mpirun!r} not found on PATH: install Open MPI, MPICH or Intel MPI "
            "(e.g. apt-get install openmpi-bin), or name it with --mpirun PATH",
            EXIT_ENGINE_SETUP,
        )
    try:
        proc = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BackendError("mpi", f"`{mpirun} --version` failed: {exc}", EXIT_ENGINE_SETUP) from None
    try:
        return detect_flavor(proc.stdout + proc.stderr)
    except ValueError as exc:
        raise BackendError(
            "mpi", f"{exc}; expected Open MPI, MPICH or Intel MPI", EXIT_ENGINE_SETUP
        ) from None
