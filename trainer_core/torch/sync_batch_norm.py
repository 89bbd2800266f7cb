"""Horovod's ``SyncBatchNorm``: batch normalization over the batch of every worker at once.

In training with more than one worker, each rank's per-channel sum, sum of squares and count are
summed over the ranks by one (differentiable) allreduce; the mean and the biased variance of the
whole batch normalize every rank's part, the running statistics follow the unbiased variance, as
``torch.nn.BatchNorm`` on the concatenated batch would (CPU and CUDA tensors alike). The gradient
flows back through the allreduce to every rank's input. In evaluation, or with one worker, it is
``torch.nn.BatchNorm``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .ops import Sum, allreduce
from .runtime import Runtime, default


class SyncBatchNorm(_BatchNorm):
    """Horovod's ``SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats)``
    (``runtime=``: the ``Runtime`` to reduce over; the default one otherwise)."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        runtime: Runtime | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self._runtime = runtime

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        size = (self._runtime or default).backend().size
        if not self.training or size == 1:
            return super().forward(input)
        return self._synced(input)

    def _synced(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        local_n = x.numel() // c if c else 0
        stats = torch.cat(
            [x.sum(dims), (x * x).sum(dims), torch.full((1,), float(local_n), dtype=x.dtype, device=x.device)]
        )
        total = allreduce(stats, op=Sum, runtime=self._runtime)
        n = total[-1]
        count = round(float(n.detach()))
        if count <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got {count} over every rank"
            )
        mean = total[:c] / n
        var = (total[c : 2 * c] / n - mean * mean).clamp_min(0)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            self._update_running(mean.detach(), var.detach() * (count / (count - 1)))
        shape = [1, c] + [1] * (x.dim() - 2)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def _update_running(self, mean: torch.Tensor, unbiased: torch.Tensor) -> None:
        rm, rv = self.running_mean, self.running_var
        assert self.num_batches_tracked is not None and rm is not None and rv is not None
        self.num_batches_tracked.add_(1)
        factor: Any = self.momentum
        if factor is None:  # a cumulative moving average, as BatchNorm's
            factor = 1.0 / float(self.num_batches_tracked)
        with torch.no_grad():
            rm.mul_(1 - factor).add_(mean.to(rm.dtype), alpha=factor)
            rv.mul_(1 - factor).add_(unbiased.to(rv.dtype), alpha=factor)
