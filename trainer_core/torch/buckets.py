"""Which parameters' gradients travel together, and when a bucket may start.

``plan`` cuts the parameters, in reverse order (autograd produces the last layers' gradients
first, as DDP assumes), into buckets of one dtype of at most ``limit`` bytes (a larger parameter
alone; ``limit=0``: one bucket per parameter). The plan depends only on the parameters' order,
dtypes and sizes, so every rank makes the same buckets.

``Tracker`` follows one step: ``ready(i)`` when parameter ``i``'s gradient is final; a bucket
whose parameters are all ready starts, but only after every bucket before it started, so every
rank starts the same operations in the same order whatever order its hooks ran in. ``rest()``
(in ``step()``) gives the buckets that never became ready (unused parameters), in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer_core.collective import fusion


def plan(sizes: Sequence[tuple[str, int]], limit: int) -> list[list[int]]:
    """Buckets of parameter indices for parameters given as ``(dtype, nbytes)``, in reverse:
    ``collective.fusion.plan`` over the reversed list (each bucket's members from the last)."""
    last = len(sizes) - 1
    return [[last - j for j in bucket] for bucket in fusion.plan(list(reversed(sizes)), limit)]


class Tracker:
    """The readiness of one step's buckets (see the module's text)."""

    def __init__(self, buckets: list[list[int]]) -> None:
        self.buckets = buckets
        self.of = {p: b for b, members in enumerate(buckets) for p in members}
        self.reset()

    def reset(self) -> None:
        self._missing = [len(b) for b in self.buckets]
        self._ready: set[int] = set()
        self.started = 0  # buckets 0 .. started-1 have started

    def ready(self, param: int) -> list[int]:
        """Mark ``param`` ready; the buckets that may start now, in order."""
        if param in self._ready:
            raise RuntimeError(f"parameter {param} was made ready twice in one step")
        self._ready.add(param)
        self._missing[self.of[param]] -= 1
        return self._advance()

    def _advance(self) -> list[int]:
        out = []
        while self.started < len(self.buckets) and self._missing[self.started] == 0:
            out.append(self.started)
            self.started += 1
        return out

    def is_ready(self, param: int) -> bool:
        return param in self._ready

    def rest(self) -> list[int]:
        """The buckets not started yet (their missing parameters count as ready), in order."""
        out = list(range(self.started, len(self.buckets)))
        self.started = len(self.buckets)
        return out

    def pending(self) -> bool:
        """Whether some parameter was made ready this step."""
        return bool(self._ready)
