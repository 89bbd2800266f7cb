"""Slurm command lines and state mapping (pure), line by line, with hostile values."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from launchkit.backends.engine import scheduler_last
from launchkit.backends.slurm import (
    SlurmOptions,
    batch_env,
    batch_script,
    batch_spec,
    end_code,
    parse_mem,
    placeholder_hosts,
    sbatch_argv,
)
from launchkit.core.spec import Host, LaunchSpec
from launchkit.errors import UsageError
from launchkit.hostside import batchjob, tasktable
from tests.launchkit.plans import make_plan
from tests.launchkit.procs import fake_engine, run

HOSTILE = "a b'c\"$HOME\n`x`"
#: Linux's limit on one environment string (MAX_ARG_STRLEN: 32 pages)
MAX_ARG_STRLEN = 128 * 1024


def slots_of(step: dict) -> list[int]:
    """A step's node index per task, decoded."""
    return [k for k, _ in tasktable.rows(step["slots"])]


def plan_for(hosts: tuple[Host, ...], n: int = 2, s: int = 2):
    spec = LaunchSpec(
        num_workers=n,
        num_servers=s,
        command=("python3", "t.py", HOSTILE),
        backend="slurm",
        hosts=hosts,
        env=(("HOSTILE", HOSTILE),),
        cwd="/work dir/$x",
    )
    return make_plan(
        spec, job_id="j1", secret="topsecret", root_uri="", root_port=0, node_host_of=dict.fromkeys(hosts, "")
    )


def test_one_step_per_role_placed_round_robin_on_the_nodes() -> None:
    plan = plan_for((Host("n1"), Host("n2"), Host("n3")), n=3, s=2)
    spec = batch_spec(plan, SlurmOptions(python="/py", cpus_per_worker=4, mem_per_server="2G"), 5.0)
    servers, workers = spec["steps"]
    # MXNet's placement: process i on node i % 3 (servers 0, 1; workers 2, 3, 4)
    assert slots_of(servers) == [0, 1] and slots_of(workers) == [2, 0, 1]
    assert servers["offset"] == 0 and workers["offset"] == 2 and spec["scheduler"] == 5
    assert "--ntasks=2" in servers["srun"] and "--mem=2G" in servers["srun"]
    assert "--cpus-per-task=4" in workers["srun"] and "--distribution=arbitrary" in workers["srun"]
    assert spec["program"] == ["/py", "-m", "launchkit.hostside.shim", "--", "python3", "t.py", HOSTILE]
    rows = [t.role for t in scheduler_last(plan)]
    assert rows == ["server"] * 2 + ["worker"] * 3 + ["scheduler"]


def test_sbatch_line_and_values_only_in_the_environment() -> None:
    plan = plan_for(placeholder_hosts(2))
    opts = SlurmOptions(
        partition="debug",
        time="10:00",
        account="acc",
        qos="q",
        constraint="x&y",
        gpus_per_worker=2,
        extra=("--exclusive",),
        python="/py",
    )
    argv = sbatch_argv(plan, opts, "/w/out", "/work dir/$x")
    assert argv[:5] == ["sbatch", "--parsable", "--job-name=j1", "--output=/w/out", "--chdir=/work dir/$x"]
    for flag in (
        "--nodes=2",
        "--ntasks=4",
        "--partition=debug",
        "--time=10:00",
        "--account=acc",
        "--qos=q",
        "--constraint=x&y",
        "--gpus=4",
    ):
        assert flag in argv
    assert argv[-1] == "--exclusive"  # the script goes on stdin: nothing after the user's flags
    env = batch_env(plan, opts, 5.0, in_allocation=False)
    text = shlex.join(argv) + json.dumps(json.loads(env["LAUNCHKIT_BATCH"]))
    assert "topsecret" not in text and "topsecret" not in env["LAUNCHKIT_SHIM_TASKS"]
    assert env["LAUNCHKIT_JOB_SECRET"] == "topsecret"  # travels in the environment, by name
    assert env["DMLC_PS_ROOT_URI"] == "" and env["DMLC_PS_ROOT_PORT"] == "0"  # found by the batch job
    workers = json.loads(env["LAUNCHKIT_BATCH"])["steps"][1]["srun"]
    assert "--gpus-per-task=2" in workers


def test_batch_script_quotes_the_python() -> None:
    assert (
        batch_script("/opt/my env/py").splitlines()[-1]
        == "exec '/opt/my env/py' -m launchkit.hostside.batchjob"
    )


@pytest.mark.parametrize(
    ("state", "exit_code", "code"),
    [
        ("COMPLETED", "0:0", 0),
        ("FAILED", "3:0", 3),
        ("FAILED", "0:9", 137),
        ("TIMEOUT", "0:15", 124),
        ("CANCELLED", "0:15", 143),
        ("CANCELLED by 0", "0:15", 143),
        ("OUT_OF_MEMORY", "0:125", 137),
        ("NODE_FAIL", "0:0", 255),
        ("PREEMPTED", "0:0", 143),
    ],
)
def test_end_states(state: str, exit_code: str, code: int) -> None:
    assert end_code(state, exit_code) == code


