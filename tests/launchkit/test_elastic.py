"""launchkit.core.elastic (pure): -n's value, the workers an elastic job starts with, the
blacklist's cool-down, where new workers go, a discovery script's lines; and core.plan's
``member_task``, the contract of a worker started after the job began."""

from __future__ import annotations

import sys

import pytest

import dmlc_env
from launchkit.core.capabilities import Capabilities
from launchkit.core.elastic import (
    blacklist,
    blocked,
    check_bounds,
    cool_down,
    new_workers,
    parse_discovered,
    parse_workers,
    start_size,
    wanted_workers,
)
from launchkit.core.plan import Member, has_scheduler, make_plan, member_task
from launchkit.core.spec import LOCALHOST, Host, LaunchSpec
from launchkit.errors import UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4", (4, None)), ("2:4", (4, (2, 4))), (" 1:1 ", (1, (1, 1))), ("0:3", (3, (0, 3)))],
)
def test_parse_workers(text: str, expected: tuple[int, tuple[int, int] | None]) -> None:
    assert parse_workers(text) == expected


@pytest.mark.parametrize("text", ["", "x", "2:", ":4", "1:2:3", "-1", "2.5", "2:4x"])
def test_parse_workers_refuses_other_forms(text: str) -> None:
    with pytest.raises(ValueError, match="expected N, or MIN:MAX"):
        parse_workers(text)


