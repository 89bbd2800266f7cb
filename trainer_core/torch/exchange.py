"""How one ``DistributedOptimizer``'s gradient buckets travel, on each path.

``start(b, grads)`` sends bucket ``b`` (its gradients, in bucket order) and returns at once;
``finish`` waits and writes the reduced gradients back into the same tensors (or, with a server-side
optimizer, the servers' new weights into the parameters).

* Horovod compressors (``none``, ``fp16``, a user's class) on the collective path: the bucket is
  flattened into one buffer (a lone contiguous gradient is lent as it is), compressed, allreduced;
* trainer_core's compressors: ``Group.compressed_allreduce`` with error feedback kept per bucket
  (PowerSGD's buckets hold one parameter each, in its own shape);
* ``comm="ps"``: a ``pushpull`` per bucket on a key of its own, in order on the KV store's thread
  (``Average`` divides before the push, so a server-side optimizer gets the mean as well);
  trainer_core's compressors through the store's ``set_gradient_compression``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainer_core.collective import ErrorFeedback
from trainer_core.optim.server import to_spec
from trainer_core.xp import array_module, to_host

from .backend import KV, Backend, Done, Waitable
from .compression import Residual
from .tensors import as_array, as_tensor, kind_of


@dataclass
class Pending:
    """One bucket on its way."""

    bucket: int
    grads: list[torch.Tensor]
    work: Waitable
    ctx: Any = None
    sent: torch.Tensor | None = None


def flatten(grads: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous buffer of the gradients (a lone contiguous one as it is: no copy)."""
    if len(grads) == 1 and grads[0].is_contiguous():
        return grads[0]
    return torch.cat([g.reshape(-1) for g in grads])


def scatter(flat: torch.Tensor, into: list[torch.Tensor]) -> None:
    """Copy consecutive pieces of ``flat`` into ``into``, converting the dtype if needed (nothing
    to do when ``flat`` already is the one tensor's memory)."""
    flat = flat.reshape(-1)
    if len(into) == 1 and flat.data_ptr() == into[0].data_ptr() and flat.dtype == into[0].dtype:
        return
    start = 0
    for t in into:
        n = t.numel()
        t.copy_(flat[start : start + n].view(t.shape))
        start += n


class Fused:
    """Each bucket's flat buffer, kept from step to step (made at the bucket's first use, in its
    gradients' dtype and on their device): the gradients are copied into it, it is reduced in
    place, and ``scatter`` copies the result back. A bucket of one contiguous gradient needs none
    (the gradient's own memory travels); gradients of several dtypes are concatenated afresh."""

    def __init__(self) -> None:
        self._flat: dict[int, torch.Tensor] = {}

    def gather(self, b: int, grads: list[torch.Tensor]) -> torch.Tensor:
        if len(grads) == 1 and grads[0].is_contiguous():
            return grads[0]
        dtype, device = grads[0].dtype, grads[0].device
        if any(g.dtype != dtype or g.device != device for g in grads):
            return flatten(grads)
        n = sum(g.numel() for g in grads)
        flat = self._flat.get(b)
        if flat is None or flat.numel() != n or flat.dtype != dtype or flat.device != device:
            flat = self._flat[b] = torch.empty(n, dtype=dtype, device=device)
        start = 0
        for g in grads:
            flat[start : start + g.numel()].view(g.shape).copy_(g)
            start += g.numel()
        return flat


