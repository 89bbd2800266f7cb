from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launchkit.core.placement import assign_hosts, gpu_slice, place
from launchkit.core.spec import Host
from launchkit.errors import PlacementError

H = [Host(f"h{i}") for i in range(1, 6)]


def names(hosts: list[Host]) -> list[str]:
    return [h.name for h in hosts]


def test_mxnet_rule_from_the_docs() -> None:
    """5 hosts, -n 3, no -s: servers on hosts 1-3, workers on hosts 4, 5, 1."""
    slots = place(3, 3, H)
    assert [(s.role, s.rank, s.host.name) for s in slots] == [
        ("server", 0, "h1"),
        ("server", 1, "h2"),
        ("server", 2, "h3"),
        ("worker", 0, "h4"),
        ("worker", 1, "h5"),
        ("worker", 2, "h1"),
    ]
    assert [s.task_id for s in slots] == list(range(6))


def test_n_hosts_n_workers_one_server_and_one_worker_each() -> None:
    assert names(assign_hosts(3, 3, H[:3])) == ["h1", "h2", "h3", "h1", "h2", "h3"]


def test_repeated_host_line_is_one_more_entry() -> None:
    hosts = [Host("a"), Host("a"), Host("b")]
    slots = place(3, 0, hosts)
    assert names([s.host for s in slots]) == ["a", "a", "b"]
    assert [s.local_rank for s in slots] == [0, 1, 0]


def test_workers_only() -> None:
    slots = place(2, 0, H[:2])
    assert [s.role for s in slots] == ["worker", "worker"]


def test_slots_fill_in_order_servers_round_robin() -> None:
    hosts = [Host("a", slots=2), Host("b", slots=2), Host("c", slots=2)]
    slots = place(3, 2, hosts)
    assert [(s.role, s.host.name) for s in slots] == [
        ("server", "a"),
        ("server", "b"),
        ("worker", "a"),
        ("worker", "a"),
        ("worker", "b"),
    ]
    assert [s.local_rank for s in slots if s.role == "worker"] == [0, 1, 0]


def test_host_without_slots_counts_one_in_slot_mode() -> None:
    assert names(assign_hosts(3, 0, [Host("a", slots=2), Host("b")])) == ["a", "a", "b"]


def test_too_many_workers_for_slots_gives_both_numbers() -> None:
    with pytest.raises(PlacementError, match=r"5 workers do not fit in the hostfile's 4 slots"):
        place(5, 1, [Host("a", slots=2), Host("b", slots=2)])


@pytest.mark.parametrize(("nw", "ns"), [(0, 1), (-1, 0), (1, -1)])
def test_bad_counts(nw: int, ns: int) -> None:
    with pytest.raises(PlacementError):
        place(nw, ns, H)


def test_local_rank_counts_same_machine_by_name_and_port() -> None:
    hosts = [Host("a", port=22), Host("a", port=2222), Host("a", port=22)]
    assert [s.local_rank for s in place(3, 0, hosts)] == [0, 0, 1]


def test_gpu_slice() -> None:
    assert gpu_slice(0, 2) == "0,1"
    assert gpu_slice(3, 2) == "6,7"
    assert gpu_slice(1, 1) == "1"


@given(st.integers(1, 40), st.integers(0, 20), st.integers(1, 8))
def test_mxnet_rule_property(nw: int, ns: int, nhosts: int) -> None:
    hosts = [Host(f"n{i}") for i in range(nhosts)]
    slots = place(nw, ns, hosts)
    assert len(slots) == nw + ns
    assert all(s.host == hosts[i % nhosts] for i, s in enumerate(slots))
    assert sorted(s.rank for s in slots if s.role == "worker") == list(range(nw))
    assert sorted(s.rank for s in slots if s.role == "server") == list(range(ns))


@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.integers(0, 5), st.data())
def test_slot_rule_property(caps: list[int], ns: int, data) -> None:
    hosts = [Host(f"n{i}", slots=c) for i, c in enumerate(caps)]
    nw = data.draw(st.integers(1, sum(caps)))
    slots = place(nw, ns, hosts)
    workers = [s for s in slots if s.role == "worker"]
    for h in hosts:
        assert sum(1 for w in workers if w.host == h) <= (h.slots or 1)
    # filled in hostfile order: no host is used while an earlier one still has a free slot
    used = [sum(1 for w in workers if w.host == h) for h in hosts]
    first_short = next(
        (i for i, (u, h) in enumerate(zip(used, hosts, strict=False)) if u < (h.slots or 1)), len(hosts)
    )
    assert all(u == 0 for u in used[first_short + 1 :])


@pytest.mark.parametrize("n, s", [(1, 10**20), (10**20, 1), (100_001, 0)])
def test_counts_beyond_any_job_are_refused_before_planning(n: int, s: int) -> None:
    """``-s 99999999999999999999`` used to hang the planner (found by tests/faults/test_cli_fuzz.py)."""
    with pytest.raises(PlacementError, match="expected at most 100000 processes"):
        assign_hosts(n, s, [Host("a"), Host("b")])
