"""A torch test's ranks in one process: ``on_ranks(w, fn)`` runs ``fn(rank, runtime)`` on ``w``
threads, each with a ``trainer_core.torch`` runtime over a collective group of an in-process
fabric (no processes: the unit tier)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_core.collective import Group
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.torch.backend import Collective
from trainer_core.torch.runtime import Runtime


def on_ranks(w: int, fn: Callable[[int, Runtime], Any]) -> list[Any]:
    """``fn(rank, runtime)`` on ``w`` threads linked by an in-process fabric."""
    fabric = Fabric(w, timeout=30)

    def body(r: int) -> Any:
        rt = Runtime()
        rt.attach(Collective(Group(fabric.endpoint(r))))
        try:
            return fn(r, rt)
        finally:
            rt.shutdown()

    return run_ranks(w, body, timeout=60)
