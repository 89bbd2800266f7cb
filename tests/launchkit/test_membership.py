"""launchkit.membership (pure): an elastic job's workers, epochs, and what each change asks of
the supervisor (STOP, KILL, RESPAWN, FAIL)."""

from __future__ import annotations

from launchkit.membership import Act, Membership, grow, respawned, started, tick, worker_ended


def three() -> Membership:
    return started(Membership((2, 3)), frozenset({1, 2, 3}))


def test_in_process_a_failure_is_a_new_epoch_and_the_survivors_stay() -> None:
    m, acts = worker_ended(three(), 2, ok=False, in_process=True, now=0.0, grace=5.0)
    assert acts == () and m.epoch == 1 and m.live == {1, 3} and not m.stopping


def test_below_min_fails() -> None:
    m, _ = worker_ended(three(), 2, ok=False, in_process=True, now=0.0, grace=5.0)
    _, acts = worker_ended(m, 1, ok=False, in_process=True, now=0.0, grace=5.0)
    assert acts == (Act.FAIL,)


def test_restart_mode_stops_the_survivors_kills_them_late_and_respawns_once_all_ended() -> None:
    m, acts = worker_ended(three(), 2, ok=False, in_process=False, now=10.0, grace=5.0)
    assert acts == (Act.STOP,) and m.stopping == {1, 3} and m.carried == {1, 3} and m.epoch == 1
    m, acts = tick(m, 14.0)
    assert acts == ()
    m, acts = worker_ended(m, 1, ok=False, in_process=False, now=14.5, grace=5.0)  # SIGTERM: no failure
    assert acts == () and m.epoch == 1
    m, acts = tick(m, 15.0)
    assert acts == (Act.KILL,)
    m, acts = worker_ended(m, 3, ok=False, in_process=False, now=15.1, grace=5.0)
    assert acts == (Act.RESPAWN,) and m.live == frozenset()
    m = respawned(m, frozenset({4, 5}))
    assert m.live == {4, 5} and m.restarts == 1 and not m.regroup and not m.carried


def test_a_worker_that_succeeds_starts_the_end_no_more_growth() -> None:
    m, acts = worker_ended(three(), 1, ok=True, in_process=False, now=0.0, grace=5.0)
    assert acts == () and m.finishing and m.epoch == 0
    assert grow(m, in_process=True, now=0.0, grace=5.0) == (m, ())
    m, acts = worker_ended(m, 2, ok=False, in_process=False, now=0.0, grace=5.0)  # no restart at the end
    assert acts == () and m.live == {3}  # (the one that succeeded counts towards MIN)
    _, acts = worker_ended(m, 3, ok=False, in_process=False, now=0.0, grace=5.0)
    assert acts == (Act.FAIL,)


def test_grow() -> None:
    m, _ = worker_ended(three(), 2, ok=False, in_process=True, now=0.0, grace=5.0)
    grown, acts = grow(m, in_process=True, now=1.0, grace=5.0)
    assert acts == (Act.RESPAWN,) and grown.epoch == 2
    assert respawned(grown, frozenset({4})).live == {1, 3, 4}
    regroup, acts = grow(m, in_process=False, now=1.0, grace=5.0)  # restart mode: the group restarts
    assert acts == (Act.STOP,) and regroup.stopping == {1, 3}
    assert grow(three(), in_process=True, now=0.0, grace=5.0) == (three(), ())  # at MAX already
