"""Horovod's tensor fusion settings, read from the environment at ``init()``.

* ``HOROVOD_FUSION_THRESHOLD``: the bytes of one fusion buffer (0: no fusion); default 128 MiB,
  Horovod's since 0.21 (64 MiB before);
* ``HOROVOD_CYCLE_TIME``: an allreduce at the head of the queue waits for others to fuse with
  until this many milliseconds pass without a submission (or the script waits for a queued
  operation: Horovod's background cycle, ``negotiator``); default 1 ms, Horovod's since 0.21 (5 ms
  before).

On the collectives' path the group fuses the ``allreduce_async`` family with these
(``trainer_core.collective.batching``); ``DistributedOptimizer`` takes the threshold, where it is
set, as the size of its own gradient buckets (docs/pytorch.md, "Tensor fusion").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from trainer_core.errors import ConfigError

THRESHOLD_ENV = "HOROVOD_FUSION_THRESHOLD"
CYCLE_ENV = "HOROVOD_CYCLE_TIME"
DEFAULT_THRESHOLD = 128 * 1024 * 1024
DEFAULT_CYCLE_MS = 1.0


@dataclass(frozen=True)
class Fusion:
    """The fusion settings: ``threshold`` bytes (0: off), ``cycle_s`` seconds, and whether the
    threshold was given (``explicit``: the optimizer's buckets follow it then)."""

    threshold: int = DEFAULT_THRESHOLD
    cycle_s: float = DEFAULT_CYCLE_MS / 1000
    explicit: bool = False


def from_environ(environ: Mapping[str, str]) -> Fusion:
    """The settings in ``environ``; a clear ``ConfigError`` for a value that is not one."""
    raw_t = environ.get(THRESHOLD_ENV, "").strip()
    raw_c = environ.get(CYCLE_ENV, "").strip()
    threshold = DEFAULT_THRESHOLD
    if raw_t:
        try:
            threshold = int(raw_t)
        except ValueError:
            threshold = -1
        if threshold < 0:
            raise ConfigError(
                f"{THRESHOLD_ENV} must be a whole number of bytes, 0 or more (0: no tensor fusion), "
                f"not {raw_t!r}"
            )
    cycle_ms = DEFAULT_CYCLE_MS
    if raw_c:
        try:
            cycle_ms = float(raw_c)
        except ValueError:
            cycle_ms = -1.0
        if not math.isfinite(cycle_ms) or cycle_ms < 0:
            raise ConfigError(f"{CYCLE_ENV} must be a number of milliseconds, 0 or more, not {raw_c!r}")
    return Fusion(threshold, cycle_ms / 1000, bool(raw_t))
