"""Distributed learners with CNTK's Python names, over the KV store or collectives.

Each wraps a local learner from ``optim.local`` (which owns ``params``, a dict of arrays updated
in place) and a ``Communicator`` (``train.comm``): ``kv=`` a KV store (``kv.create(...)``:
``local`` in one process, ``dist_sync`` or ``dist_async`` in a launched job; the parameter
server's ``KVCommunicator`` is built on it), or ``communicator=`` one built already, e.g. a
``CollectiveCommunicator`` (allreduce among the workers, no servers; not for the async learner).
Construction is collective: every worker builds the same learner at the same point (the
communicator ``declare``s the keys: the KV store stores rank 0's values). Then

>>> dl = data_parallel_distributed_learner(momentum_learner, kv=kv, num_quantization_bits=1)
>>> dl.update(grads, num_samples)   # one step; every worker calls it in lockstep
>>> dl.flush()                      # before evaluating: periodic learners aggregate what is pending

Algorithms (``N`` workers, sums are what the communicator's ``aggregate`` returns: a KV
``pushpull``, or an allreduce):

* ``data_parallel_distributed_learner``: every step, ``g = (sum of the workers' gradients) / N``,
  then the local learner's step with ``g``. Each worker pushes its gradient divided by ``N``, so
  the servers' sum is the mean and pushes and pulls carry values on the gradient's scale (one
  2-bit threshold suits both). With 1 or 2 bits the gradients travel compressed
  (``kv.set_gradient_compression``, ``{'type': '1bit'}`` or ``{'type': '2bit', 'threshold': t}``).
* ``block_momentum_distributed_learner`` (BMUF, Chen and Huo 2016): each worker runs the local
  learner on its own data; every ``block_size / N`` samples per worker, ``G = sum_i (w_prev -
  w_i)`` (``w_prev``: where the block started; each worker pushes its delta divided by ``N``, the
  servers' sum is the mean, times ``N``); ``v = eta * v + (1 - eta) * zeta * G``; ``W = W - v``;
  the next block starts from ``w = w_prev = W``, or with Nesterov (the paper's NBM) from the
  look-ahead ``W - eta * v``; optionally the local momentum is reset. The filtered iterate ``W``
  is not stored: it is ``w_prev + eta * v_old`` (Nesterov) or ``w_prev``, so a Nesterov block
  moves ``w_prev`` by ``-eta**2 * v_old - (1 + eta) * (1 - eta) * zeta * G``. CNTK's
  ``BlockMomentumSGD`` keeps the look-ahead point as ``W`` (``w = w_prev - v - eta * v``): that is
  heavy-ball momentum with ``1 + eta`` times the block learning rate, which amplifies every error
  in ``G`` (a compressed exchange's) 1.75 times more at ``eta = 3/4`` (``docs/learners.md``).
  With the default ``eta = 1 - 1/N`` the filter is the paper's ``v = eta * v + zeta *
  mean_i(w_prev - w_i)``; ``eta = exp(-block_size / block_momentum_as_time_constant)``.
* ``model_averaging_distributed_learner``: every ``sync_period`` samples per worker, the model
  becomes the mean of the workers' models (BMUF with ``eta = 0``, ``zeta = 1/N``).
* ``async_sgd_distributed_learner``: the local learner's rule runs on the servers
  (``kv.set_optimizer``); every step pushes the gradients and pulls the parameters in one
  ``pushpull``; with ``dist_async`` the servers apply each push at once, no worker waits.

``distributed_after``: the first ``distributed_after`` samples (counted on each worker) are trained
locally; then the workers' models are made identical (averaged; rank 0's for the async learner)
and distributed training starts (CNTK's warm start). With ``distributed_after=0`` every worker
starts from rank 0's initial parameters. All workers must pass the same ``num_samples`` sequence,
since the sync points are computed from it.
"""

from __future__ import annotations

import math
from typing import Any

from trainer_core.compression import get_compressor
from trainer_core.optim.local import Learner, server_optimizer_spec
from trainer_core.train.comm import Communicator, KVCommunicator
from trainer_core.xp import array_module

COMPRESSION_BITS = (1, 2, 32)


def compression_for_bits(bits: int, threshold: float = 0.5) -> dict[str, Any] | None:
    """KV-store compression params for ``num_quantization_bits`` (``None`` for 32)."""
    if bits not in COMPRESSION_BITS:
        raise ValueError(f"num_quantization_bits must be one of {COMPRESSION_BITS}, got {bits!r}")
    if bits == 1:
        return {"type": "1bit"}
    if bits == 2:
        return {"type": "2bit", "threshold": float(threshold)}
    return None


