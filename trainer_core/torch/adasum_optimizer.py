"""``DistributedOptimizer(op=Adasum)``: Horovod's Adasum optimizer. The gradients are not
reduced: each rank's optimizer takes its step on its own gradients, and what is combined across
ranks is each parameter's update, with Adasum (``folded``), so that every rank ends the step with
``start + Adasum(update_0, ..., update_n-1)``, the same bits everywhere.

>>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)

``step()`` keeps each parameter's value, runs the user's rule, and reduces the differences in one
grouped operation (in parameter order, the same on every rank; ``Compression.fp16`` sends them
as float16, as Horovod's). ``backward_passes_per_step``
accumulates gradients locally before the step, as Horovod's; ``synchronize()`` has nothing to wait
for (the exchange is inside ``step``), and ``skip_synchronize()`` is accepted for scripts written
for the gradient optimizer. Floating-point parameters only, a power-of-two number of ranks, on
either path (the parameter servers gather the updates as they gather any tensor).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .ops import Adasum, grouped_allreduce
from .runtime import Runtime


class _AdasumDistributed:
    """The methods mixed into the user's optimizer class (see the module's text)."""

    def _setup_adasum(self, bpps: int, compression: Any, runtime: Runtime | None, process_set: Any) -> None:
        self.backward_passes_per_step = bpps
        self._adasum_compression = compression
        self._adasum_runtime = runtime
        self.process_set = process_set

    def _params(self) -> list[torch.Tensor]:
        groups: list[dict[str, Any]] = self.param_groups  # type: ignore[attr-defined]
        return [p for g in groups for p in g["params"]]

    def synchronize(self) -> None:
        """Nothing to wait for: the updates are exchanged inside ``step``."""

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        yield

    def step(self, closure: Any = None) -> Any:
        params = self._params()
        for p in params:
            if not p.is_floating_point():
                raise ValueError(f"op=Adasum updates floating-point parameters, not {p.dtype}")
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
        loss = super().step(closure)  # type: ignore[misc]
        with torch.no_grad():
            deltas = [p.detach() - s for p, s in zip(params, starts, strict=True)]
            if deltas:
                reduced = grouped_allreduce(
                    deltas,
                    compression=self._adasum_compression,
                    op=Adasum,
                    process_set=self.process_set,
                    runtime=self._adasum_runtime,
                )
                for p, s, d in zip(params, starts, reduced, strict=True):
                    p.copy_(s + d)
        return loss


def adasum_optimizer(
    optimizer: torch.optim.Optimizer,
    bpps: int,
    compression: Any,
    runtime: Runtime | None,
    process_set: Any = None,
) -> Any:
    """``optimizer`` as Horovod's Adasum optimizer (its class subclassed on the fly; no copy);
    ``process_set``: the updates are combined among its ranks (None: every worker's)."""
    cls = type(optimizer.__class__.__name__, (_AdasumDistributed, optimizer.__class__), {})
    dist: Any = object.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)
    dist._setup_adasum(bpps, compression, runtime, process_set)
    return dist
