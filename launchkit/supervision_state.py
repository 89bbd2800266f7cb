"""The phases of a supervised job and the one place where they change (pure: no clock, no process).

```
RUNNING --failure named / signal / time limit--> STOPPING   SIGTERM to every process still running
STOPPING --grace period's end / a second signal--> KILLING  SIGKILL to every process still running
KILLING --kill_confirm seconds without every end--> ABANDONED  the late ones count as killed
any phase --every process ended--> DONE
```

A failure, a signal or the time limit while the job is already ending changes nothing, except
that a signal after the first one sends SIGKILL (again) at once. ``cause`` says why the job is
ending; it stays None for a job whose processes all ended before anything ended it. The
supervisor feeds ``step`` the events it sees, does what the returned actions say and reads the
phase for the rest (``ending``: a process's end is the launcher's doing, its failure no longer
a candidate for the root cause).

An elastic job's workers (``-n MIN:MAX``) have a state of their own beside this one,
``launchkit.membership`` (epochs, a restart of the workers, respawns): a worker's end there is a
change of membership while at least MIN remain, and only a FAIL from it becomes this FAILURE.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    RUNNING = "running"  # the processes run; a failure, a signal or the time limit ends the job
    STOPPING = "stopping"  # SIGTERM sent: the grace period runs until ``deadline``
    KILLING = "killing"  # SIGKILL sent: every process's end is awaited until ``deadline``
    ABANDONED = "abandoned"  # the unconfirmed ends counted as kills: the backend's cleanup remains
    DONE = "done"  # every process ended


class Cause(enum.Enum):
    """Why the launcher ends the job."""

    FAILURE = "failure"  # a process failed: the root cause is named
    SIGNAL = "signal"  # SIGINT, SIGTERM or SIGHUP to the launcher
    TIME_LIMIT = "time limit"


class Event(enum.Enum):
    FAILURE = "failure"  # the failures so far name the root cause
    SIGNAL = "signal"  # a handled signal reached the launcher (``signum``)
    TIME_LIMIT = "time limit"  # the job's time limit passed
    TICK = "tick"  # time passed: a phase's deadline may have come
    ENDED = "ended"  # every process has ended


class Action(enum.Enum):
    TERMINATE = "terminate"  # SIGTERM to every process still running
    KILL = "kill"  # SIGKILL to every process still running
    GIVE_UP = "give up"  # count every process still running as killed


@dataclass(frozen=True)
class Timing:
    grace: float  # SIGTERM to SIGKILL
    kill_confirm: float  # SIGKILL to giving up on the ends not confirmed


@dataclass(frozen=True)
class State:
    phase: Phase = Phase.RUNNING
    cause: Cause | None = None
    signum: int | None = None  # the signal that ended the job (cause SIGNAL)
    deadline: float | None = None  # when STOPPING and KILLING end by themselves (time.monotonic)

    @property
    def ending(self) -> bool:
        """The launcher has begun to end the job."""
        return self.cause is not None


def step(
    state: State, event: Event, now: float, timing: Timing, signum: int | None = None
) -> tuple[State, tuple[Action, ...]]:
    """The state after ``event`` at ``now``, and what the supervisor must do for it, in order."""
    phase = state.phase
    if phase is Phase.DONE:
        return state, ()
    if event is Event.ENDED:
        return dataclasses.replace(state, phase=Phase.DONE, deadline=None), ()
    if phase is Phase.RUNNING:
        cause = {Event.FAILURE: Cause.FAILURE, Event.SIGNAL: Cause.SIGNAL, Event.TIME_LIMIT: Cause.TIME_LIMIT}
        if event not in cause:
            return state, ()
        stopping = State(
            Phase.STOPPING,
            cause[event],
            signum if event is Event.SIGNAL else None,
            now + timing.grace,
        )
        return _expire(stopping, now, timing, (Action.TERMINATE,))
    if event is Event.SIGNAL:
        if phase is Phase.STOPPING:  # a second signal: no more grace
            state = dataclasses.replace(state, phase=Phase.KILLING, deadline=now + timing.kill_confirm)
        return _expire(state, now, timing, (Action.KILL,))  # (a later one: SIGKILL again)
    if event is Event.TICK:
        return _expire(state, now, timing, ())
    return state, ()  # a failure or the time limit while the job is ending


def _expire(
    state: State, now: float, timing: Timing, actions: tuple[Action, ...]
) -> tuple[State, tuple[Action, ...]]:
    """Every deadline that has come by ``now``, in turn (a grace period of 0 kills at once)."""
    while state.deadline is not None and now >= state.deadline:
        if state.phase is Phase.STOPPING:
            state = dataclasses.replace(state, phase=Phase.KILLING, deadline=now + timing.kill_confirm)
            actions += (Action.KILL,)
        else:  # KILLING
            state = dataclasses.replace(state, phase=Phase.ABANDONED, deadline=None)
            actions += (Action.GIVE_UP,)
    return state, actions
