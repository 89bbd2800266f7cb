"""A communication hook for torch's ``DistributedDataParallel``: its gradient buckets reduced by
trainer_core instead of the process group (compressed with error feedback kept per bucket, if asked).

>>> state = HookState(compression=Compression.onebit)      # after trainer_core.torch.init()
>>> ddp_model.register_comm_hook(state, comm_hook)

DDP calls ``comm_hook(state, bucket)`` as each bucket fills during backward; the hook lends the
bucket's flat buffer to trainer_core, starts the (compressed) allreduce and returns a
``torch.futures.Future`` that the state's completer thread fulfils with the averaged buffer when the
operation ends (operations finish in submission order). DDP waits for every future before
``backward()`` returns. The process group still serves DDP's own broadcasts (parameters at
construction, buffers); only the gradients go through trainer_core, on its collective path.

PowerSGD works on matrices: its bucket is cut into its parameters, each compressed in its own
shape (keys ``(bucket index, parameter)``); the other compressors take the flat bucket (key: its
index and length, as DDP rebuilds its buckets after the first iteration).
"""

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from trainer_core.collective import ErrorFeedback

from .backend import Backend, Waitable
from .compression import Compression, Residual, check
from .ops import Average, Sum, resolve_op
from .runtime import Runtime, default
from .tensors import as_array, as_tensor, kind_of

_STOP = object()


class HookState:
    """What ``comm_hook`` needs: the backend, the reduction, the compression and its residuals,
    and the thread that fulfils the futures (``close()`` stops it)."""

    def __init__(
        self, compression: Any = Compression.none, op: str = Average, runtime: Runtime | None = None
    ) -> None:
        self.backend: Backend = (runtime or default).backend()
        if self.backend.comm == "ps":
            raise ValueError("the DDP hook runs on comm='allreduce' (a job without servers, -s 0)")
        self.op = resolve_op(None, op)
        if self.op not in (Average, Sum):
            raise ValueError("the DDP hook sums or averages (op=Average or Sum)")
        self.compression = check(compression)
        self.feedback = ErrorFeedback(dict(compression.params)) if isinstance(compression, Residual) else None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._complete, name="trainer-core-ddp-hook", daemon=True)
        self._thread.start()

    def _complete(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            works, finish, fut = item
            try:
                fut.set_result(finish([w.wait() for w in works]))
            except BaseException as exc:
                fut.set_exception(exc)

    def fulfil(
        self, works: list[Waitable], finish: Callable[[list[Any]], torch.Tensor]
    ) -> torch.futures.Future:
        """A future set to ``finish(results)`` once every work ended (or to its error)."""
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((works, finish, fut))
        return fut

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    # no ``from __future__ import annotations`` here: DDP compares these annotations as objects
    """DDP's hook: ``bucket``'s buffer reduced over every worker by trainer_core."""
    buf = bucket.buffer()
    b = state.backend
    if state.feedback is not None and b.size > 1:
        flat = buf.float() if buf.dtype == torch.bfloat16 else buf
        if isinstance(state.compression, Residual) and state.compression.per_parameter:
            shapes = [p.shape for p in bucket.parameters()]
            pieces, start = [], 0
            for i, shape in enumerate(shapes):
                n = int(torch.Size(shape).numel())
                pieces.append((i, start, n, shape))
                start += n
            ef, idx = state.feedback, bucket.index()
            works = [
                b.compressed_allreduce_async(as_array(flat[a : a + n].view(shape)), ef, (idx, i), state.op)
                for i, a, n, shape in pieces
            ]

            def join(results: list[Any]) -> torch.Tensor:
                for (_, a, n, _), r in zip(pieces, results, strict=True):
                    buf[a : a + n].copy_(as_tensor(r, flat.dtype).reshape(-1))
                return buf

            return state.fulfil(works, join)
        work = b.compressed_allreduce_async(
            as_array(flat), state.feedback, (bucket.index(), buf.numel()), state.op
        )
        return state.fulfil([work], lambda r: buf.copy_(as_tensor(r[0], flat.dtype)))
    sent, ctx = state.compression.compress(buf) if state.feedback is None else (buf, None)
    lent = as_array(sent)
    work = b.allreduce_async(lent, state.op, kind_of(sent), out=lent, fuse=False)  # DDP fused it

    def finish(results: list[Any]) -> torch.Tensor:
        out = (
            state.compression.decompress(as_tensor(results[0], sent.dtype, sent.shape), ctx)
            if state.feedback is None
            else sent
        )
        return out if out.data_ptr() == buf.data_ptr() else buf.copy_(out)

    return state.fulfil([work], finish)
