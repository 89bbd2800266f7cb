"""The launcher's side (build_env / make_plan) and the node's side (NodeEnv) agree."""

from __future__ import annotations

import pytest

import dmlc_env
from launchkit.core.plan import render_argv
from launchkit.core.spec import Host, LaunchSpec
from tests.launchkit.plans import make_plan


def spec(**kw) -> LaunchSpec:
    base = dict(num_workers=2, num_servers=2, command=("python", "train.py"))
    base.update(kw)
    return LaunchSpec(**base)


def test_every_process_reads_back_what_the_launcher_set() -> None:
    plan = make_plan(spec(interface="lo"), job_id="j1", secret="s3cret", root_uri="127.0.0.1", root_port=9091)
    assert [t.role for t in plan.tasks] == ["scheduler", "server", "server", "worker", "worker"]
    for t in plan.tasks:
        node = dmlc_env.NodeEnv.from_environ(t.env)
        assert node.role == t.role
        assert node.role_rank == t.rank
        assert node.task_id == t.task_id
        assert node.local_rank == t.local_rank
        assert (node.root_uri, node.root_port) == ("127.0.0.1", 9091)
        assert (node.num_servers, node.num_workers) == (2, 2)
        assert node.job_id == "j1" and node.secret == "s3cret"
        assert node.interface == "lo" and node.cluster == "local"
        assert node.node_host == "127.0.0.1"
    assert sorted(t.task_id for t in plan.tasks) == list(range(5))
    assert plan.tasks[0].task_id == 4  # the scheduler comes after servers and workers


def test_env_flags_apply_per_role_and_cannot_replace_identity() -> None:
    plan = make_plan(
        spec(
            env=(("A", "1"), ("LAUNCHKIT_JOB_SECRET", "x"), ("LAUNCHKIT_JOB_ID", "y")),
            env_server=(("S", "srv"),),
            env_worker=(("W", "a b $c 'd' \"e\" f=g:h"),),
        ),
        job_id="j",
        secret="real",
        root_uri="h",
        root_port=1,
    )
    for t in plan.tasks:
        assert t.env["A"] == "1"
        assert t.env["LAUNCHKIT_JOB_SECRET"] == "real"
        assert t.env["LAUNCHKIT_JOB_ID"] == "j"
        assert ("S" in t.env) == (t.role == "server")
        assert ("W" in t.env) == (t.role == "worker")
    assert plan.by_role("worker")[0].env["W"] == "a b $c 'd' \"e\" f=g:h"


def test_gpus_per_worker_slices_by_local_rank() -> None:
    plan = make_plan(
        spec(num_workers=3, num_servers=1, gpus_per_worker=2),
        job_id="j",
        secret="s",
        root_uri="h",
        root_port=1,
    )
    assert [t.env["CUDA_VISIBLE_DEVICES"] for t in plan.by_role("worker")] == ["0,1", "2,3", "4,5"]
    assert plan.by_role("server")[0].env["CUDA_VISIBLE_DEVICES"] == ""


def test_remote_backends_publish_the_host_and_run_in_sync_dir() -> None:
    plan = make_plan(
        spec(backend="ssh", hosts=(Host("10.0.0.1"), Host("10.0.0.2")), sync_dst_dir="/srv/job", cwd="/here"),
        job_id="j",
        secret="s",
        root_uri="10.0.0.9",
        root_port=1,
    )
    sched = plan.tasks[0]
    assert sched.cwd == "/here" and sched.env["DMLC_NODE_HOST"] == "10.0.0.9"
    assert {t.env["DMLC_NODE_HOST"] for t in plan.tasks[1:]} == {"10.0.0.1", "10.0.0.2"}
    assert {t.cwd for t in plan.tasks[1:]} == {"/srv/job"}


def test_merge_env_defaults() -> None:
    assert dmlc_env.merge_env({}, {"X": "1"})["PYTHONUNBUFFERED"] == "1"
    assert dmlc_env.merge_env({"PYTHONUNBUFFERED": "0"}, {})["PYTHONUNBUFFERED"] == "0"
    assert dmlc_env.merge_env({}, {"PYTHONUNBUFFERED": ""})["PYTHONUNBUFFERED"] == ""


def test_redact_hides_the_secret() -> None:
    assert dmlc_env.redact({"LAUNCHKIT_JOB_SECRET": "s", "A": "b"}) == {
        "LAUNCHKIT_JOB_SECRET": "<hidden>",
        "A": "b",
    }


