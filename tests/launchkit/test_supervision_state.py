"""The supervisor's phases and their transitions (launchkit.supervision_state), in one process."""

from __future__ import annotations

import signal

import pytest

from launchkit.supervision_state import Action, Cause, Event, Phase, State, Timing, step

T = Timing(grace=5.0, kill_confirm=30.0)


def test_a_job_that_ends_by_itself_goes_from_running_to_done_with_no_cause() -> None:
    state, actions = step(State(), Event.TICK, 100.0, T)
    assert state == State() and actions == ()
    state, actions = step(state, Event.ENDED, 101.0, T)
    assert state.phase is Phase.DONE and state.cause is None and not state.ending and actions == ()


@pytest.mark.parametrize(
    ("event", "cause"),
    [(Event.FAILURE, Cause.FAILURE), (Event.SIGNAL, Cause.SIGNAL), (Event.TIME_LIMIT, Cause.TIME_LIMIT)],
)
def test_a_failure_a_signal_or_the_time_limit_sends_sigterm_and_starts_the_grace_period(
    event: Event, cause: Cause
) -> None:
    signum = signal.SIGINT if event is Event.SIGNAL else None
    state, actions = step(State(), event, 100.0, T, signum)
    assert actions == (Action.TERMINATE,)
    assert state == State(Phase.STOPPING, cause, signum, 105.0) and state.ending


def test_the_grace_periods_end_sends_sigkill_and_the_wait_for_the_ends_begins() -> None:
    state, _ = step(State(), Event.FAILURE, 100.0, T)
    assert step(state, Event.TICK, 104.9, T) == (state, ())  # not yet
    state, actions = step(state, Event.TICK, 105.0, T)
    assert actions == (Action.KILL,)
    assert state == State(Phase.KILLING, Cause.FAILURE, None, 135.0)


def test_ends_not_confirmed_kill_confirm_seconds_after_sigkill_are_given_up() -> None:
    state = State(Phase.KILLING, Cause.SIGNAL, signal.SIGTERM, 135.0)
    assert step(state, Event.TICK, 134.0, T) == (state, ())
    state, actions = step(state, Event.TICK, 135.0, T)
    assert actions == (Action.GIVE_UP,)
    assert state == State(Phase.ABANDONED, Cause.SIGNAL, signal.SIGTERM, None)
    assert step(state, Event.TICK, 1000.0, T) == (state, ())  # given up once


def test_a_second_signal_skips_the_grace_period_and_keeps_the_first_cause() -> None:
    state, _ = step(State(), Event.SIGNAL, 100.0, T, signal.SIGINT)
    state, actions = step(state, Event.SIGNAL, 101.0, T, signal.SIGTERM)
    assert actions == (Action.KILL,)
    assert state == State(Phase.KILLING, Cause.SIGNAL, signal.SIGINT, 131.0)


def test_a_signal_after_a_failure_began_the_teardown_skips_its_grace_period() -> None:
    state, _ = step(State(), Event.FAILURE, 100.0, T)
    state, actions = step(state, Event.SIGNAL, 100.5, T, signal.SIGTERM)
    assert actions == (Action.KILL,) and state.phase is Phase.KILLING
    assert state.cause is Cause.FAILURE and state.signum is None  # the failure stays the cause


def test_a_later_signal_sends_sigkill_again_without_moving_the_deadline() -> None:
    killing = State(Phase.KILLING, Cause.SIGNAL, signal.SIGINT, 131.0)
    assert step(killing, Event.SIGNAL, 120.0, T, signal.SIGINT) == (killing, (Action.KILL,))
    abandoned = State(Phase.ABANDONED, Cause.SIGNAL, signal.SIGINT, None)
    assert step(abandoned, Event.SIGNAL, 140.0, T, signal.SIGINT) == (abandoned, (Action.KILL,))


@pytest.mark.parametrize("event", [Event.FAILURE, Event.TIME_LIMIT])
@pytest.mark.parametrize("phase", [Phase.STOPPING, Phase.KILLING, Phase.ABANDONED])
def test_a_failure_or_the_time_limit_while_the_job_ends_changes_nothing(event: Event, phase: Phase) -> None:
    state = State(phase, Cause.SIGNAL, signal.SIGINT, None if phase is Phase.ABANDONED else 1000.0)
    assert step(state, event, 100.0, T) == (state, ())


def test_a_grace_period_of_zero_kills_at_once_and_a_kill_confirm_of_zero_gives_up_at_once() -> None:
    state, actions = step(State(), Event.FAILURE, 100.0, Timing(grace=0.0, kill_confirm=5.0))
    assert actions == (Action.TERMINATE, Action.KILL) and state.phase is Phase.KILLING
    state, actions = step(State(), Event.SIGNAL, 100.0, Timing(0.0, 0.0), signal.SIGHUP)
    assert actions == (Action.TERMINATE, Action.KILL, Action.GIVE_UP)
    assert state == State(Phase.ABANDONED, Cause.SIGNAL, signal.SIGHUP, None)


def test_every_process_ended_is_done_from_any_phase_and_nothing_follows() -> None:
    for state in (
        State(),
        State(Phase.STOPPING, Cause.FAILURE, None, 105.0),
        State(Phase.KILLING, Cause.TIME_LIMIT, None, 135.0),
        State(Phase.ABANDONED, Cause.SIGNAL, signal.SIGINT, None),
    ):
        done, actions = step(state, Event.ENDED, 200.0, T)
        assert done == State(Phase.DONE, state.cause, state.signum, None) and actions == ()
        for event in Event:
            assert step(done, event, 1000.0, T, signal.SIGINT) == (done, ())
