"""Launch backends, chosen by name: one registry. A new backend is one module (its class, with
its ``capabilities`` declared, the flags it takes among them: docs/backends.md, "Adding a
backend") plus one line here. Each is imported only when used (``launchkit launch`` reads every
backend's declarations), and a module imports its heavy dependency (fabric for ssh, ...) only
when the backend runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from launchkit.backends.base import Backend
from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import EngineFlag
from launchkit.errors import UsageError

__all__ = [
    "REGISTRY",
    "Backend",
    "Capabilities",
    "backend_class",
    "capabilities",
    "engine_flags",
    "get_backend",
    "names",
    "taking",
]

# name -> "module:Class"
REGISTRY: dict[str, str] = {
    "local": "launchkit.backends.local:LocalBackend",
    "ssh": "launchkit.backends.ssh.backend:SshBackend",
    "mpi": "launchkit.backends.mpi:MpiBackend",
    "sge": "launchkit.backends.sge:SgeBackend",
    "slurm": "launchkit.backends.slurm:SlurmBackend",
    "yarn": "launchkit.backends.yarn:YarnBackend",
}


def names() -> list[str]:
    return list(REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """The class registered as ``name`` (its module imported now)."""
    if name not in REGISTRY:
        raise UsageError(f"unknown launcher {name!r}: expected one of {', '.join(REGISTRY)}")
    module, _, cls = REGISTRY[name].partition(":")
    found: type[Backend] = getattr(importlib.import_module(module), cls)
    return found


def capabilities(name: str) -> Capabilities:
    """What the backend ``name`` declares it can do."""
    return backend_class(name).capabilities


def taking(question: Callable[[Capabilities], bool]) -> list[str]:
    """The backends whose capabilities answer yes (for a refusal: which ones take a flag)."""
    return [name for name in REGISTRY if question(capabilities(name))]


def engine_flags() -> list[EngineFlag]:
    """Every flag of ``launchkit launch`` that a registered backend takes (its ``capabilities.flags``),
    each once, in the registry's order; TypeError for two declarations of one name."""
    found: dict[str, EngineFlag] = {}
    for name in REGISTRY:
        for flag in capabilities(name).flags:
            if found.setdefault(flag.name, flag) != flag:
                raise TypeError(
                    f"backend {name} declares --{flag.name.replace('_', '-')} unlike another backend"
                )
    return list(found.values())


def get_backend(name: str, **options: Any) -> Backend:
    """An instance of the backend ``name``; ``options`` go to its constructor and must be ones
    it declares (``Capabilities.options``): the command line refuses a flag that sets another
    (exit 2) before it gets here, so one left over is the caller's mistake, not dropped."""
    cls = backend_class(name)
    extra = sorted(set(options) - cls.capabilities.options)
    if extra:
        raise TypeError(f"backend {name} takes no option {', '.join(extra)} (its capabilities.options)")
    return cls(**options)
