"""Checks of ``launchkit launch``'s values that need more than a flag's type: the ``--env`` items
and ``NAME=VALUE`` words (no variable the launcher owns), the working directory, the restart
flags. Each raises ``UsageError`` (exit 2) before anything starts."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import dmlc_env
from launchkit import backends
from launchkit.core.capabilities import Capabilities
from launchkit.errors import UsageError

MAX_BACKOFF = 86400.0  # --restart-backoff: at most a day

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# the flag that sets what a launcher-owned variable would (said in the refusal)
_INSTEAD = {
    dmlc_env.DMLC_PS_ROOT_URI: "--scheduler-ip",
    dmlc_env.DMLC_PS_ROOT_PORT: "--scheduler-port",
    dmlc_env.MASTER_PORT: "--master-port",
    dmlc_env.MASTER_ADDR: "--scheduler-ip with -s 0 (worker 0's address)",
    dmlc_env.DMLC_NUM_WORKER: "-n",
    dmlc_env.DMLC_NUM_SERVER: "-s",
    dmlc_env.CUDA_VISIBLE_DEVICES: "--gpus-per-worker alone",
}


def parse_env_items(items: list[str], flag: str, environ: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """``NAME:VALUE`` (split at the first ``:``; the value is taken literally) or ``NAME``
    (forward the launcher's own value), as launch.py."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        name, colon, value = item.partition(":")
        if not _ENV_NAME.match(name):
            raise UsageError(f"{flag} {item!r}: expected NAME:VALUE or NAME, with NAME a variable name")
        if not colon:
            if name not in environ:
                raise UsageError(f"{flag} {name}: {name} is not set in the launcher's environment")
            value = environ[name]
        if "\0" in value:
            raise UsageError(f"{flag} {name}: the value holds a NUL byte, which no environment variable can")
        pairs.append((name, value))
    return tuple(pairs)


# launcher-owned variables that the docs let --env set (docs/migrating-from-mxnet.md: MXNet users
# keep ps-lite on loopback with --env DMLC_INTERFACE:lo): taken, with one warning saying what differs
_WARN_ONLY = {
    dmlc_env.DMLC_INTERFACE: "the job's processes get it, but the launcher does not use it for the "
    "scheduler's address or the hosts' DMLC_NODE_HOST; --interface does all three",
}


def check_not_owned(
    flags: dict[str, list[str]], assignments: Iterable[tuple[str, str]], gpus_per_worker: int | None
) -> list[str]:
    """Refuse a variable the launcher sets in every process (``dmlc_env.launcher_owned``: the
    ``DMLC_*`` contract and ``LAUNCHKIT_*``), and ``CUDA_VISIBLE_DEVICES`` with
    ``--gpus-per-worker``, whether given by a flag (``flags``: ``--env`` -> its items) or by a
    ``NAME=VALUE`` word before the command (``assignments``): ``--env DMLC_ROLE:worker`` made
    every process a worker, and the job hung. Returns the warnings for those the docs allow
    (``_WARN_ONLY``), one per variable."""
    given = [
        (f"{flag} {item.partition(':')[0]}", item.partition(":")[0]) for flag in flags for item in flags[flag]
    ]
    given += [(f"{name}=... (before the command)", name) for name, _ in assignments]
    warnings: dict[str, str] = {}
    for where, name in given:
        if name in _WARN_ONLY:
            warnings.setdefault(name, f"{where}: {_WARN_ONLY[name]}")
            continue
        owned = dmlc_env.launcher_owned(name)
        if owned or (name == dmlc_env.CUDA_VISIBLE_DEVICES and gpus_per_worker is not None):
            why = "is set by the launcher (the job's contract)" if owned else "is set by --gpus-per-worker"
            instead = f"; use {_INSTEAD[name]}" if name in _INSTEAD else ""
            raise UsageError(f"{where}: {name} {why} and cannot be overridden{instead} (docs/environment.md)")
    return list(warnings.values())


def working_directory() -> str:
    """The directory the job's processes start in: this one, which must still exist."""
    try:
        return os.getcwd()
    except OSError as exc:  # FileNotFoundError: it was removed while the shell stayed in it
        raise UsageError(
            f"the current directory cannot be used ({exc.strerror or exc}: it was removed?); "
            "the job's processes start in it: cd to a directory that exists"
        ) from None


def check_restarts(backend: str, caps: Capabilities, max_restarts: int, restart_backoff: float) -> None:
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {max_restarts}")
    if not 0 <= restart_backoff <= MAX_BACKOFF:  # also NaN
        raise UsageError(
            f"--restart-backoff must be from 0 to {MAX_BACKOFF:g} seconds, got {restart_backoff:g}"
        )
    if max_restarts and not caps.restarts:
        raise UsageError(
            f"--max-restarts: --launcher {backend} does not restart jobs "
            f"(only {' and '.join(backends.taking(lambda c: c.restarts))} do)"
        )


def _discovers(caps: Capabilities) -> bool:
    return caps.elastic == "resize" and caps.hosts == "hostfile"


def check_elastic(
    backend: str,
    bounds: tuple[int, int] | None,
    max_restarts: int,
    discovery: str | None,
    hostfile: Path | None,
) -> str | None:
    """``-n MIN:MAX`` with the backend and the other flags; returns ``--host-discovery-script``
    as an absolute path (it runs from the launcher's directory every second). Refused: a backend
    that cannot (``Capabilities.elastic``); ``--max-restarts`` (an elastic job replaces lost
    workers itself, and a scheduler's or server's failure ends it: there is no whole-job restart
    to count); a discovery script without ``MIN:MAX``, with a hostfile, on a backend that cannot
    add workers, or that is not an executable file."""
    if bounds is None:
        if discovery is not None:
            raise UsageError("--host-discovery-script needs an elastic job: -n MIN:MAX")
        return None
    caps = backends.capabilities(backend)
    if caps.elastic == "none":
        able = ", ".join(backends.taking(lambda c: c.elastic != "none"))
        raise UsageError(
            f"-n {bounds[0]}:{bounds[1]}: --launcher {backend} does not run elastic jobs (only {able} do)"
        )
    if max_restarts:
        raise UsageError(
            f"--max-restarts with -n {bounds[0]}:{bounds[1]}: an elastic job replaces the workers it loses "
            "itself and ends when a scheduler or server fails; there is no restart of the whole job to count"
        )
    if discovery is None:
        return None
    if caps.elastic != "resize" or caps.hosts != "hostfile":
        raise UsageError(
            f"--host-discovery-script: --launcher {backend} does not start workers on hosts it is given "
            f"while the job runs (only {', '.join(backends.taking(_discovers))})"
        )
    if hostfile is not None:
        raise UsageError(
            "--host-discovery-script and -H: the script gives the hosts; expected one of the two"
        )
    path = Path(discovery).expanduser().absolute()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(f"--host-discovery-script {discovery}: expected an executable file")
    return str(path)
