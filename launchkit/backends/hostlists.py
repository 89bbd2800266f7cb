"""The host lists a cluster engine gives the job it runs: a Slurm allocation, a Grid Engine PE
hostfile, an MPI hostfile. ``launchkit hosts list --from NAME`` shows them (through the backend
``NAME``'s ``given_hosts``), so a user can see where a job will go. Parsing is pure; reading the
environment and files is at the edges."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping

from launchkit.core.spec import Host
from launchkit.errors import UsageError

MPI_HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE")


def tasks_per_node(text: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` (``2(x3),1``) -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"SLURM_TASKS_PER_NODE={text!r}: expected N or N(xM), comma-separated")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def parse_pe_hostfile(text: str, path: str = "PE_HOSTFILE") -> list[Host]:
    """Grid Engine's ``PE_HOSTFILE``: ``host slots queue processors`` per line."""
    hosts = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if len(words) < 2 or not words[1].isdigit():
            raise UsageError(f"{path}:{n}: expected `HOST SLOTS QUEUE PROCESSORS`, got {line!r}")
        hosts.append(Host(words[0], slots=int(words[1]), line=n))
    return hosts


def parse_mpi_hostfile(text: str, path: str) -> list[Host]:
    """An Open MPI (``host slots=N``) or Hydra (``host:N``) hostfile; ``#`` comments."""
    hosts = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        name, _, count = words[0].partition(":")
        slots = int(count) if count.isdigit() else None
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "slots" and value.isdigit():
                slots = int(value)
        if count and slots is None:
            raise UsageError(f"{path}:{n}: bad slot count in {raw!r}")
        hosts.append(Host(name, slots=slots, line=n))
    return hosts


def _read(path: str, what: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"--from {what}: cannot read {path}: {exc.strerror}") from None


def slurm_allocation(environ: Mapping[str, str]) -> tuple[str, list[Host]]:
    """The allocation's nodes, with ``SLURM_TASKS_PER_NODE`` as their slots."""
    return f"slurm allocation {environ.get('SLURM_JOB_ID', '')}".strip(), _slurm(environ)


def pe_hostfile(environ: Mapping[str, str]) -> tuple[str, list[Host]]:
    """Grid Engine's ``PE_HOSTFILE`` of the parallel job this runs in."""
    path = environ.get("PE_HOSTFILE")
    if not path:
        raise UsageError("--from sge: PE_HOSTFILE is not set (run it inside a Grid Engine parallel job)")
    return path, parse_pe_hostfile(_read(path, "sge"), path)


def mpi_hostfile(environ: Mapping[str, str]) -> tuple[str, list[Host]]:
    """The MPI hostfile that Open MPI or Hydra was given."""
    var = next((v for v in MPI_HOSTFILE_VARS if environ.get(v)), None)
    if var is None:
        raise UsageError(f"--from mpi: none of {', '.join(MPI_HOSTFILE_VARS)} names a hostfile")
    return environ[var], parse_mpi_hostfile(_read(environ[var], "mpi"), environ[var])


def _slurm(environ: Mapping[str, str]) -> list[Host]:
    from launchkit.hostside.batchjob import allocation_nodes

    try:
        names = allocation_nodes(environ)
    except RuntimeError:
        raise UsageError(
            "--from slurm: SLURM_JOB_NODELIST is not set (run it inside an allocation, e.g. under salloc)"
        ) from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"--from slurm: `scontrol show hostnames` failed: {exc}") from None
    try:
        counts = (
            tasks_per_node(environ["SLURM_TASKS_PER_NODE"]) if environ.get("SLURM_TASKS_PER_NODE") else []
        )
    except ValueError as exc:
        raise UsageError(f"--from slurm: {exc}") from None
    return [Host(n, slots=counts[i] if i < len(counts) else None) for i, n in enumerate(names)]