def communicator_of(kv: Any = None, communicator: Communicator | None = None) -> Communicator:
    """The communicator to use: ``communicator``, else a ``KVCommunicator`` over ``kv`` (exactly
    one of the two)."""
    if (kv is None) == (communicator is None):
        raise ValueError("a distributed learner takes either kv= (a KV store) or communicator=, not both")
    return communicator if communicator is not None else KVCommunicator(kv)


class DistributedLearner:
    """Base: the local learner, the communicator (``comm``: a ``Communicator``, or a KV store),
    the warm start and the sample count."""

    def __init__(
        self,
        learner: Learner,
        comm: Any,
        distributed_after: int = 0,
        compression: dict[str, Any] | None = None,
        key_prefix: str = "",
    ) -> None:
        if distributed_after < 0:
            raise ValueError(f"distributed_after must be >= 0, got {distributed_after}")
        self.learner = learner
        self._comm: Communicator = comm if hasattr(comm, "aggregate") else KVCommunicator(comm)
        self.kv: Any = getattr(self._comm, "kv", None)  # the KV store (None on the collective path)
        self.params = learner.params
        self.names = list(self.params)
        self.keys = [f"{key_prefix}{n}" for n in self.names]
        self.distributed_after = int(distributed_after)
        self.compression = compression
        self.total_number_of_samples_seen = 0
        self.distributed = False
        self.syncs = 0
        self._buf = {n: array_module(p).empty_like(p) for n, p in self.params.items()}
        self._comm.declare(self.keys, [self.params[n] for n in self.names])
        if self.distributed_after == 0:
            self._start()

    # -- public -------------------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        return self._comm.num_workers()

    def communicator(self) -> Communicator:
        """This learner's ``Communicator`` (given, or built with the learner over its KV store)."""
        return self._comm

    def payload_bytes_per_sync(self) -> int:
        """Payload bytes one worker puts on the wire per exchange (push plus pull of every key),
        computed from the compressor's packed size (``wire_bytes``); headers are not counted, and
        keys split over several servers are counted as one part."""
        compressor = get_compressor(self.compression if self.distributed else None)
        total = 0
        for p in self.params.values():
            total += 2 * compressor.wire_bytes(int(p.size), p.dtype, p.shape)
        return total

    def update(self, grads: dict[str, Any], num_samples: int) -> bool:
        """One step with this worker's ``grads`` of ``num_samples`` samples. True when this step
        communicated (always for data parallel and async; at block ends for the periodic ones)."""
        self.start_if_due()
        self.total_number_of_samples_seen += int(num_samples)
        if not self.distributed:
            self.learner.update(grads)
            return False
        return self._step(grads, int(num_samples))

    def start_if_due(self) -> bool:
        """Start distributed training now if the warm start is over (``update`` calls it; a caller
        may call it first to tell the one-time warm-start exchange from the training traffic).
        Collective. True when it started now."""
        if self.distributed or self.total_number_of_samples_seen < self.distributed_after:
            return False
        self._start()
        return True

    def flush(self) -> bool:
        """Aggregate what is pending (periodic learners); every worker calls it at the same point."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """This learner's own state (not the local learner's) as named arrays and scalars."""
        return {"samples_seen": self.total_number_of_samples_seen, "distributed": self.distributed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``; call on every worker after the parameters are restored."""
        self.total_number_of_samples_seen = int(state["samples_seen"])
        if bool(state.get("distributed", False)) and not self.distributed:
            self._start()

    # -- hooks --------------------------------------------------------------------------------
    def _start(self) -> None:
        """Make the workers' models identical, then turn on compression / the server optimizer."""
        if self.total_number_of_samples_seen == 0:
            self._comm.broadcast(self.keys, [self.params[n] for n in self.names])
        else:
            self._average(self.params)
        if self.compression is not None:
            self._comm.set_compression(self.compression)
        self.distributed = True

    def _average(self, values: dict[str, Any]) -> None:
        """Replace ``values`` (same names as params) in place by their mean over the workers."""
        bufs = [self._buf[n] for n in self.names]
        self._comm.aggregate(self.keys, [values[n] for n in self.names], bufs)
        for n in self.names:
            values[n][...] = self._buf[n] / self.num_workers

    def _step(self, grads: dict[str, Any], num_samples: int) -> bool:
        raise NotImplementedError


