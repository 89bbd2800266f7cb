"""Horovod's process sets, as far as trainer_core.torch has them: the global one.

``global_process_set`` (every worker) is what every operation's ``process_set=`` takes, and a
``ProcessSet`` listing every rank means the same. A set of fewer ranks, ``add_process_set`` and
``remove_process_set`` are refused with a clear error at the call: operations among a subset of the
workers need a group of their own per set, which trainer_core.torch does not build.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .runtime import Runtime, default

NOT_SUPPORTED = (
    "process sets other than the global one are not supported by trainer_core.torch: "
    "every operation runs among all the workers (use process_set=hvd.global_process_set or leave it out)"
)


class ProcessSet:
    """Horovod's ``ProcessSet(ranks)``; only the set of every rank (``global_process_set``) can be
    used."""

    def __init__(self, ranks_or_comm: Sequence[int] | None = None) -> None:
        if ranks_or_comm is not None and not isinstance(ranks_or_comm, Sequence):
            raise ValueError("ProcessSet takes a list of ranks (trainer_core.torch has no MPI communicators)")
        self.ranks = None if ranks_or_comm is None else sorted(int(r) for r in ranks_or_comm)
        #: Horovod's id: 0 for the global set
        self.process_set_id = 0 if self.ranks is None else None

    def _is_global(self, runtime: Runtime | None = None) -> bool:
        rt = runtime or default
        if self.ranks is None or not rt.initialized():
            return self.ranks is None
        return self.ranks == list(range(rt.backend().size))

    def size(self) -> int:
        return default.backend().size if self.ranks is None else len(self.ranks)

    def rank(self) -> int:
        me = default.backend().rank
        if self.ranks is None:
            return me
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        return self.ranks is None or default.backend().rank in self.ranks

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet({self.ranks})"


#: every worker (Horovod's ``global_process_set``)
global_process_set = ProcessSet()


def check_global(process_set: Any, what: str, runtime: Runtime | None = None) -> None:
    """A clear error when ``process_set`` is not the set of every worker."""
    if process_set is None or process_set is global_process_set:
        return
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"{what}'s process_set must be a ProcessSet, not {type(process_set).__name__}")
    if not process_set._is_global(runtime):
        raise ValueError(f"{what}: {process_set!r}: {NOT_SUPPORTED}")


def check_init_sets(process_sets: Any) -> None:
    """``init(process_sets=...)``: only the global set (or none) is accepted."""
    if process_sets is None:
        return
    if process_sets == "dynamic":
        raise ValueError(f"init(process_sets='dynamic'): {NOT_SUPPORTED}")
    for s in process_sets:
        check_global(s, "init")


def add_process_set(process_set: Any) -> ProcessSet:
    """Refused (see the module's text)."""
    raise ValueError(f"add_process_set: {NOT_SUPPORTED}")


def remove_process_set(process_set: Any) -> bool:
    """Refused (see the module's text)."""
    raise ValueError(f"remove_process_set: {NOT_SUPPORTED}")
