"""What ``--launcher slurm`` is told: ``SlurmOptions``, and the flags of ``launchkit launch`` that
fill them (``FLAGS``, with the engines' shared ``ROLE_RESOURCES``), checked. Pure."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launchkit.backends.engineflags import per_role
from launchkit.core.flags import EngineFlag, at_least_one, fill, split_words
from launchkit.errors import UsageError


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    time: str | None = None
    nodes: int | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    cpus_per_server: int | None = None
    cpus_per_worker: int | None = None
    mem_per_server: str | None = None
    mem_per_worker: str | None = None
    gpus_per_worker: int | None = None
    extra: tuple[str, ...] = ()  # --slurm-args, split
    python: str = sys.executable


def parse_mem(value: str) -> tuple[int, str]:
    """``--mem-per-server``/``--mem-per-worker``: a number with Slurm's unit (K, M, G, T; M if none)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGTkmgt]?)[Bb]?\s*", value)
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"memory {value!r}: expected a number with an optional unit K, M, G or T (e.g. 4G)")
    return int(m.group(1)), (m.group(2) or "M").upper()


#: the flags of ``launchkit launch`` that fill ``SlurmOptions`` (with ``ROLE_RESOURCES``)
NODES = EngineFlag("--nodes", "Number of nodes (default: all / 1).", int, check=at_least_one)
FLAGS = (
    EngineFlag("--partition", "Partition (-p)."),
    EngineFlag("--time", "Time limit of the batch job (-t)."),
    NODES,
    EngineFlag("--account", "Account to charge."),
    EngineFlag("--qos", "Quality of service."),
    EngineFlag("--constraint", "Node features."),
    EngineFlag(
        "--slurm-args", "Extra sbatch flags, one string.", default="", fills="extra", check=split_words
    ),
)


def options_from_flags(flags: Mapping[str, Any], gpus_per_worker: int | None) -> SlurmOptions:
    roles = per_role(flags)
    for name in ("mem_per_server", "mem_per_worker"):
        if roles[name] is not None:
            try:
                parse_mem(roles[name])
            except UsageError as exc:
                raise UsageError(f"--{name.replace('_', '-')} (or --mem): {exc.message}") from None
    return SlurmOptions(**fill(FLAGS, flags), gpus_per_worker=gpus_per_worker, **roles)