@pytest.mark.parametrize(
    ("env", "msg"),
    [
        ({}, "DMLC_ROLE is not set"),
        ({"DMLC_ROLE": "boss"}, "expected one of"),
        (
            {
                "DMLC_ROLE": "worker",
                "DMLC_PS_ROOT_URI": "h",
                "DMLC_PS_ROOT_PORT": "x",
                "DMLC_NUM_SERVER": "1",
                "DMLC_NUM_WORKER": "1",
            },
            "DMLC_PS_ROOT_PORT='x': expected an integer",
        ),
    ],
)
def test_node_env_errors_name_the_variable(env: dict[str, str], msg: str) -> None:
    with pytest.raises((KeyError, ValueError), match=msg):
        dmlc_env.NodeEnv.from_environ(env)


def test_render_argv() -> None:
    assert render_argv(["python train.py --lr 0.1"]) == ("sh", "-c", "python train.py --lr 0.1")
    assert render_argv(["python", "train.py", "a b"]) == ("python", "train.py", "a b")
    assert render_argv(["hostname"]) == ("hostname",)


def test_trainer_core_reads_what_the_launcher_sets() -> None:
    """The other side of the contract: trainer_core's node configuration from a planned env."""
    from trainer_core.config import NodeConfig

    plan = make_plan(
        spec(num_workers=3, num_servers=2), job_id="j7", secret="s" * 64, root_uri="127.0.0.1", root_port=9
    )
    for t in plan.tasks:
        cfg = NodeConfig.from_environ(dmlc_env.merge_env({}, t.env))
        assert cfg.role == t.role
        assert cfg.env.role_rank == t.rank
        assert cfg.job_id == "j7" and cfg.secret == "s" * 64
        assert (cfg.env.root_uri, cfg.env.root_port) == ("127.0.0.1", 9)
        assert (cfg.env.num_workers, cfg.env.num_servers) == (3, 2)


def test_the_peer_failed_line_reads_back_as_the_node_it_names() -> None:
    """dmlc_env.ending: what a node says as it ends because another failed, and what a launcher
    reads back; a name that is not a node's (free text, a newline) becomes ``another node``."""
    import io

    from dmlc_env.ending import PeerFailure, peer_failed_line, peer_failure, say_peer_failed

    for node, read in [
        ("worker 1", PeerFailure("worker", 1)),
        ("server 0", PeerFailure("server", 0)),
        ("scheduler", PeerFailure("scheduler", 0)),
        (None, PeerFailure(None)),
        ("1 of 2 workers", PeerFailure(None)),
        ("worker 1\nworker 2", PeerFailure(None)),
    ]:
        line = peer_failed_line(node)
        assert "\n" not in line and peer_failure(line) == read
        assert peer_failure(f"[12:00:00 4242] {line}") == read  # after a logging prefix
    out = io.StringIO()
    say_peer_failed("worker 3", out)
    assert out.getvalue() == "dmlc_env: this node ends because worker 3 failed\n"
    assert (
        peer_failure("worker 1 failed") is None
        and peer_failure(peer_failed_line("worker 1") + " (x)") is None
    )


def test_the_waited_line_reads_back_as_the_node_and_the_operation() -> None:
    """dmlc_env.ending: what a node says as a wait for another ends in a failure (trainer_core's
    collective waits), and what the launcher reads back; only a node's name makes a line."""
    import io

    from dmlc_env.ending import Waited, say_waited, waited_for, waited_line

    line = waited_line("worker 1", "allreduce (operation 3)")
    assert line == "dmlc_env: this node waited for worker 1 in allreduce (operation 3)"
    assert waited_for(f"[12:00:00 4242] {line}") == Waited("worker", 1, "allreduce (operation 3)")
    assert waited_for(str(waited_line("scheduler", "barrier\n(operation 0)"))) == Waited(
        "scheduler", 0, "barrier (operation 0)"
    )
    assert waited_line("rank 1", "x") is None and waited_for("waited for worker 1 in x") is None
    out = io.StringIO()
    say_waited("worker 2", "broadcast (operation 7)", out)
    assert waited_for(out.getvalue().rstrip("\n")) == Waited("worker", 2, "broadcast (operation 7)")


