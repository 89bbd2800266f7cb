"""Launch backends, chosen by name. A new backend is one module plus one line here; each is
imported only when used, so a backend's heavy dependency (paramiko, ...) loads lazily."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from launchkit.backends.base import Backend
from launchkit.errors import NotImplementedBackend, UsageError

# name -> "module:Class", or None while the backend is not available in this version.
REGISTRY: dict[str, str | None] = {
    "local": "launchkit.backends.local:LocalBackend",
    "ssh": "launchkit.backends.ssh:SshBackend",
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
    target = REGISTRY[name]
    if target is None:
        raise NotImplementedBackend(
            f"the {name!r} launcher is not implemented yet in this version; "
            "use --launcher local, or --dry-run to see the plan"
        )
    module, _, cls = target.partition(":")
    factory = getattr(importlib.import_module(module), cls)
    params = inspect.signature(factory).parameters
    backend: Backend = factory(**{k: v for k, v in options.items() if k in params})
    return backend
