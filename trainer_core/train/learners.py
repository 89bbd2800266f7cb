"""Distributed learners with CNTK's Python names, over the KV store or collectives.

This module has CNTK's factory functions and the public names; the learners themselves live by
family: ``distributed`` (the base: communicator, warm start, sample count), ``stepwise`` (data
parallel and asynchronous SGD, which exchange every step) and ``periodic`` (block momentum and
model averaging, which exchange every few samples).

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

from trainer_core.optim.local import Learner, server_optimizer_spec
from trainer_core.train.comm import Communicator
from trainer_core.train.distributed import (
    COMPRESSION_BITS,
    DistributedLearner,
    communicator_of,
    compression_for_bits,
)
from trainer_core.train.periodic import BlockMomentumLearner
from trainer_core.train.stepwise import AsyncSGDLearner, DataParallelLearner

__all__ = [
    "COMPRESSION_BITS",
    "AsyncSGDLearner",
    "BlockMomentumLearner",
    "DataParallelLearner",
    "DistributedLearner",
    "async_sgd_distributed_learner",
    "block_momentum_distributed_learner",
    "block_momentum_time_constant",
    "communicator_of",
    "compression_for_bits",
    "data_parallel_distributed_learner",
    "model_averaging_distributed_learner",
    "server_optimizer_spec",
]


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
        learner,
        comm,
        block_size // n,
        eta,
        block_learning_rate,
        use_nestrov_momentum,
        reset_sgd_momentum_after_aggregation,
        distributed_after,
        compression,
    )


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
    learner: Learner, distributed_after: int = 0, *, kv: Any = None, communicator: Communicator | None = None
) -> AsyncSGDLearner:
    """Asynchronous SGD through the parameter server (use a ``dist_async`` KV store). It takes
    ``kv=`` or ``communicator=`` as the other learners; a collective communicator is refused (the
    update runs on the servers)."""
    if (kv is None) == (communicator is None):
        raise ValueError("a distributed learner takes either kv= (a KV store) or communicator=, not both")
    return AsyncSGDLearner(learner, kv if communicator is None else communicator, distributed_after)
