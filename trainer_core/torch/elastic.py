"""Horovod's ``hvd.elastic`` (``run``, ``TorchState``, ``ElasticSampler``): not supported by
trainer_core.torch. Each refuses at its first use with what to use instead: a job's worker count
is fixed when it starts, and launchkit restarts a failed job whole (``--max-restarts``) from the
last checkpoint (``trainer_core.torch.checkpoint``)."""

from __future__ import annotations

from typing import Any

NOT_SUPPORTED = (
    "Horovod's elastic training (hvd.elastic) is not supported by trainer_core.torch: the workers are "
    "fixed when the job starts; use launchkit's --max-restarts with trainer_core.torch.checkpoint "
    "(save every epoch, load at the start) to resume a failed job"
)


def run(func: Any) -> Any:
    raise NotImplementedError(f"hvd.elastic.run: {NOT_SUPPORTED}")


class TorchState:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"hvd.elastic.TorchState: {NOT_SUPPORTED}")


class ElasticSampler:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"hvd.elastic.ElasticSampler: {NOT_SUPPORTED}")
