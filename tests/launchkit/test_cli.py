"""The CLI's parsing, plans and error messages (real CLI in a subprocess: exact exit codes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.launchkit.procs import LAUNCHKIT, run

SEED_LINES = [
    # the seeds' tools/launch.py command lines, with `launchkit launch` in place of `python tools/launch.py`
    ["-n", "2", "-s", "2", "-H", "hosts", "--sync-dst-dir", "/home/ubuntu/cifar10_dist", "--launcher", "ssh",
     "python /home/ubuntu/cifar10_dist/cifar10_dist.py"],
    ["-n", "3", "-H", "hosts", "--launcher", "ssh", "python", "image_classification.py", "--dataset", "cifar10",
     "--model", "vgg11", "--epochs", "1", "--kvstore", "dist_sync"],
    ["-n", "3", "-H", "hosts", "--launcher", "ssh", "--sync-dst-dir", "/tmp/mxnet_job/", "python",
     "image_classification.py", "--dataset", "cifar10", "--model", "vgg11", "--epochs", "1", "--kvstore", "dist_sync"],
    ["-n", "3", "--launcher", "local", "python", "image_classification.py", "--dataset", "cifar10", "--model", "vgg11",
     "--epochs", "1", "--kvstore", "dist_sync"],
]  # fmt: skip


@pytest.fixture
def hosts_dir(tmp_path: Path) -> Path:
    (tmp_path / "hosts").write_text("127.0.0.11\n127.0.0.12\n127.0.0.13\n127.0.0.14\n127.0.0.15\n")
    return tmp_path


def dry(args: list[str], cwd: Path) -> dict:
    res = run(["launch", "--dry-run", "--json", *args], cwd=cwd)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("line", SEED_LINES)
def test_seed_command_lines_plan(line: list[str], hosts_dir: Path) -> None:
    plan = dry(line, hosts_dir)
    tasks = plan["tasks"]
    n = int(line[1])
    s = int(line[line.index("-s") + 1]) if "-s" in line else n
    assert [t["role"] for t in tasks] == ["scheduler"] + ["server"] * s + ["worker"] * n
    command = line[line.index("python") :] if "python" in line else line[-1:]
    if len(command) == 1:
        assert tasks[1]["argv"] == ["sh", "-c", command[0]]
    else:
        assert tasks[1]["argv"] == command
    if "ssh" in line:
        assert plan["backend"] == "ssh"
        hosts = [f"127.0.0.{11 + i}" for i in range(5)]
        # MXNet's rule: process i on hosts[i % len(hosts)]
        assert [t["host"] for t in tasks[1:]] == [hosts[i % 5] for i in range(s + n)]
        for t in tasks[1:]:
            assert t["env"]["DMLC_NODE_HOST"] == t["host"]
        sync = line[line.index("--sync-dst-dir") + 1] if "--sync-dst-dir" in line else str(hosts_dir)
        assert {t["cwd"] for t in tasks[1:]} == {sync}
    else:
        assert plan["backend"] == "local"
        assert {t["host"] for t in tasks} == {"localhost"}
    for t in tasks:
        assert t["env"]["LAUNCHKIT_JOB_SECRET"] == "<hidden>"
        assert t["env"]["DMLC_NUM_WORKER"] == str(n) and t["env"]["DMLC_NUM_SERVER"] == str(s)


def test_dry_run_human_plan_starts_nothing(hosts_dir: Path, launchkit_home: Path) -> None:
    res = run(["launch", "--dry-run", *SEED_LINES[1]], cwd=hosts_dir)
    assert res.returncode == 0, res.stderr
    assert "launcher ssh" in res.stdout and "127.0.0.15" in res.stdout
    assert "worker 2: " in res.stdout and "$ python image_classification.py --dataset cifar10" in res.stdout
    assert "LAUNCHKIT_JOB_SECRET=<hidden>" in res.stdout
    assert not (launchkit_home / "jobs").exists()


def test_default_launcher_is_ssh_with_hostfile(hosts_dir: Path) -> None:
    assert dry(["-n", "1", "-H", "hosts", "python", "x.py"], hosts_dir)["backend"] == "ssh"
    assert dry(["-n", "1", "python", "x.py"], hosts_dir)["backend"] == "local"


def test_slots_and_workers_only(tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("a slots=2\nb slots=2\n")
    plan = dry(["-n", "3", "-s", "0", "-H", "hf", "--launcher", "ssh", "python", "x.py"], tmp_path)
    assert [(t["role"], t["host"], t["local_rank"]) for t in plan["tasks"]] == [
        ("worker", "a", 0),
        ("worker", "a", 1),
        ("worker", "b", 0),
    ]  # without servers no scheduler process: worker 0 serves the rendezvous on its host
    torch = [
        [t["env"][k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")] for t in plan["tasks"]
    ]
    assert torch == [["0", "0", "2", "0"], ["1", "1", "2", "0"], ["2", "0", "1", "1"]]
    assert {t["env"]["DMLC_PS_ROOT_URI"] for t in plan["tasks"]} == {"<worker 0's address>"}


def test_scheduler_overrides_and_interface(tmp_path: Path) -> None:
    plan = dry(
        ["-n", "1", "--scheduler-ip", "127.0.0.9", "--scheduler-port", "9555", "--interface", "lo", "x"],
        tmp_path,
    )
    env = plan["tasks"][0]["env"]
    assert (env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"], env["DMLC_INTERFACE"]) == (
        "127.0.0.9",
        "9555",
        "lo",
    )
    plan = dry(["-n", "1", "--interface", "lo", "x"], tmp_path)
    assert plan["tasks"][1]["env"]["DMLC_PS_ROOT_URI"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "2", "-H", "hf", "python", "x.py"], "hf:2: bad port 'x': expected a number from 1 to 65535"),
        (["-n", "2", "-H", "missing", "python"], "missing: no such file"),
        (
            ["-n", "5", "-H", "slots", "--launcher", "ssh", "x"],
            "5 workers do not fit in the hostfile's 3 slots",
        ),
        (["-n", "0", "x"], "-n/--num-workers must be at least 1"),
        (["-n", "1", "--env", "A=1", "x"], "--env 'A=1': expected NAME:VALUE or NAME"),
        (
            ["-n", "1", "--env", "UNSET_VAR_XYZ", "x"],
            "UNSET_VAR_XYZ is not set in the launcher's environment",
        ),
        (["-n", "1", "--launcher", "pbs", "x"], "--launcher 'pbs': expected one of local, ssh"),
        (["-n", "1"], "no command given"),
        (["-n", "1", "--interface", "nosuchif0", "x"], "no network interface named 'nosuchif0'"),
        (["-n", "1", "--scheduler-port", "70000", "x"], "expected a number from 1 to 65535"),
        (["-n", "1", "--launcher", "ssh", "x"], "needs a hostfile"),
        (["-n", "1", ""], "empty command '': expected a program to run"),
        (["-n", "1", " "], "empty command ' ': expected a program to run"),
        (["-n", "1", "--", "\t"], "empty command ' ': expected a program to run"),  # (the tab, as printed)
        (["-n", "1", "A=1", ""], "empty command A=1 '': expected a program to run"),
        (["-n", "1", "A=1"], "no command after A=1: NAME=VALUE words set variables"),
        (["-n", "1", "--", "A=1", "B=2"], "no command after A=1 B=2: NAME=VALUE words"),
        (["-n", "1", "", "x.py"], "empty command '' x.py: expected a program to run"),
        (["-n", "1", "--sync-timeout", "0", "x"], "--sync-timeout must be more than 0, got 0"),
        (["-n", "1", "--time-limit", "0", "x"], "--time-limit must be more than 0, got 0"),
        (["-n", "1", "--grace-period", "-1", "x"], "-1.0: expected a number from 0 to 10000000"),
        (["-n", "1", "--gpus-per-worker", "0", "x"], "0: expected a number from 1 to 1024"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "hf").write_text("good\nnode:x\n")
    (tmp_path / "slots").write_text("a slots=2\nb\n")
    res = run(["launch", *args], cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in " ".join(res.stderr.split())
    assert "Traceback" not in res.stderr


def test_missing_required_flag_is_usage_error() -> None:
    res = run(["launch", "python", "x.py"])
    assert res.returncode == 2
    assert "-n" in res.stderr and "Traceback" not in res.stderr


def test_hosts_list_table_and_json() -> None:
    res = run(["hosts", "list", "-H", "hostfiles/example"])
    assert res.returncode == 0, res.stderr
    assert "node4" in res.stdout and "alice" in res.stdout and "fe80::1" in res.stdout
    res = run(["hosts", "list", "-H", "hostfiles/example", "--json"])
    data = json.loads(res.stdout)
    assert data[3] == {"host": "node4", "user": "alice", "port": 2222, "slots": 4, "line": data[3]["line"]}


def test_hosts_list_bad_file(tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("ok\n\nbad slots=-1\n")
    res = run(["hosts", "list", "-H", str(tmp_path / "hf")])
    assert res.returncode == 2
    assert f"{tmp_path / 'hf'}:3: bad slots '-1'" in res.stderr


def test_version_and_module_entry() -> None:
    res = run(["--version"])
    assert res.returncode == 0 and res.stdout.startswith("launchkit ")


def test_hosts_add_and_remove_keep_comments(tmp_path: Path) -> None:
    hf = tmp_path / "hosts"
    hf.write_text("# my cluster\nnode1  # first\n\nnode2:2222\n")
    res = run(["hosts", "add", "alice@node3:22", "--slots", "4", "-H", str(hf)])
    assert res.returncode == 0, res.stderr
    assert hf.read_text() == "# my cluster\nnode1  # first\n\nnode2:2222\nalice@node3:22 slots=4\n"
    res = run(["hosts", "add", "node1", "-H", str(hf)])
    assert res.returncode == 2 and "already there" in res.stderr
    res = run(["hosts", "remove", "node2:2222", "-H", str(hf)])
    assert res.returncode == 0, res.stderr
    assert hf.read_text() == "# my cluster\nnode1  # first\n\nalice@node3:22 slots=4\n"
    res = run(["hosts", "remove", "nodeX", "-H", str(hf)])
    assert res.returncode == 2 and "no line names nodeX" in res.stderr
    res = run(["hosts", "add", "bad host;rm", "-H", str(hf)])
    assert res.returncode == 2 and "bad host name" in res.stderr
    new = tmp_path / "new"
    assert run(["hosts", "add", "[fe80::1]:22", "-H", str(new)]).returncode == 0
    assert new.read_text() == "[fe80::1]:22\n"


def test_leading_assignments_set_variables(tmp_path: Path) -> None:
    """launch.py runs the command through a shell: `PS_VERBOSE=1 python3 train.py` sets it."""
    plan = dry(["-n", "2", "--launcher", "local", "PS_VERBOSE=1", "A=x y", "python3", "train.py"], tmp_path)
    for t in plan["tasks"]:
        assert t["argv"] == ["python3", "train.py"]
        assert t["env"]["PS_VERBOSE"] == "1" and t["env"]["A"] == "x y"
    assert plan["job_name"] == "train"


def test_p3_sets_the_van_for_every_process(tmp_path: Path) -> None:
    plan = dry(["-n", "2", "--launcher", "local", "--p3", "python3", "train.py"], tmp_path)
    for t in plan["tasks"]:
        assert t["env"]["DMLC_PS_VAN_TYPE"] == "p3" and t["env"]["DMLC_PS_WATER_MARK"] == "10"


def test_mpi_dry_run_shows_mpirun_without_values(tmp_path: Path) -> None:
    plan = dry(
        ["-n", "2", "-s", "2", "--launcher", "mpi", "--env", "TOKEN:s3cr$t", "python3", "t.py"], tmp_path
    )
    (line,) = plan["engine_commands"]
    assert line[0] == "mpirun" and line[line.index("-np") + 1] == "4"
    assert "--host" in line and line[line.index("--host") + 1] == "localhost:4"
    assert line[line.index("TOKEN") - 1 : line.index("TOKEN") + 1] == ["-x", "TOKEN"]
    assert "s3cr$t" not in " ".join(line)
    assert line[-5:] == ["-m", "launchkit.hostside.shim", "--", "python3", "t.py"]
    assert any("allow-run-as-root" in n for n in plan["notes"])


def test_slurm_dry_run_outside_an_allocation(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = run(
        [
            "launch",
            "--dry-run",
            "--json",
            "-n",
            "2",
            "-s",
            "1",
            "--launcher",
            "slurm",
            "--nodes",
            "2",
            "--partition",
            "gpu q",
            "--slurm-args",
            "--exclusive --comment 'a b'",
            "python3",
            "t.py",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    sbatch, servers, workers = plan["engine_commands"]
    assert sbatch[:2] == ["sbatch", "--parsable"] and "--partition=gpu q" in sbatch
    assert sbatch[-3:] == ["--exclusive", "--comment", "a b"]
    assert servers[0] == "srun" and "--ntasks=1" in servers and "--ntasks=2" in workers
    assert workers[-3:] == ["--", "python3", "t.py"]
    assert [t["host"] for t in plan["tasks"][1:]] == [
        "<node 1 of the allocation>",
        "<node 2 of the allocation>",
        "<node 1 of the allocation>",
    ]
    assert any("stdin" in note for note in plan["notes"])


def test_unknown_mpi_is_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'FancyMPI 9.9 (c) nobody'\n")
    fake.chmod(0o755)
    res = run(["launch", "-n", "1", "--launcher", "mpi", "--mpirun", str(fake), "true"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "unknown MPI implementation" in res.stderr and "FancyMPI 9.9" in res.stderr
    assert "Traceback" not in res.stderr
    res = run(["launch", "-n", "1", "--launcher", "mpi", "--mpirun", "no-such-mpirun", "true"], cwd=tmp_path)
    assert res.returncode == 2 and "not found on PATH" in res.stderr


def test_mpi_dry_run_is_the_real_line_and_bad_options_fail_the_same(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("nodea\nnodeb\n")
    plan = dry(
        ["-n", "2", "--launcher", "mpi", "-H", "hosts", "-i", "/keys/id", "--ssh-port", "2222", "true"],
        tmp_path,
    )
    (line,) = plan["engine_commands"]
    rsh = line[line.index("plm_rsh_args") + 1]
    assert "-i /keys/id" in rsh and "-p 2222" in rsh
    for args, message in (
        (["--mpi-args", '"unclosed'], "--mpi-args"),
        (["-H", "v6", "--launcher", "mpi"], "IPv6 addresses cannot be given"),
        (["--launcher", "sge", "--pe", "smp:x"], "expected NAME or NAME:SLOTS"),
        (["--launcher", "slurm", "--mem-per-worker", "lots"], "--mem-per-worker (or --mem)"),
    ):
        (tmp_path / "v6").write_text("[fe80::1]\n")
        launcher = [] if "--launcher" in args else ["--launcher", "mpi"]
        res = run(["launch", "--dry-run", "-n", "1", *launcher, *args, "true"], cwd=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert message in res.stderr and "Traceback" not in res.stderr


def test_mpi_and_horovod_style_hostfiles(tmp_path: Path) -> None:
    (tmp_path / "mpi").write_text("node1 slots=2 max_slots=4\nnode2 slots = 2 max-slots=2\n")
    res = run(["hosts", "list", "-H", "mpi", "--json"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert [(h["host"], h["slots"]) for h in json.loads(res.stdout)] == [("node1", 2), ("node2", 2)]
    assert res.stderr == ""
    (tmp_path / "horovod").write_text("worker-0:2\nworker-1:2\n")
    res = run(
        ["launch", "--dry-run", "--json", "-n", "2", "-s", "0", "-H", "horovod", "python", "x.py"],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert [t["host"] for t in json.loads(res.stdout)["tasks"]] == ["worker-0:2", "worker-1:2"]
    err = " ".join(res.stderr.split())
    assert (
        "launchkit: warning: horovod:1: 'worker-0:2' means ssh port 2 (as in MXNet's launch.py), not 2 slots"
        in err
    )
    assert "horovod:2: 'worker-1:2'" in err


def test_dry_run_scheduler_address_is_the_launchs_or_says_it_is_chosen_at_launch(tmp_path: Path) -> None:
    # ssh publishes this machine's address on its connection to the first host: for a name that
    # does not resolve here (an ssh config alias, say) that is known only once connected
    (tmp_path / "alias").write_text("trainer-box.invalid\n127.0.0.12\n")
    plan = dry(["-n", "2", "-s", "1", "-H", "alias", "python", "x.py"], tmp_path)
    assert {t["env"]["DMLC_PS_ROOT_URI"] for t in plan["tasks"]} == {"<chosen at launch>"}
    assert plan["scheduler"].startswith("<chosen at launch>:")
    assert any(
        "scheduler's address (DMLC_PS_ROOT_URI) is chosen at launch" in n and "trainer-box.invalid" in n
        for n in plan["notes"]
    )
    res = run(["launch", "--dry-run", "-n", "2", "-s", "1", "-H", "alias", "python", "x.py"], cwd=tmp_path)
    assert (
        res.returncode == 0
        and "note: the scheduler's address (DMLC_PS_ROOT_URI) is chosen at launch" in res.stdout
    )
    # an address, or a name that resolves here: the route to it, as the connection's local address
    for first in ("127.0.0.12", "localhost"):
        (tmp_path / "hf").write_text(f"{first}\ntrainer-box.invalid\n")
        plan = dry(["-n", "2", "-s", "1", "-H", "hf", "python", "x.py"], tmp_path)
        assert plan["tasks"][1]["env"]["DMLC_PS_ROOT_URI"] == "127.0.0.1", first
        assert not any("chosen at launch" in n for n in plan["notes"])
    plan = dry(["-n", "1", "-s", "1", "-H", "alias", "--scheduler-ip", "10.9.8.7", "x"], tmp_path)
    assert plan["tasks"][1]["env"]["DMLC_PS_ROOT_URI"] == "10.9.8.7"


def test_output_that_cannot_be_written_is_a_clean_error() -> None:
    """stdout on a full disk ended in 'internal error: OSError: No space left on device', and a
    closed stdout in 'internal error: AttributeError: NoneType has no attribute write'."""
    for args in (["--version"], ["hosts", "list", "-H", "hostfiles/example", "--json"]):
        with open("/dev/full", "w") as full:
            res = subprocess.run(
                [*LAUNCHKIT, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=30
            )
        assert res.returncode == 74, res.stderr
        assert res.stderr == "launchkit: error: cannot write: No space left on device\n", res.stderr
        res = subprocess.run(
            ["sh", "-c", 'exec "$@" >&-', "sh", *LAUNCHKIT, *args], capture_output=True, text=True
        )
        assert res.returncode == 0 and res.stderr == "", res.stderr


def test_ctrl_c_while_the_commands_load_exits_130_without_a_traceback() -> None:
    """A Ctrl-C in the first half second (the commands' modules loading, nothing started) printed
    Python's KeyboardInterrupt traceback from an import. The interrupt is made to come at the
    import of one command's module, so the test does not depend on timing."""
    interrupting = (
        "import sys, runpy\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'launchkit.cli.top':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['launchkit', 'ps']\n"
        "runpy.run_module('launchkit', run_name='__main__')\n"
    )
    res = subprocess.run(
        [LAUNCHKIT[0], "-c", interrupting],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 130, res.stderr
    assert res.stderr == "" and res.stdout == ""
