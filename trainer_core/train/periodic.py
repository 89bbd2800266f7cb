"""The learners that exchange every few samples: block momentum (BMUF) and model averaging (BMUF
with no momentum). See ``learners`` for the algorithm."""

from __future__ import annotations

from typing import Any

from trainer_core.optim.local import Learner
from trainer_core.train.distributed import DistributedLearner
from trainer_core.xp import array_module


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