class Exchange:
    """The buckets of one optimizer over ``backend`` (see the module's text)."""

    def __init__(
        self,
        backend: Backend,
        op: str,
        compression: Any,
        prefix: str,
        params: list[torch.Tensor],
        buckets: list[list[int]],
        server_optimizer: Any = None,
    ) -> None:
        self.backend, self.op, self.compression = backend, op, compression
        self.params, self.buckets = params, buckets
        self.residual = isinstance(compression, Residual)
        self.feedback = (
            ErrorFeedback(dict(compression.params)) if self.residual and backend.comm == "allreduce" else None
        )
        self.keys = [f"__torch__/grad/{prefix}/{b}" for b in range(len(buckets))]
        self.fused = Fused()
        self.server_optimizer = server_optimizer is not None
        if isinstance(backend, KV):
            self._declare(backend, server_optimizer)

    def _declare(self, backend: KV, server_optimizer: Any) -> None:
        """Every worker, at construction: the bucket keys (the parameters themselves when the
        servers update them: ``init`` stores rank 0's), the compression and the optimizer."""
        values = []
        for members in self.buckets:
            flat = flatten(
                [self.params[i].detach() for i in members]
            )  # a lone one keeps its shape (PowerSGD)
            flat = flat.float() if flat.dtype == torch.bfloat16 else flat
            host = np.array(to_host(as_array(flat)), copy=True)  # a CUDA tensor: copied to the host
            values.append(host if self.server_optimizer else np.zeros_like(host))
        spec = None if server_optimizer is None else to_spec(server_optimizer)

        def setup() -> None:
            if self.residual:
                backend.kv.set_gradient_compression(dict(self.compression.params))
            backend.declare(self.keys, values)
            if spec is not None:
                backend.kv.set_optimizer(spec)
                backend.server_optimizer = True

        backend.submit("declare", setup).wait()

    def start(self, b: int, grads: list[torch.Tensor]) -> Pending:
        if isinstance(self.backend, KV):
            return self._start_ps(b, grads)
        if self.residual:
            assert self.feedback is not None or self.backend.size == 1
            flat = grads[0].detach() if len(grads) == 1 else self.fused.gather(b, grads)
            flat = flat.float() if flat.dtype == torch.bfloat16 else flat
            arr = as_array(flat)
            if self.feedback is None:  # one rank: nothing to compress against
                return Pending(b, grads, Done(arr))
            work = self.backend.compressed_allreduce_async(arr, self.feedback, b, self.op)
            return Pending(b, grads, work)
        sent, ctx = self.compression.compress(self.fused.gather(b, grads))
        lent = as_array(sent)  # the result comes back into it: a lone gradient's own memory
        # its own fusion (the optimizer's buckets): not fused again, nor waiting for a cycle
        work = self.backend.allreduce_async(lent, self.op, kind_of(sent), out=lent, fuse=False)
        return Pending(b, grads, work, ctx, sent)

    def _start_ps(self, b: int, grads: list[torch.Tensor]) -> Pending:
        assert isinstance(self.backend, KV)
        kv, key = self.backend.kv, self.keys[b]
        flat = self.fused.gather(b, grads)
        sent, ctx = (flat, None) if self.residual else self.compression.compress(flat)
        sent = sent.float() if sent.dtype == torch.bfloat16 else sent
        if self.op == "mean":
            sent = sent / self.backend.size
        arr = as_array(sent)
        xp = array_module(arr)  # a CUDA tensor stays on its device: the store compresses it there
        data = xp.array(arr, copy=True)  # taken now: the gradient may change before the store runs

        def run() -> Any:
            target = xp.empty_like(data)
            kv.pushpull(key, data, target)
            return target

        return Pending(b, grads, self.backend.submit("pushpull", run), ctx, sent)

    def finish(self, p: Pending) -> None:
        """Wait for ``p`` and write its result where it belongs."""
        result = p.work.wait()
        with torch.no_grad():
            if isinstance(self.backend, KV):
                assert p.sent is not None
                got = as_tensor(result, p.sent.dtype)
                if not self.residual:
                    got = self.compression.decompress(got, p.ctx)
                members = [self.params[i] for i in self.buckets[p.bucket]]
                scatter(got, [m.data for m in members] if self.server_optimizer else p.grads)
            elif p.sent is None:  # trainer_core's compressors (float32 for bfloat16)
                scatter(
                    as_tensor(
                        result, torch.float32 if p.grads[0].dtype == torch.bfloat16 else p.grads[0].dtype
                    ),
                    p.grads,
                )
            else:
                scatter(self.compression.decompress(as_tensor(result, p.sent.dtype), p.ctx), p.grads)
