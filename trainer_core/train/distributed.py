"""The distributed learners' base: the local learner, the communicator, the warm start.

``DistributedLearner`` holds what every distributed learner shares (``learners`` has the
algorithms and CNTK's factory functions): the local learner from ``optim.local``, the
``Communicator`` it exchanges through (``train.comm``), the warm start (``distributed_after``),
the sample count and the compression params. ``communicator_of`` picks the communicator a factory
was given (``kv=`` or ``communicator=``); ``compression_for_bits`` turns CNTK's
``num_quantization_bits`` into compression params.
"""

from __future__ import annotations

from typing import Any

from trainer_core.compression import get_compressor
from trainer_core.optim.local import Learner
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
        given = "neither was given" if kv is None else "both were given"
        raise ValueError(f"a distributed learner takes either kv= (a KV store) or communicator=: {given}")
    return communicator if communicator is not None else KVCommunicator(kv)


def check_grads(grads: Any, names: list[str]) -> None:
    """``grads`` is a dict holding a gradient for every parameter (a KeyError or a TypeError deep
    in the step said neither which parameter nor what was expected)."""
    if not isinstance(grads, dict):
        raise TypeError(
            f"grads: expected a dict of the gradients by parameter name, got {type(grads).__name__}"
        )
    missing = [n for n in names if n not in grads]
    if missing:
        raise ValueError(f"grads: no gradient for parameter(s) {missing} (expected one for each of {names})")


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
        check_grads(grads, self.names)
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
        agree = getattr(self._comm, "agree", None)
        if agree is not None:  # 1 bit on one worker and 32 on another: an error on both, not a hang
            agree("the distributed learner's compression", self.compression or {"type": "none"})
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
