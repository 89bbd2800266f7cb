"""torchrun's environment as the plan gives it (pure): OMP_NUM_THREADS=1 where a machine runs
more than one process and the user did not set it, torchrun's other variables with torchrun's
meanings, a pinned MASTER_PORT (--master-port)."""

from __future__ import annotations

import dmlc_env
from launchkit.core.spec import Host, LaunchSpec
from tests.launchkit.plans import make_plan


def spec(**kw) -> LaunchSpec:
    base = dict(num_workers=2, num_servers=0, command=("python", "train.py"))
    base.update(kw)
    return LaunchSpec(**base)


def plan_of(s: LaunchSpec, **kw):
    return make_plan(s, job_id="j", secret="s", root_uri="127.0.0.1", root_port=9, **kw)


def test_a_machine_with_more_than_one_process_gets_one_thread_each() -> None:
    plan = plan_of(spec(num_servers=1))
    assert {t.env.get("OMP_NUM_THREADS") for t in plan.tasks} == {"1"}  # the scheduler too: same machine
    assert plan.one_thread == 1
    alone = plan_of(spec(num_workers=1))
    assert "OMP_NUM_THREADS" not in alone.tasks[0].env and alone.one_thread == 0


def test_only_the_crowded_hosts_get_it() -> None:
    hosts = (Host("a", slots=2), Host("b", slots=1))
    plan = plan_of(spec(num_workers=3, backend="ssh", hosts=hosts))
    assert {t.host.name: t.env.get("OMP_NUM_THREADS") for t in plan.tasks} == {"a": "1", "b": None}
    assert plan.one_thread == 1


def test_the_users_own_value_is_left_alone() -> None:
    for kw in (
        {"env": (("OMP_NUM_THREADS", "4"),)},
        {"env_worker": (("OMP_NUM_THREADS", "4"),)},
        {"command": ("OMP_NUM_THREADS=4", "python", "train.py")},
    ):
        plan = plan_of(spec(**kw))
        assert all(t.env["OMP_NUM_THREADS"] == "4" for t in plan.tasks) and plan.one_thread == 0
    inherited = plan_of(spec(), inherited={"OMP_NUM_THREADS": "3"})
    assert all("OMP_NUM_THREADS" not in t.env for t in inherited.tasks) and inherited.one_thread == 0


def test_torchruns_variables_with_torchruns_meanings() -> None:
    hosts = (Host("a", slots=2), Host("b", slots=2))
    plan = plan_of(
        spec(num_workers=3, num_servers=1, backend="ssh", hosts=hosts, max_restarts=2),
        restart_count=1,
        master=("10.0.0.1", 29500),
    )
    for t in plan.by_role("worker"):
        e = t.env
        assert (e["ROLE_RANK"], e["ROLE_WORLD_SIZE"], e["ROLE_NAME"]) == (str(t.rank), "3", "default")
        assert e["GROUP_WORLD_SIZE"] == "2"  # the workers' hosts: a (0, 1), b (2)
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"]) == ("1", "2")
        assert e["TORCHELASTIC_RUN_ID"] == "j"
        assert e["TORCHELASTIC_ERROR_FILE"] == f"/tmp/launchkit-j-attempt1-worker{t.rank}-error.json"
    for t in [*plan.by_role("server"), *plan.by_role("scheduler")]:
        assert not (set(dmlc_env.TORCH_VARS) | set(dmlc_env.TORCH_DEFAULTS)) & set(t.env)


def test_role_name_and_the_error_file_are_the_users_to_set() -> None:
    plan = plan_of(spec(env_worker=(("ROLE_NAME", "trainer"), ("TORCHELASTIC_ERROR_FILE", "/shared/e.json"))))
    assert {(t.env["ROLE_NAME"], t.env["TORCHELASTIC_ERROR_FILE"]) for t in plan.tasks} == {
        ("trainer", "/shared/e.json")
    }
    assert not dmlc_env.launcher_owned("ROLE_NAME") and dmlc_env.launcher_owned("TORCHELASTIC_RUN_ID")


def test_master_port_pins_torchs_store_where_worker_0s_node_picks_the_address() -> None:
    engine = plan_of(spec(backend="mpi", master_port=29500))
    assert {(t.env["MASTER_ADDR"], t.env["MASTER_PORT"]) for t in engine.tasks} == {("", "29500")}
    given = plan_of(spec(master_port=29500), master=("127.0.0.1", 29500))
    assert {t.env["MASTER_PORT"] for t in given.tasks} == {"29500"}


def test_the_line_that_says_so() -> None:
    from launchkit.core.plan import one_thread_note

    local = one_thread_note(plan_of(spec()))
    assert local is not None and local.startswith(
        "OMP_NUM_THREADS=1 for every process on this machine (it runs"
    )
    hosts = (Host("a", slots=2), Host("b", slots=2))
    two = one_thread_note(plan_of(spec(num_workers=4, backend="ssh", hosts=hosts)))
    assert (
        two is not None
        and "on the 2 hosts that run more than one" in two
        and "--env OMP_NUM_THREADS:N" in two
    )
    assert one_thread_note(plan_of(spec(num_workers=1))) is None
