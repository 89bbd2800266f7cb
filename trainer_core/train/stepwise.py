"""The learners that exchange every step: synchronous data parallel (the workers' gradients
averaged through the communicator) and asynchronous SGD (the local learner's rule on the parameter
servers). See ``learners`` for the algorithms."""

from __future__ import annotations

from typing import Any

from trainer_core.optim.local import Learner, server_optimizer_spec
from trainer_core.train.comm import check_store
from trainer_core.train.distributed import DistributedLearner


class DataParallelLearner(DistributedLearner):
    """Synchronous data-parallel SGD: average the gradients every step, then the local step."""

    def _step(self, grads: dict[str, Any], num_samples: int) -> bool:
        bufs = [self._buf[n] for n in self.names]
        n = self.num_workers
        self._comm.aggregate(self.keys, [grads[k] / n for k in self.names], bufs)
        self.learner.update({k: self._buf[k] for k in self.names})
        self.syncs += 1
        return True


class AsyncSGDLearner(DistributedLearner):
    """Asynchronous SGD through the parameter server: the servers run the local learner's rule."""

    def __init__(self, learner: Learner, kv: Any, distributed_after: int = 0, key_prefix: str = "") -> None:
        if hasattr(kv, "aggregate"):  # a communicator: only the parameter server's will do
            kind, kv = type(kv).__name__, getattr(kv, "kv", None)
            if kv is None:
                raise ValueError(
                    f"asynchronous SGD runs its update on the parameter servers: it needs a KV store "
                    f"(kv=, or a KVCommunicator), not a {kind}; on collectives use "
                    "data_parallel_distributed_learner"
                )
        if kv is None:
            raise ValueError("asynchronous SGD runs on the parameter server: it needs a KV store")
        check_store(kv)
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