@pytest.mark.parametrize(
    ("bounds", "message"),
    [((0, 3), "MIN must be at least 1"), ((3, 2), "MIN is above MAX"), ((1, 100_001), "MAX at most 100000")],
)
def test_check_bounds(bounds: tuple[int, int], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        check_bounds(bounds)


def test_start_size_is_max_within_what_the_hosts_offer() -> None:
    assert start_size((2, 4), [LOCALHOST], "resize", "local") == 4  # no slots=: no bound
    three = [Host("a", slots=2), Host("b")]  # 2 + 1 slots
    assert start_size((2, 4), three, "resize", "ssh") == 3
    assert start_size((1, 2), three, "resize", "ssh") == 2
    with pytest.raises(UsageError, match="offers 3 slots, fewer than MIN \\(4\\)"):
        start_size((4, 6), three, "resize", "ssh")


def test_a_backend_that_only_shrinks_starts_max_which_must_fit() -> None:
    assert start_size((2, 3), [Host("a", slots=2), Host("b")], "shrink", "mpi") == 3
    with pytest.raises(
        UsageError, match=r"cannot add workers to a running job.*offers 3 slots: lower MAX to 3"
    ):
        start_size((2, 4), [Host("a", slots=2), Host("b")], "shrink", "mpi")


def test_cool_down_doubles_up_to_its_cap() -> None:
    assert [cool_down(n, 10, 60) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]


def test_a_blacklisted_host_is_skipped_until_its_cool_down_ends() -> None:
    a, b = Host("a", slots=2), Host("b", slots=2)
    bl = blacklist({}, a, now=100.0, base=10, cap=300)
    assert blocked(bl, a, 105.0) and not blocked(bl, a, 110.0) and not blocked(bl, b, 105.0)
    assert new_workers([a, b], {}, 3, bl, 105.0) == [b, b]  # a in its cool-down, b full at 2
    assert new_workers([a, b], {}, 3, bl, 110.0) == [a, b, a]
    again = blacklist(bl, a, now=110.0, base=10, cap=300)  # its second failure: 20 s
    assert blocked(again, a, 129.0) and not blocked(again, a, 130.0)


def test_new_workers_fill_the_least_loaded_free_slots() -> None:
    a, b = Host("a", slots=2), Host("b", slots=1)
    assert new_workers([a, b], {("a", None): 1}, 5, {}, 0.0) == [b, a]
    assert new_workers([a, b], {("a", None): 2, ("b", None): 1}, 1, {}, 0.0) == []
    # no slots= anywhere: no bound, round-robin by load
    assert new_workers([LOCALHOST], {("localhost", None): 3}, 2, {}, 0.0) == [LOCALHOST, LOCALHOST]
    # a machine listed twice adds its slots
    assert new_workers([Host("a", slots=1), Host("a", slots=1)], {}, 3, {}, 0.0) == [Host("a", slots=2)] * 2


def test_wanted_workers() -> None:
    assert wanted_workers((2, 4), 3, False, "resize") == 1
    assert wanted_workers((2, 4), 4, False, "resize") == 0
    assert wanted_workers((2, 4), 2, True, "resize") == 0  # a worker succeeded: the job is finishing
    assert wanted_workers((2, 4), 2, False, "shrink") == 0


def test_parse_discovered() -> None:
    assert parse_discovered("node1:2\n\n node2 \n[fe80::1]:4\n") == [
        Host("node1", slots=2, line=1),
        Host("node2", slots=1, line=3),
        Host("fe80::1", slots=4, line=4),
    ]
    for bad in ("node1:x", "node1:0", "a b:2", ":3"):
        with pytest.raises(ValueError, match=r"line 1: .*expected host:slots"):
            parse_discovered(bad)


def spec(**kw: object) -> LaunchSpec:
    base: dict[str, object] = {"num_workers": 3, "num_servers": 0, "command": ("python", "t.py")}
    return LaunchSpec(**{**base, **kw})  # type: ignore[arg-type]


def fixed_argv(caps: Capabilities) -> tuple[str, ...]:
    """The scheduler's command in a job that is not elastic (with a server: it has one)."""
    plan = make_plan(
        spec(num_servers=1), caps=caps, job_id="j", secret="s", root_uri="127.0.0.1", root_port=9
    )
    return next(t.argv for t in plan.tasks if t.role == "scheduler")


def test_an_elastic_job_always_has_a_scheduler_and_its_bounds_in_every_process() -> None:
    caps = Capabilities(here=True, elastic="resize")
    assert not has_scheduler(spec(), caps) and has_scheduler(spec(elastic=(2, 3)), caps)
    plan = make_plan(
        spec(elastic=(2, 3)), caps=caps, job_id="j", secret="s", root_uri="127.0.0.1", root_port=9
    )
    assert [t.role for t in plan.tasks] == ["scheduler", "worker", "worker", "worker"]
    assert {t.env[dmlc_env.LAUNCHKIT_ELASTIC] for t in plan.tasks} == {"2:3"}
    # the scheduler runs trainer_core's, not the job's command (which may not know the role)
    assert plan.tasks[0].argv == (sys.executable, "-m", "trainer_core.ps.scheduler")
    assert {t.argv for t in plan.tasks[1:]} == {("python", "t.py")}
    assert fixed_argv(caps) == ("python", "t.py")
    assert all(dmlc_env.LAUNCHKIT_ROOT_SERVER not in t.env for t in plan.tasks)
    fixed = make_plan(spec(), caps=caps, job_id="j", secret="s", root_uri="127.0.0.1", root_port=9)
    assert all(dmlc_env.LAUNCHKIT_ELASTIC not in t.env for t in fixed.tasks)


def test_member_task_rebuilds_the_contract_with_dense_torch_ranks() -> None:
    caps = Capabilities(here=True, elastic="resize")
    s = spec(elastic=(2, 3), env_worker=(("MINE", "1"),))
    plan = make_plan(s, caps=caps, job_id="j", secret="s", root_uri="127.0.0.1", root_port=9)
    first = plan.by_role("worker")[0]
    late = member_task(plan, first, Member(index=5, rank=1, world=2, host=LOCALHOST, restart=2), "127.0.0.1")
    e = late.env
    assert (late.role, late.rank) == ("worker", 5)
    assert (
        e[dmlc_env.LAUNCHKIT_ROLE_RANK] == "5" and e[dmlc_env.RANK] == "1" and e[dmlc_env.WORLD_SIZE] == "2"
    )
    assert e[dmlc_env.DMLC_NUM_WORKER] == "2" and e[dmlc_env.TORCHELASTIC_RESTART_COUNT] == "2"
    assert e[dmlc_env.LAUNCHKIT_RESTART_COUNT] == "0"  # the whole job's attempt: unchanged
    assert (
        e["MINE"] == "1"
        and e[dmlc_env.LAUNCHKIT_JOB_SECRET] == "s"
        and e[dmlc_env.LAUNCHKIT_ELASTIC] == "2:3"
    )
    # the ids of the first plan: workers 0..2 are 0..2, the scheduler 3; index 5 comes after
    assert [t.task_id for t in plan.tasks] == [3, 0, 1, 2] and late.task_id == 6
    assert e[dmlc_env.DMLC_TASK_ID] == "6"
    # what trainer_core reads back: the same contract as the first workers'
    node = dmlc_env.NodeEnv.from_environ(e)
    assert (node.role, node.role_rank, node.num_workers, node.elastic) == ("worker", 5, 2, (2, 3))
    assert (node.task_id, node.secret, node.root_server) == (6, "s", None)
    # (the workers' restart: the scheduler drops the members of an earlier one, docs/elastic.md)
    assert node.worker_restarts == 2


def test_a_later_worker_gets_the_gpu_block_of_its_local_rank() -> None:
    caps = Capabilities(here=True, elastic="resize")
    plan = make_plan(
        spec(elastic=(1, 2), num_workers=2, gpus_per_worker=2),
        caps=caps,
        job_id="j",
        secret="s",
        root_uri="r",
        root_port=9,
    )
    first = plan.by_role("worker")[0]
    assert first.env[dmlc_env.CUDA_VISIBLE_DEVICES] == "0,1"
    late = member_task(plan, first, Member(index=2, rank=1, world=2, host=LOCALHOST, local_rank=1), "r")
    assert late.env[dmlc_env.CUDA_VISIBLE_DEVICES] == "2,3" and late.env[dmlc_env.LOCAL_RANK] == "1"