def test_without_servers_only_workers_and_worker_0_serves_the_root() -> None:
    plan = make_plan(
        spec(num_servers=0, num_workers=3),
        job_id="j",
        secret="s",
        root_uri="127.0.0.1",
        root_port=9091,
        master=("127.0.0.1", 9092),
    )
    assert [(t.role, t.rank, t.task_id) for t in plan.tasks] == [
        ("worker", 0, 0),
        ("worker", 1, 1),
        ("worker", 2, 2),
    ]
    for t in plan.tasks:
        node = dmlc_env.NodeEnv.from_environ(t.env)
        assert node.root_in_worker0 and (node.root_uri, node.root_port) == ("127.0.0.1", 9091)
        assert (t.env["MASTER_ADDR"], t.env["MASTER_PORT"]) == ("127.0.0.1", "9092")
        assert (t.env["RANK"], t.env["WORLD_SIZE"]) == (str(t.rank), "3")
        assert (t.env["LOCAL_RANK"], t.env["LOCAL_WORLD_SIZE"], t.env["NODE_RANK"]) == (str(t.rank), "3", "0")
    with_servers = make_plan(spec(), job_id="j", secret="s", root_uri="h", root_port=1)
    assert not any(dmlc_env.NodeEnv.from_environ(t.env).root_in_worker0 for t in with_servers.tasks)


def test_torchs_variables_count_workers_and_their_hosts() -> None:
    hosts = (Host("a", slots=2), Host("b", slots=1), Host("c", slots=2))
    plan = make_plan(
        spec(num_servers=2, num_workers=5, backend="ssh", hosts=hosts),
        job_id="j",
        secret="s",
        root_uri="10.0.0.9",
        root_port=1,
        master=("10.0.0.1", 29500),
    )
    assert plan.tasks[0].role == "scheduler"  # with servers, as before
    rows = [
        (
            t.host.name,
            *(
                t.env[k]
                for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
            ),
        )
        for t in plan.by_role("worker")
    ]
    assert rows == [
        ("a", "0", "5", "0", "2", "0", "0"),
        ("a", "1", "5", "1", "2", "0", "0"),
        ("b", "2", "5", "0", "1", "1", "1"),
        ("c", "3", "5", "0", "2", "2", "2"),
        ("c", "4", "5", "1", "2", "2", "2"),
    ]
    assert {(t.env["MASTER_ADDR"], t.env["MASTER_PORT"]) for t in plan.by_role("worker")} == {
        ("10.0.0.1", "29500")
    }
    for t in [*plan.by_role("server"), *plan.by_role("scheduler")]:  # torch's processes are the workers
        assert not set(dmlc_env.TORCH_VARS) & set(t.env)


def test_every_process_names_the_home_of_its_record_which_cannot_be_overridden() -> None:
    plan = make_plan(
        spec(env=(("LAUNCHKIT_JOB_HOME", "elsewhere:/x"),)),
        job_id="j",
        secret="s",
        root_uri="h",
        root_port=1,
        job_home="login1:/home/al/.launchkit",
    )
    assert {t.env["LAUNCHKIT_JOB_HOME"] for t in plan.tasks} == {"login1:/home/al/.launchkit"}
    assert dmlc_env.launcher_owned("LAUNCHKIT_JOB_HOME")
    unset = make_plan(spec(), job_id="j", secret="s", root_uri="h", root_port=1)
    assert all("LAUNCHKIT_JOB_HOME" not in t.env for t in unset.tasks)


def test_elastic_bounds_travel_both_ways_and_only_in_an_elastic_job() -> None:
    job = dmlc_env.JobEnv("j", "s", "local", "h", 1, 0, 3, elastic=(2, 4))
    task = dmlc_env.TaskEnv("worker", 0, 0, 0, "h")
    env = dmlc_env.build_env(job, task)
    assert env["LAUNCHKIT_ELASTIC"] == "2:4"
    assert dmlc_env.NodeEnv.from_environ(env).elastic == (2, 4)
    fixed = dmlc_env.build_env(dmlc_env.JobEnv("j", "s", "local", "h", 1, 0, 3), task)
    assert "LAUNCHKIT_ELASTIC" not in fixed and dmlc_env.NodeEnv.from_environ(fixed).elastic is None
    assert dmlc_env.launcher_owned("LAUNCHKIT_ELASTIC")


@pytest.mark.parametrize("value", ["4", "3:2", "0:2", "a:b", "2:"])
def test_a_broken_elastic_value_is_named(value: str) -> None:
    with pytest.raises(ValueError, match=r"LAUNCHKIT_ELASTIC=.*expected MIN:MAX"):
        dmlc_env.parse_elastic(value)
