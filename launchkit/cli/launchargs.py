"""Checks of ``launchkit launch``'s values that need more than a flag's type: the ``--env`` items
and ``NAME=VALUE`` words (no variable the launcher owns), and the working directory. Each raises
``UsageError`` (exit 2) before anything starts."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import dmlc_env
from launchkit.errors import UsageError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# the flag that sets what a launcher-owned variable would (said in the refusal)
_INSTEAD = {
    dmlc_env.DMLC_INTERFACE: "--interface",
    dmlc_env.DMLC_PS_ROOT_URI: "--scheduler-ip",
    dmlc_env.DMLC_PS_ROOT_PORT: "--scheduler-port",
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


def check_not_owned(
    flags: dict[str, list[str]], assignments: Iterable[tuple[str, str]], gpus_per_worker: int | None
) -> None:
    """Refuse a variable the launcher sets in every process (``dmlc_env.launcher_owned``: the
    ``DMLC_*`` contract and ``LAUNCHKIT_*``), and ``CUDA_VISIBLE_DEVICES`` with
    ``--gpus-per-worker``, whether given by a flag (``flags``: ``--env`` -> its items) or by a
    ``NAME=VALUE`` word before the command (``assignments``): ``--env DMLC_ROLE:worker`` made
    every process a worker, and the job hung."""
    given = [
        (f"{flag} {item.partition(':')[0]}", item.partition(":")[0]) for flag in flags for item in flags[flag]
    ]
    given += [(f"{name}=... (before the command)", name) for name, _ in assignments]
    for where, name in given:
        owned = dmlc_env.launcher_owned(name)
        if owned or (name == dmlc_env.CUDA_VISIBLE_DEVICES and gpus_per_worker is not None):
            why = "is set by the launcher (the job's contract)" if owned else "is set by --gpus-per-worker"
            instead = f"; use {_INSTEAD[name]}" if name in _INSTEAD else ""
            raise UsageError(f"{where}: {name} {why} and cannot be overridden{instead} (docs/environment.md)")


def working_directory() -> str:
    """The directory the job's processes start in: this one, which must still exist."""
    try:
        return os.getcwd()
    except OSError as exc:  # FileNotFoundError: it was removed while the shell stayed in it
        raise UsageError(
            f"the current directory cannot be used ({exc.strerror or exc}: it was removed?); "
            "the job's processes start in it: cd to a directory that exists"
        ) from None
