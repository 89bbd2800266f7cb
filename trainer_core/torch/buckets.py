"""Which parameters' gradients travel together, and when a bucket may start.

``plan`` cuts the parameters, in reverse order (autograd produces the last layers' gradients
first, as DDP assumes), into buckets of one dtype of at most ``limit`` bytes (a larger parameter
alone; ``limit=0``: one bucket per parameter). A parameter of ``ALONE`` bytes or more also travels
alone, in its own memory: copying it into a bucket's buffer and back costs more than the operation
it would save (measured on one host, 4 ranks on 2 cores: a copy in and out about 0.2 ms per MiB,
an allreduce's own cost about 0.2-0.3 ms; the 4.2M-parameter MLP of bench/torch_step.py, two
8 MiB weights, stepped in 35.0 ms instead of 38.6 with 25 MiB buckets). Not with trainer_core's
compressors (the optimizer passes ``alone=None``): their allreduce copies its input anyway, and
each more bucket costs its own coding and error feedback (1-bit: the same MLP stepped in 66 ms
with its weights alone, 55 ms in one bucket). The plan depends only on
the parameters' order, dtypes and sizes, so every rank makes the same buckets.

``Tracker`` follows one step: ``ready(i)`` when parameter ``i``'s gradient is final; a bucket
whose parameters are all ready starts, but only after every bucket before it started, so every
rank starts the same operations in the same order whatever order its hooks ran in. ``rest()``
(in ``step()``) gives the buckets that never became ready (unused parameters), in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer_core.collective import fusion

#: a parameter of at least this many bytes gets a bucket of its own (see the module's text)
ALONE = 1024 * 1024


def plan(sizes: Sequence[tuple[str, int]], limit: int, alone: int | None = ALONE) -> list[list[int]]:
    """Buckets of parameter indices for parameters given as ``(dtype, nbytes)``, in reverse:
    ``collective.fusion.plan`` over each run of the reversed list between parameters of ``alone``
    bytes or more, which get one each (each bucket's members from the last; ``alone=None``: no
    parameter is alone for its size)."""
    last = len(sizes) - 1
    out: list[list[int]] = []
    run: list[int] = []
    for j, (_, nbytes) in enumerate(reversed(sizes)):
        if alone is None or nbytes < alone:
            run.append(j)
            continue
        out += [*_fused(sizes, last, run, limit), [last - j]]
        run = []
    return out + _fused(sizes, last, run, limit)


def _fused(sizes: Sequence[tuple[str, int]], last: int, run: list[int], limit: int) -> list[list[int]]:
    """``fusion.plan`` of the reversed positions ``run`` (parameter ``last - j`` at position ``j``)."""
    buckets = fusion.plan([sizes[last - j] for j in run], limit)
    return [[last - run[k] for k in bucket] for bucket in buckets]


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