def test_memory_is_per_task_though_slurm_counts_it_per_node() -> None:
    plan = plan_for((Host("n1"),), n=3, s=2)  # every task on one node
    spec = batch_spec(plan, SlurmOptions(python="/py", mem_per_server="4G", mem_per_worker="512"), 5.0)
    servers, workers = spec["steps"]
    assert "--mem=8G" in servers["srun"] and "--mem=1536M" in workers["srun"]
    with pytest.raises(UsageError, match="expected a number with an optional unit"):
        parse_mem("lots")


@pytest.mark.parametrize("slots", [None, 100])
def test_batch_size_does_not_grow_with_the_tasks(slots: int | None) -> None:
    """20,000 tasks over 200 nodes, round robin (MXNet's placement) or 100 a node in turn: the
    steps' placements are runs, a few hundred bytes where one index per task was about 100 KB
    here (1 MB at 200,000 tasks, over the 128 KiB one environment string may hold); each step's
    hostfile is the node of each of its tasks in rank order, as before."""
    hosts = tuple(Host(f"node{h:04d}", slots=slots) for h in range(200))
    spec = LaunchSpec(
        num_workers=10_000, num_servers=10_000, command=("python3", "t.py"), backend="slurm", hosts=hosts
    )
    plan = make_plan(
        spec, job_id="j1", secret="s", root_uri="", root_port=0, node_host_of=dict.fromkeys(hosts, "")
    )
    batch = batch_spec(plan, SlurmOptions(python="/py"), 5.0)
    text = json.dumps(batch, separators=(",", ":"))  # as batch_env carries it
    assert len(text) < 2048, len(text)
    nodes = [h.name for h in hosts]  # the allocation's nodes, in the order the launcher was given them
    ordered = scheduler_last(plan)
    for step, role in zip(json.loads(text)["steps"], ("server", "worker"), strict=True):
        expected = "".join(f"{t.host.name}\n" for t in ordered if t.role == role)
        assert batchjob.hostfile_text(step["slots"], nodes) == expected
    assert batchjob.hostfile_text([2, 0, 1], nodes[:3]) == "node0002\nnode0000\nnode0001\n"  # the older form


def test_no_slurm_controller_is_a_clear_refusal_exit_2(tmp_path: Path) -> None:
    """Was exit 126, 'worker 0 ... cannot start true: sbatch failed (exit 1): ...\\nsbatch: ...'
    with a literal newline; docs/exit-codes.md: a backend that is not available is exit 2."""
    said = (
        "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
        "sbatch: fatal: Could not establish a configuration source\n"
    )
    env = fake_engine(tmp_path / "bin", "sbatch", said)
    marker = tmp_path / "started"
    for detach in ([], ["--detach"]):
        res = run(
            ["launch", "--launcher", "slurm", "-n", "1", "-s", "0", *detach, "sh", "-c", f"touch {marker}"],
            cwd=tmp_path,
            env=env,
        )
        assert res.returncode == 2, (res.stdout, res.stderr)
        assert (
            "slurm: not available: sbatch failed (exit 1): sbatch: error: resolve_ctls_from_dns_srv: "
            "res_nsearch error: Unknown host; sbatch: fatal: Could not establish a configuration source; "
            "nothing was started (is the slurm engine running here?)"
        ) in res.stderr, res.stderr
        assert "\\n" not in res.stderr and "cannot start" not in res.stderr and "Traceback" not in res.stderr
        assert not marker.exists()


def test_an_elastic_jobs_worker_step_keeps_its_tasks_when_one_fails() -> None:
    """Slurm shrinks an elastic job: the workers' step runs without --kill-on-bad-exit (the launcher
    decides whether a failure ends the job); the servers' step, and a fixed job's, keep it."""
    hosts = (Host("n1"), Host("n2"))
    fixed = batch_spec(plan_for(hosts), SlurmOptions(python="/py"), 5.0)
    spec = LaunchSpec(
        num_workers=2, num_servers=1, command=("t",), backend="slurm", hosts=hosts, elastic=(1, 2)
    )
    plan = make_plan(
        spec, job_id="j1", secret="s", root_uri="", root_port=0, node_host_of=dict.fromkeys(hosts, "")
    )
    servers, workers = batch_spec(plan, SlurmOptions(python="/py"), 5.0)["steps"]
    assert "--kill-on-bad-exit=0" in workers["srun"] and "--kill-on-bad-exit=1" in servers["srun"]
    assert all("--kill-on-bad-exit=1" in step["srun"] for step in fixed["steps"])
