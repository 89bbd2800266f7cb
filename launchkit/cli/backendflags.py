"""Which of ``launchkit launch``'s flags apply to which backend, asked of the backends'
declarations (never of their names): the engine flags each lists in ``Capabilities.flags``
(declared next to it, ``core.flags``), and the sync flags of a backend that ``syncs``. A flag
given for a backend that does not take it is refused (exit 2) with the backends that do, rather
than dropped; the help groups the engine flags by the backends that take them."""

from __future__ import annotations

from collections.abc import Iterable

from launchkit import backends
from launchkit.core.flags import EngineFlag
from launchkit.errors import UsageError

# launch's parameter -> its flag, for the flags a backend takes when it ``syncs``
SYNC_FLAGS = {
    "sync_dst_dir": "--sync-dst-dir",
    "sync_dst_dir_force": "--sync-dst-dir-force",
    "sync_timeout": "--sync-timeout",
}


def takers(flag: EngineFlag) -> list[str]:
    """The backends that take ``flag`` (list it in their ``Capabilities.flags``)."""
    return backends.taking(lambda caps: flag.name in {f.name for f in caps.flags})


def launchers(names: list[str]) -> str:
    return f"--launcher {' or '.join(names)}" if names else "no backend"


def groups() -> dict[str, list[EngineFlag]]:
    """The engine flags by the backends that take them, each group under its help title."""
    found: dict[str, list[EngineFlag]] = {}
    for flag in backends.engine_flags():
        found.setdefault(f"Options for {launchers(takers(flag))}", []).append(flag)
    return found


def refuse_unused(backend: str, given: Iterable[str]) -> None:
    """UsageError (exit 2) for the first flag of ``given`` (launch's parameter names, those on
    the command line) that ``backend`` does not take, naming the backends that take it."""
    caps = backends.capabilities(backend)
    flags = {f.name: f for f in backends.engine_flags()}
    for param in given:
        if param in SYNC_FLAGS and not caps.syncs:
            label, names = SYNC_FLAGS[param], backends.taking(lambda c: c.syncs)
        elif param in flags and flags[param] not in caps.flags:
            label, names = flags[param].label, takers(flags[param])
        else:
            continue
        raise UsageError(f"{label} does not apply to --launcher {backend}; it is for {launchers(names)}")


def check_detach(backend: str) -> None:
    """``--detach`` submits a batch job: only backends that declare ``detaches`` can."""
    if not backends.capabilities(backend).detaches:
        which = " or ".join(backends.taking(lambda c: c.detaches))
        raise UsageError(f"--detach needs a batch engine (--launcher {which}), not {backend}")
