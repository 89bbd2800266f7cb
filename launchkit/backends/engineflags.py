"""The flags of ``launchkit launch`` that several engines take, declared once: ``--node-python``
(every engine that starts Python on its nodes), ``--queue`` (sge, yarn), and the CPUs and memory
of each role (slurm, yarn). Each engine lists them in its ``Capabilities.flags`` beside its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launchkit.core.flags import EngineFlag, at_least_one

NODE_PYTHON = EngineFlag("--node-python", "Python on the nodes (default: this one).")
QUEUE = EngineFlag("--queue", "The queue.")

CPUS_PER_TASK = EngineFlag("--cpus-per-task", "CPUs of every task.", int, check=at_least_one)
CPUS_PER_SERVER = EngineFlag("--cpus-per-server", "CPUs of a server.", int, check=at_least_one)
CPUS_PER_WORKER = EngineFlag("--cpus-per-worker", "CPUs of a worker.", int, check=at_least_one)
MEM = EngineFlag("--mem", "Memory of every task (e.g. 4G).")
MEM_PER_SERVER = EngineFlag("--mem-per-server", "Memory of a server.")
MEM_PER_WORKER = EngineFlag("--mem-per-worker", "Memory of a worker.")
#: the CPUs and memory of each role: a role's own flag, else the one for every task
ROLE_RESOURCES = (CPUS_PER_TASK, CPUS_PER_SERVER, CPUS_PER_WORKER, MEM, MEM_PER_SERVER, MEM_PER_WORKER)


def per_role(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The ``cpus_per_*`` and ``mem_per_*`` fields of an engine's options, from ``flags``."""
    server, worker, task = (f.value(flags) for f in (CPUS_PER_SERVER, CPUS_PER_WORKER, CPUS_PER_TASK))
    return {
        "cpus_per_server": server or task,
        "cpus_per_worker": worker or task,
        "mem_per_server": MEM_PER_SERVER.value(flags) or MEM.value(flags),
        "mem_per_worker": MEM_PER_WORKER.value(flags) or MEM.value(flags),
    }
