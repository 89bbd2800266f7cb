"""Launch backends, chosen by name. A new backend is one module plus one line here; each is
imported only when used, so a backend's heavy dependency (fabric for ssh, ...) loads lazily."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from launchkit.backends.base import Backend
from launchkit.errors import UsageError

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


def get_backend(name: str, **options: Any) -> Backend:
    """An instance of the backend ``name``; ``options`` go to its constructor (backends that
    take none ignore them)."""
    if name not in REGISTRY:
        raise UsageError(f"unknown launcher {name!r}: expected one of {', '.join(REGISTRY)}")
    module, _, cls = REGISTRY[name].partition(":")
    factory = getattr(importlib.import_module(module), cls)
    params = inspect.signature(factory).parameters
    backend: Backend = factory(**{k: v for k, v in options.items() if k in params})
    return backend