class DataParallelLearner(DistributedLearner):
    """Synchronous data-parallel SGD: average the gradients every step, then the local step."""

    def _step(self, grads: dict[str, Any], num_samples: int) -> bool:
        bufs = [self._buf[n] for n in self.names]
        n = self.num_workers
        self._comm.aggregate(self.keys, [grads[k] / n for k in self.names], bufs)
        self.learner.update({k: self._buf[k] for k in self.names})
        self.syncs += 1
        return True


class BlockMomentumLearner(DistributedLearner):
    """Periodic model aggregation with a block-level momentum filter (BMUF; model averaging with
    ``block_momentum=0``, ``block_learning_rate=1/N``, no Nesterov, no reset)."""

    def __init__(
        self,
        learner: Learner,
        comm: Any,
        sync_period: int,
        block_momentum: float,
        block_learning_rate: float = 1.0,
        use_nesterov_momentum: bool = True,
        reset_sgd_momentum_after_aggregation: bool = True,
        distributed_after: int = 0,
        compression: dict[str, Any] | None = None,
        key_prefix: str = "",
    ) -> None:
        if sync_period < 1:
            raise ValueError(f"the sync period must be at least one sample, got {sync_period}")
        if not 0 <= block_momentum < 1:
            raise ValueError(f"block momentum must be in [0, 1), got {block_momentum}")
        self.sync_period = int(sync_period)
        self.block_momentum = float(block_momentum)
        self.block_learning_rate = float(block_learning_rate)
        self.use_nesterov_momentum = use_nesterov_momentum
        self.reset_sgd_momentum_after_aggregation = reset_sgd_momentum_after_aggregation
        self.samples_since_sync = 0
        xp_of = {n: array_module(p) for n, p in learner.params.items()}
        self.prev = {n: p.copy() for n, p in learner.params.items()}
        self.smoothed = {n: xp_of[n].zeros_like(p) for n, p in learner.params.items()}
        super().__init__(learner, comm, distributed_after, compression, key_prefix)

    def _start(self) -> None:
        super()._start()
        for n, p in self.params.items():
            self.prev[n][...] = p
        self.samples_since_sync = 0

    def _step(self, grads: dict[str, Any], num_samples: int) -> bool:
        self.learner.update(grads)
        self.samples_since_sync += num_samples
        if self.samples_since_sync < self.sync_period:
            return False
        self._aggregate()
        return True

    def flush(self) -> bool:
        if not self.distributed or self.samples_since_sync == 0:
            return False
        self._aggregate()
        return True

    def _aggregate(self) -> None:
        workers = self.num_workers
        deltas = [(self.prev[n] - self.params[n]) / workers for n in self.names]
        bufs = [self._buf[n] for n in self.names]
        self._comm.aggregate(self.keys, deltas, bufs)  # the mean delta: values on the deltas' scale
        eta = self.block_momentum
        gain = (1.0 - eta) * self.block_learning_rate * workers  # times the mean: CNTK's sum
        for n in self.names:
            v, w = self.smoothed[n], self.params[n]
            # the filtered iterate W(t-1): the block started from it minus the look-ahead eta * v
            w[...] = self.prev[n] + eta * v if self.use_nesterov_momentum else self.prev[n]
            v *= eta
            v += gain * self._buf[n]
            w -= v  # W(t)
            if self.use_nesterov_momentum:
                w -= eta * v  # the next block starts from the look-ahead W(t) - eta * v(t)
            self.prev[n][...] = w
        if self.reset_sgd_momentum_after_aggregation:
            self.learner.reset_momentum()
        self.samples_since_sync = 0
        self.syncs += 1

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["samples_since_sync"] = self.samples_since_sync
        out.update({f"prev/{n}": a for n, a in self.prev.items()})
        out.update({f"smoothed/{n}": a for n, a in self.smoothed.items()})
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for n in self.names:
            self.prev[n][...] = state[f"prev/{n}"]
            self.smoothed[n][...] = state[f"smoothed/{n}"]
        self.samples_since_sync = int(state["samples_since_sync"])


