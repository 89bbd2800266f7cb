"""Which of ``launchkit launch``'s flags apply to which backend, asked of the backends' declared
``Capabilities`` (never of their names): a flag given for a backend that does not take it is
refused (exit 2) with the backends that do, rather than dropped."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from launchkit import backends
from launchkit.core.capabilities import Capabilities
from launchkit.errors import UsageError

Question = Callable[[Capabilities], bool]


def option(*names: str) -> Question:
    """The flag sets one of these constructor options (``Capabilities.options``)."""
    return lambda caps: any(n in caps.options for n in names)


SSH = option("options")
SLURM, SGE, YARN = option("slurm"), option("sge"), option("yarn")
SYNCS: Question = lambda caps: caps.syncs  # noqa: E731

# launch's parameter -> (its flag as the help names it, whether a backend takes it)
FLAGS: dict[str, tuple[str, Question]] = {
    "sync_dst_dir": ("--sync-dst-dir", SYNCS),
    "sync_timeout": ("--sync-timeout", SYNCS),
    "sync_exclude": ("--sync-exclude", SYNCS),
    "ssh_port": ("--ssh-port", SSH),
    "identity": ("-i/--identity", SSH),
    "known_hosts": ("--known-hosts", SSH),
    "strict_host_keys": ("--strict-host-keys", SSH),
    "connect_timeout": ("--connect-timeout", SSH),
    "heartbeat_timeout": ("--heartbeat-timeout", option("heartbeat_timeout")),
    "start_timeout": ("--start-timeout", option("start_timeout")),
    "mpirun": ("--mpirun", option("mpirun")),
    "mpi_args": ("--mpi-args", option("mpi_args")),
    "node_python": ("--node-python", option("node_python")),
    "partition": ("--partition", SLURM),
    "slurm_time": ("--time", SLURM),
    "nodes": ("--nodes", SLURM),
    "account": ("--account", SLURM),
    "qos": ("--qos", SLURM),
    "constraint": ("--constraint", SLURM),
    "slurm_args": ("--slurm-args", SLURM),
    "cpus_per_task": ("--cpus-per-task", option("slurm", "yarn")),
    "cpus_per_server": ("--cpus-per-server", option("slurm", "yarn")),
    "cpus_per_worker": ("--cpus-per-worker", option("slurm", "yarn")),
    "mem": ("--mem", option("slurm", "yarn")),
    "mem_per_server": ("--mem-per-server", option("slurm", "yarn")),
    "mem_per_worker": ("--mem-per-worker", option("slurm", "yarn")),
    "queue": ("--queue", option("sge", "yarn")),
    "pe": ("--pe", SGE),
    "sge_resource": ("--sge-resource", SGE),
    "sge_args": ("--sge-args", SGE),
    "yarn_rm": ("--yarn-rm", YARN),
    "yarn_user": ("--yarn-user", YARN),
    "yarn_domain": ("--yarn-domain", YARN),
    "yarn_file": ("--yarn-file", YARN),
}


def _names(names: list[str]) -> str:
    return f"--launcher {' or '.join(names)}" if names else "no backend"


def refuse_unused(backend: str, given: Iterable[str]) -> None:
    """UsageError (exit 2) for the first flag of ``given`` (launch's parameter names, those on
    the command line) that ``backend`` does not take, naming the backends that take it."""
    caps = backends.capabilities(backend)
    for param in given:
        if param not in FLAGS:
            continue
        flag, takes = FLAGS[param]
        if not takes(caps):
            raise UsageError(
                f"{flag} does not apply to --launcher {backend}; it is for {_names(backends.taking(takes))}"
            )


def check_detach(backend: str) -> None:
    """``--detach`` submits a batch job: only backends that declare ``detaches`` can."""
    if not backends.capabilities(backend).detaches:
        which = " or ".join(backends.taking(lambda c: c.detaches))
        raise UsageError(f"--detach needs a batch engine (--launcher {which}), not {backend}")
