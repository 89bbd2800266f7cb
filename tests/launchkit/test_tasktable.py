"""The shim's task table at scale: its size stays small at thousands of tasks, and every engine
rank still resolves to its own task (issue 28)."""

from __future__ import annotations

import json

import pytest

from launchkit.backends.engine import engine_env, scheduler_last, split_env
from launchkit.backends.mpi import rank_order
from launchkit.backends.sge import scheduler_first
from launchkit.backends.yarnspec import table_order
from launchkit.core.spec import Host, LaunchSpec, Plan, Task
from launchkit.hostside import shim, tasktable
from tests.launchkit.plans import make_plan

#: Linux's limit on one environment string (MAX_ARG_STRLEN: 32 pages)
MAX_ARG_STRLEN = 128 * 1024


def big_plan(
    workers: int,
    servers: int,
    hosts: int,
    *,
    slots: int | None = None,
    gpus: int | None = None,
    backend: str = "mpi",
) -> Plan:
    spec = LaunchSpec(
        num_workers=workers,
        num_servers=servers,
        command=("python3", "train.py"),
        backend=backend,
        hosts=tuple(Host(f"10.231.{h // 250}.{h % 250 + 2}", slots=slots) for h in range(hosts)),
        env_server=(("SERVER_ONLY", "a b"),),
        gpus_per_worker=gpus,
    )
    hosts_of = dict.fromkeys(spec.hosts, "")  # the engines' shims find their node's address
    return make_plan(
        spec, job_id="j", secret="topsecret", root_uri="10.0.0.1", root_port=9000, node_host_of=hosts_of
    )


ORDERS = {
    "mpi": rank_order,
    "slurm": scheduler_last,
    "sge": scheduler_first,
    "yarn": lambda p: table_order(p.tasks),
}


def expected(plan: Plan, ordered: list[Task]) -> list[tuple[int, dict[str, str]]]:
    _, own = split_env(ordered)
    index = {t.task_id: i for i, t in enumerate(plan.tasks)}
    return [(index[t.task_id], env) for t, env in zip(ordered, own, strict=True)]


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize(
    ("workers", "servers", "hosts", "slots", "gpus"),
    [
        (4000, 1000, 625, None, None),  # 5000 tasks, 8 a host, round robin
        (4999, 3, 128, None, None),  # hosts with unequal counts, servers on some hosts only
        (2048, 64, 256, 8, 1),  # slots: workers fill hosts, one GPU each
        (1024, 0, 128, 8, 2),  # two GPUs each ("0,1", "2,3", ...)
    ],
)
def test_every_rank_resolves_to_its_task_and_the_table_stays_small(
    order: str, workers: int, servers: int, hosts: int, slots: int | None, gpus: int | None
) -> None:
    plan = big_plan(workers, servers, hosts, slots=slots, gpus=gpus)
    ordered = ORDERS[order](plan)
    rows = expected(plan, ordered)
    raw = tasktable.encode(rows)
    assert len(raw) < 4096, (len(raw), raw[:500])
    assert [tasktable.lookup(raw, r) for r in range(len(rows))] == rows
    assert list(tasktable.rows(json.loads(raw))) == rows  # the whole table in one pass (Slurm's batch job)
    with pytest.raises(ValueError, match=f"outside the job's {len(rows)} tasks"):
        tasktable.lookup(raw, len(rows))


def test_engine_env_of_5000_tasks_stays_far_under_the_kernels_limit() -> None:
    """Fails on one row per task: about 100 bytes each, over MAX_ARG_STRLEN near 1100 tasks."""
    plan = big_plan(4000, 1000, 625)
    env = engine_env(plan, rank_order(plan), 5.0)
    longest = max(len(k) + 1 + len(v) for k, v in env.items())
    assert longest < MAX_ARG_STRLEN // 32, longest
    assert sum(len(k) + len(v) + 2 for k, v in env.items()) < 8192
    for rank in (0, 917, 4999):  # what the shim of that rank finds, through its engine's variable
        index, own = shim.task_of({**env, "OMPI_COMM_WORLD_RANK": str(rank)})
        task = plan.tasks[index]
        assert task == rank_order(plan)[rank]
        assert own["DMLC_ROLE"] == task.role and own["LAUNCHKIT_ROLE_RANK"] == str(task.rank)
        assert own["DMLC_TASK_ID"] == str(task.task_id)
        assert own["LAUNCHKIT_LOCAL_RANK"] == str(task.local_rank)


