"""node/agree.py: the canonical JSON of a setting, and what the workers waiting at the scheduler
are told (the agreed value, what differs, or who is where)."""

from __future__ import annotations

import pytest

from trainer_core.node.agree import Meeting, Waiter, canonical


def meet(*waiters: tuple[int, str, str, object]) -> dict:
    m = Meeting(len(waiters))
    for rank, op, at, value in waiters:
        m.add(Waiter(rank, at, op, None if value is None else canonical(value), None, rank))
    body, told = m.outcome()
    assert [w.rank for w in told] == sorted(r for r, *_ in waiters) and m.waiting == {}
    return body


def test_canonical_json_sorts_keys_and_refuses_what_is_not_plain_data() -> None:
    assert canonical({"type": "2bit", "threshold": 0.5}) == '{"threshold":0.5,"type":"2bit"}'
    with pytest.raises(TypeError):
        canonical({"f": object()})
    with pytest.raises(ValueError):
        canonical(float("nan"))


def test_the_same_value_everywhere_is_agreed_and_a_value_given_by_one_worker_reaches_all() -> None:
    assert meet((0, "agree", "set_optimizer()", {"lr": 1}), (1, "agree", "set_optimizer()", {"lr": 1})) == {
        "value": '{"lr":1}'
    }
    assert meet((0, "agree", "init()", {"error": "x"}), (1, "agree", "init()", None)) == {
        "value": '{"error":"x"}'
    }
    assert meet((0, "barrier", "barrier()", None), (1, "barrier", "barrier()", None)) == {}


def test_different_values_name_each_value_and_its_ranks() -> None:
    body = meet(
        (0, "agree", "set_gradient_compression()", {"type": "1bit"}),
        (2, "agree", "set_gradient_compression()", {"type": "2bit"}),
        (1, "agree", "set_gradient_compression()", {"type": "2bit"}),
    )
    assert body["error"].startswith(
        'set_gradient_compression(): the workers gave different settings, worker 0: {"type":"1bit"}; '
        'workers 1, 2: {"type":"2bit"}'
    )


def test_workers_in_different_calls_are_told_who_is_where() -> None:
    body = meet(
        (1, "barrier", "init()", None),
        (0, "agree", "set_gradient_compression()", {"type": "1bit"}),
        (2, "barrier", "init()", None),
    )
    assert body["error"].startswith(
        "the workers are in different collective calls, which can never complete: "
        "worker 0 in set_gradient_compression(); workers 1, 2 in init()"
    )
    body = meet((0, "barrier", "barrier()", None), (1, "agree", "barrier()", 3))
    assert "in different collective calls" in body["error"]  # a barrier is not an agreement
