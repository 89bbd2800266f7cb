"""The workers of an elastic job (``-n MIN:MAX``) and the one place where their membership
changes (pure: no clock, no process; the supervisor's ``launchkit.elastic`` feeds it and acts).

```
a worker fails  --live >= MIN--> next epoch: in-process mode keeps the survivors as they run;
                                 restart mode STOPs them (SIGTERM, KILL after the grace period)
                                 and, once every one has ended, RESPAWNs the group (dense ranks,
                                 the workers' restart count + 1)
                --live < MIN---> FAIL: the job ends, this worker its root cause
a worker exits 0 ----------------> the job is finishing: no worker starts any more (it still
                                 counts towards MIN; a later failure is not replaced)
room and a host (``grow``) ------> next epoch: RESPAWN (in-process: only the new workers start;
                                 restart mode: the group is stopped and started again, larger)
```

In-process mode: every live worker has reported ``dmlc_env.ELASTIC_IN_PROCESS_FIGURE`` (it
handles a change itself: trainer_core's elastic API); otherwise restart mode (a torch.distributed
script: torchrun's behaviour). The mode is decided at each change, from what the workers said.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass


class Act(enum.Enum):
    FAIL = "fail"  # fewer than MIN workers remain: end the job
    STOP = "stop"  # SIGTERM to the workers in ``stopping``
    KILL = "kill"  # SIGKILL to the workers in ``stopping`` still running
    RESPAWN = "respawn"  # start workers: ``group`` (restart mode: the whole group) for ``epoch``


@dataclass(frozen=True)
class Membership:
    bounds: tuple[int, int]  # (MIN, MAX)
    live: frozenset[int] = frozenset()  # the supervisor's indices of the running workers
    epoch: int = 0
    restarts: int = 0  # the workers' restarts (TORCHELASTIC_RESTART_COUNT of the next group)
    stopping: frozenset[int] = frozenset()  # restart mode: the survivors being stopped
    deadline: float | None = None  # when the stopping ones get SIGKILL
    regroup: bool = False  # restart mode: once ``stopping`` is empty, the whole group starts again
    finishing: bool = False  # a worker exited 0: no worker starts any more
    finished: int = 0  # the workers that exited 0 (they count towards MIN: their work is done)
    carried: frozenset[int] = frozenset()  # restart mode: the survivors the new group replaces


def started(m: Membership, indices: frozenset[int]) -> Membership:
    """``indices`` run now (the first workers, or a RESPAWN's)."""
    return dataclasses.replace(m, live=m.live | indices)


def worker_ended(
    m: Membership, index: int, ok: bool, in_process: bool, now: float, grace: float
) -> tuple[Membership, tuple[Act, ...]]:
    """Worker ``index`` ended (``ok``: exit 0). ``in_process``: every live worker handles a change
    itself. A worker the launcher was stopping for a restart changes nothing but the wait."""
    if index in m.stopping:
        m = dataclasses.replace(m, stopping=m.stopping - {index}, live=m.live - {index})
        return _regrouped(m)
    if index not in m.live:
        return m, ()
    m = dataclasses.replace(m, live=m.live - {index})
    if ok:
        return dataclasses.replace(m, finishing=True, finished=m.finished + 1), ()
    if len(m.live) + m.finished < m.bounds[0]:  # (the survivors being stopped for a restart count)
        return m, (Act.FAIL,)
    m = dataclasses.replace(m, epoch=m.epoch + 1)
    if in_process or m.finishing:
        return m, ()
    return _stop_all(m, now, grace)


def grow(m: Membership, in_process: bool, now: float, grace: float) -> tuple[Membership, tuple[Act, ...]]:
    """Room below MAX and a host for a new worker (the caller knows the hosts): the next epoch."""
    if m.finishing or m.regroup or len(m.live) >= m.bounds[1]:
        return m, ()
    m = dataclasses.replace(m, epoch=m.epoch + 1)
    if in_process:
        return m, (Act.RESPAWN,)
    return _stop_all(m, now, grace)


def tick(m: Membership, now: float) -> tuple[Membership, tuple[Act, ...]]:
    """Time passed: the grace period of the stopping workers may have ended."""
    if m.deadline is not None and now >= m.deadline and m.stopping:
        return dataclasses.replace(m, deadline=None), (Act.KILL,)
    return m, ()


def respawned(m: Membership, indices: frozenset[int]) -> Membership:
    """A RESPAWN started ``indices``; after a regroup the workers' restart count goes up."""
    restarts = m.restarts + 1 if m.regroup else m.restarts
    return dataclasses.replace(
        m, live=m.live | indices, regroup=False, restarts=restarts, carried=frozenset()
    )


def _stop_all(m: Membership, now: float, grace: float) -> tuple[Membership, tuple[Act, ...]]:
    m = dataclasses.replace(m, stopping=m.live, carried=m.live, regroup=True, deadline=now + grace)
    if not m.stopping:
        return _regrouped(m)
    return m, (Act.STOP,)


def _regrouped(m: Membership) -> tuple[Membership, tuple[Act, ...]]:
    if m.stopping or not m.regroup:
        return m, ()
    return dataclasses.replace(m, deadline=None), (Act.RESPAWN,)