def test_irregular_rows_are_kept_exactly() -> None:
    rows = [
        (7, {"A": "x"}),
        (3, {"A": "y", "B": "01"}),
        (4, {"A": "y", "B": "02"}),
        (5, {}),
        (6, {"C": "1,2"}),
        (8, {"C": "3,4"}),
        (9, {"C": "5"}),
        (10, {"C": "-1"}),
        (11, {"C": "-2"}),
    ]
    raw = tasktable.encode(rows)
    assert [tasktable.lookup(raw, r) for r in range(len(rows))] == rows
    assert list(tasktable.rows(json.loads(raw))) == rows
    with pytest.raises(ValueError, match="outside the job's 0 tasks"):
        tasktable.lookup(tasktable.encode([]), 0)


def test_version_1_tables_are_still_read() -> None:
    raw = json.dumps({"v": 1, "tasks": [{"i": 5, "env": {"A": "1"}}, {"i": 6, "env": {"A": "2"}}]})
    assert tasktable.lookup(raw, 1) == (6, {"A": "2"})
    assert list(tasktable.rows(json.loads(raw))) == [(5, {"A": "1"}), (6, {"A": "2"})]
    with pytest.raises(ValueError, match="outside the job's 2 tasks"):
        tasktable.lookup(raw, 2)


def test_values_with_numbers_in_text_step_with_their_rows() -> None:
    """torchrun's TORCHELASTIC_ERROR_FILE names the worker inside a path: its rows differ in a
    number within text. Before, such a value broke every run, so each worker's row was written
    whole, a long role variable with it (16 x 9000 bytes: over MAX_ARG_STRLEN, "Argument list too
    long" at the engine's start). A run of digits with a leading zero stays text."""
    rows = [
        (i + 1, {"E": f"/tmp/launchkit-1201-225937-aab063-attempt0-worker{i}-error.json", "F": "f" * 9000})
        for i in range(16)
    ]
    rows += [
        (17, {"E": "x09"}),
        (18, {"E": "x10"}),
        (19, {"E": "x11"}),
        (20, {"E": "v1.2"}),
        (21, {"E": "v1.3"}),
    ]
    raw = tasktable.encode(rows)
    assert len(raw) < 10_000, len(raw)
    assert [tasktable.lookup(raw, r) for r in range(len(rows))] == rows
    assert list(tasktable.rows(json.loads(raw))) == rows
    assert json.loads(raw)["v"] == 3  # a reader of version 2 stepped only lists of numbers


def test_tables_a_version_2_reader_could_read_stay_version_2_and_later_ones_are_refused() -> None:
    raw = tasktable.encode(
        [(1, {"A": "0,1", "B": "x"}), (2, {"A": "2,3", "B": "x"}), (3, {"A": "4,5", "B": "x"})]
    )
    assert json.loads(raw)["v"] == 2
    later = json.dumps({"v": 4, "n": 1, "groups": []})
    with pytest.raises(
        ValueError, match="version 4, and this launchkit reads versions 1 to 3: the launcher's"
    ):
        tasktable.lookup(later, 0)


def test_engine_env_of_workers_with_a_long_role_variable_stays_under_the_kernels_limit() -> None:
    """The rows of tests/cluster/test_scale_engine.py: 16 workers with torchrun's variables and a
    9000-byte --env-worker value, one server, on one host."""
    spec = LaunchSpec(
        num_workers=16,
        num_servers=1,
        command=("python3", "train.py"),
        backend="mpi",
        hosts=(Host("localhost"),),
        env_worker=(("LK_FILLER", "f" * 9000),),
    )
    plan = make_plan(
        spec,
        job_id="1201-225937-aab063",
        secret="s",
        root_uri="127.0.0.1",
        root_port=9000,
        node_host_of={spec.hosts[0]: ""},
    )
    ordered = rank_order(plan)
    env = engine_env(plan, ordered, 5.0)
    assert len(env[shim.TASKS_VAR]) < 2 * 9000 + 4096, len(env[shim.TASKS_VAR])
    for rank, task in enumerate(ordered):
        index, own = shim.task_of({**env, "OMPI_COMM_WORLD_RANK": str(rank)})
        assert plan.tasks[index] == task
        assert {**own, **split_env(ordered)[0]} == dict(task.env)