class AsyncSGDLearner(DistributedLearner):
    """Asynchronous SGD through the parameter server: the servers run the local learner's rule."""

    def __init__(self, learner: Learner, kv: Any, distributed_after: int = 0, key_prefix: str = "") -> None:
        if hasattr(kv, "aggregate"):  # a communicator: only the parameter server's will do
            kv = getattr(kv, "kv", None)
        if kv is None:
            raise ValueError("asynchronous SGD runs on the parameter server: it needs a KV store")
        rescale = 1.0 if "async" in str(kv.type) else 1.0 / int(kv.num_workers)
        self.spec = server_optimizer_spec(learner, rescale)
        super().__init__(learner, kv, distributed_after, None, key_prefix)

    def _start(self) -> None:
        values = [self.params[n] for n in self.names]
        if self.total_number_of_samples_seen > 0:
            if "async" in str(self.kv.type):  # a push replaces the value: rank 0's model is kept
                if self.kv.rank == 0:
                    self.kv.push(self.keys, values)
                self.kv.barrier()
            else:
                self._average(self.params)
        self.kv.pull(self.keys, values)
        self.kv.barrier()
        self.kv.set_optimizer(self.spec)
        self.distributed = True

    def _step(self, grads: dict[str, Any], num_samples: int) -> bool:
        self.kv.pushpull(self.keys, [grads[n] for n in self.names], [self.params[n] for n in self.names])
        self.syncs += 1
        return True


def data_parallel_distributed_learner(
    learner: Learner,
    distributed_after: int = 0,
    num_quantization_bits: int = 32,
    use_async_buffered_parameter_update: bool = False,
    *,
    kv: Any = None,
    threshold: float = 0.5,
    compression: dict[str, Any] | None = None,
    communicator: Communicator | None = None,
) -> DataParallelLearner:
    """Synchronous data-parallel SGD; 1 or 2 bits compress the gradients on the wire (``threshold``
    is the 2-bit quantizer's; ``compression`` overrides the params, e.g. ``{'type': 'topk'}``).
    ``use_async_buffered_parameter_update`` must be False, as in CNTK."""
    if use_async_buffered_parameter_update:
        raise ValueError("use_async_buffered_parameter_update must be False (as CNTK)")
    params = (
        compression if compression is not None else compression_for_bits(num_quantization_bits, threshold)
    )
    return DataParallelLearner(learner, communicator_of(kv, communicator), distributed_after, params)


def block_momentum_distributed_learner(
    learner: Learner,
    block_size: int,
    block_momentum_as_time_constant: float | None = None,
    use_nestrov_momentum: bool = True,
    reset_sgd_momentum_after_aggregation: bool = True,
    block_learning_rate: float = 1.0,
    distributed_after: int = 0,
    *,
    kv: Any = None,
    compression: dict[str, Any] | None = None,
    communicator: Communicator | None = None,
) -> BlockMomentumLearner:
    """BMUF: ``block_size`` samples over all workers per block (``block_size / N`` per worker)."""
    comm = communicator_of(kv, communicator)
    n = comm.num_workers()
    if block_size < n:
        raise ValueError(f"block_size ({block_size}) must be at least the number of workers ({n})")
    if block_momentum_as_time_constant is None:
        eta = 1.0 - 1.0 / n
    elif block_momentum_as_time_constant <= 0:
        raise ValueError("block_momentum_as_time_constant must be positive")
    else:
        eta = math.exp(-block_size / block_momentum_as_time_constant)
    return BlockMomentumLearner(
        learner, comm, block_size // n, eta, block_learning_rate, use_nestrov_momentum,
        reset_sgd_momentum_after_aggregation, distributed_after, compression,
    )  # fmt: skip


def block_momentum_time_constant(block_momentum: float, block_size: int) -> float:
    """``-block_size / ln(block_momentum)``: the time constant that gives ``block_momentum``."""
    if not 0 < block_momentum < 1:
        raise ValueError(f"block momentum must be in (0, 1), got {block_momentum}")
    return -block_size / math.log(block_momentum)


def model_averaging_distributed_learner(
    learner: Learner,
    sync_period: int,
    distributed_after: int = 0,
    *,
    kv: Any = None,
    compression: dict[str, Any] | None = None,
    communicator: Communicator | None = None,
) -> BlockMomentumLearner:
    """Model averaging every ``sync_period`` samples per worker (CNTK BrainScript's ``syncPeriod``)."""
    comm = communicator_of(kv, communicator)
    n = comm.num_workers()
    return BlockMomentumLearner(
        learner, comm, sync_period, 0.0, 1.0 / n, False, False, distributed_after, compression
    )


def async_sgd_distributed_learner(
    learner: Learner, distributed_after: int = 0, *, kv: Any
) -> AsyncSGDLearner:
    """Asynchronous SGD through the parameter server (use a ``dist_async`` KV store)."""
    return AsyncSGDLearner(learner, kv, distributed_after)
