"""Values that would hang or silently change a launch are refused before anything starts (exit 2,
naming the value): numbers that are not finite or out of bounds (every command), an address
nothing can reach, a variable the launcher owns, an unusable LAUNCHKIT_HOME or working directory.
The real CLI in a subprocess; each refused launch runs a command that would leave a marker file."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import dmlc_env
from launchkit.cli.app import MAX_NUMBER, RANGES
from tests.launchkit.oddhomes import KINDS, odd_home
from tests.launchkit.procs import LAUNCHKIT, job_ids, run

TOO_BIG = str(MAX_NUMBER + 1)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["launch", "-n", "1", "--grace-period", "nan"], "--grace-period"),
        (["launch", "-n", "1", "--grace-period", "inf"], "--grace-period"),
        (["launch", "-n", "1", "--time-limit", "nan"], "--time-limit"),
        (["launch", "-n", "1", "--time-limit", "1e400"], "--time-limit"),
        (["launch", "-n", "1", "--restart-backoff", "-inf"], "--restart-backoff"),
        (["launch", "-n", "1", "--heartbeat-timeout", "nan"], "--heartbeat-timeout"),
        (["launch", "-n", "1", "--start-timeout", "inf"], "--start-timeout"),
        (["launch", "-n", "1", "--sync-timeout", TOO_BIG], "--sync-timeout"),
        (["launch", "-n", "99999999999999999999"], "--num-workers"),
        (["launch", "-n", "1", "--max-restarts", TOO_BIG], "--max-restarts"),
        (["kill", "--all", "--grace-period", "nan"], "--grace-period"),
        (["kill", "--all", "--grace-period", "-1"], "--grace-period"),
        (["top", "x", "--interval", "inf"], "--interval"),
        (["logs", "x", "--tail", "99999999999999999999"], "--tail"),
        (["logs", "x", "--tail", "-1"], "--tail"),
        (["logs", "x", "--rank", "-1"], "--rank"),
        (["top", "x", "--interval", "0.01"], "--interval"),
        (["hosts", "check", "-H", "hf", "--connect-timeout", "nan"], "--connect-timeout"),
        (["hosts", "add", "node9", "-H", "hf", "--slots", TOO_BIG], "--slots"),
        (["launch", "-n", "1", "--ssh-port", "70000"], "--ssh-port"),
        (["kill", "--all", "--ssh-port", "0"], "--ssh-port"),
        (["hosts", "check", "-H", "hf", "--ssh-port", "65536"], "--ssh-port"),
        (["launch", "-n", "1", "--gpus-per-worker", "9999999"], "--gpus-per-worker"),
    ],
)
def test_every_number_is_finite_and_bounded(tmp_path: Path, args: list[str], flag: str) -> None:
    """nan or inf as --grace-period hung the teardown with a process left running; 1e400 and nan
    were taken as time limits; --ssh-port 70000 was taken, --gpus-per-worker 9999999 made a
    CUDA_VISIBLE_DEVICES of 79 MB."""
    (tmp_path / "hf").write_text("node1\n")
    marker = tmp_path / "started"
    command = ["sh", "-c", f"touch {marker}"] if args[0] == "launch" else []
    res = run([*args, *command], cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    low, high = RANGES.get(flag, (0, MAX_NUMBER))
    assert flag in res.stderr and f"expected a number from {low} to {high}" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not marker.exists()
    assert (tmp_path / "hf").read_text() == "node1\n"


def test_the_largest_grace_period_still_ends_a_failed_job_at_once(tmp_path: Path) -> None:
    """The bound is one every wait takes: a failure with the longest grace period ends as soon as
    the others have exited on SIGTERM."""
    script = 'if [ "$DMLC_ROLE" = worker ] && [ "$LAUNCHKIT_ROLE_RANK" = 1 ]; then exit 3; fi; sleep 60'
    started = time.monotonic()
    res = run(
        ["launch", "-n", "2", "-s", "1", "--grace-period", str(MAX_NUMBER), "sh", "-c", script], cwd=tmp_path
    )
    assert res.returncode == 3, res.stderr
    assert time.monotonic() - started < 20, res.stderr


@pytest.mark.parametrize(
    "address", ["notanip", "10.0.0.1:80", "a b", "user@10.0.0.1", "nosuch.invalid", "192.0.2.1", "1.2.3"]
)
def test_a_scheduler_address_nothing_can_reach_is_refused(tmp_path: Path, address: str) -> None:
    """`--scheduler-ip notanip` gave no output at all until the time limit, then 124; so did an
    address no interface of this machine has (`1.2.3` is 1.2.0.3) with every process here."""
    marker = tmp_path / "started"
    res = run(
        ["launch", "-n", "1", "-s", "0", "--scheduler-ip", address, "sh", "-c", f"touch {marker}"],
        cwd=tmp_path,
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert f"--scheduler-ip {address!r}" in res.stderr and "Traceback" not in res.stderr
    assert not marker.exists()


def test_scheduler_addresses_that_work_are_taken(tmp_path: Path) -> None:
    for address in ("127.0.0.1", "::1", "localhost"):
        res = run(
            ["launch", "-n", "1", "-s", "0", "--scheduler-ip", address, "--dry-run", "true"], cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    ("words", "named"),
    [
        (["--env", "DMLC_ROLE:worker"], "--env DMLC_ROLE: DMLC_ROLE is set by the launcher"),
        (["--env", "LAUNCHKIT_JOB_ID:x"], "--env LAUNCHKIT_JOB_ID: LAUNCHKIT_JOB_ID is set by the launcher"),
        (["--env-server", "DMLC_NUM_WORKER:9"], "DMLC_NUM_WORKER is set by the launcher (the job's contract) and "
         "cannot be overridden; use -n"),
        (["--env-worker", "DMLC_PS_ROOT_PORT:9"], "cannot be overridden; use --scheduler-port"),
        (["--env", "MASTER_PORT:29500"], "MASTER_PORT is set by the launcher (the job's contract) and cannot be "
         "overridden; use --master-port"),
        (["--master-port", "29500", "--scheduler-port", "29500"], "--master-port 29500 is --scheduler-port too"),
        (["--env", "LAUNCHKIT_SHIM_TASKS:[]"], "--env LAUNCHKIT_SHIM_TASKS"),
        (["DMLC_PS_ROOT_URI=10.0.0.9"], "DMLC_PS_ROOT_URI=... (before the command): DMLC_PS_ROOT_URI is set"),
        (["--gpus-per-worker", "1", "--env-worker", "CUDA_VISIBLE_DEVICES:0"], "CUDA_VISIBLE_DEVICES is set by "
         "--gpus-per-worker"),
    ],
)  # fmt: skip
def test_a_variable_the_launcher_owns_is_refused(tmp_path: Path, words: list[str], named: str) -> None:
    """`--env DMLC_ROLE:worker` made the scheduler and servers workers too, and the job hung;
    `--env LAUNCHKIT_JOB_ID:x` was silently dropped."""
    marker = tmp_path / "started"
    flags = [w for w in words if not w.startswith("DMLC_PS_ROOT_URI=")]
    before = [w for w in words if w not in flags]
    res = run(["launch", "-n", "1", "-s", "1", *flags, *before, "sh", "-c", f"touch {marker}"], cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert named in " ".join(res.stderr.split()) and "Traceback" not in res.stderr
    assert not marker.exists()


def test_the_users_own_variables_still_pass(tmp_path: Path) -> None:
    args = [
        "--env",
        "DMLC_PS_VAN_TYPE:p3",
        "--env",
        "PYTHONUNBUFFERED:0",
        "--env",
        "LAUNCHKIT_HOME:/x",
        "--env-worker",
        "CUDA_VISIBLE_DEVICES:1",
        "PS_VERBOSE=1",
    ]
    res = run(["launch", "-n", "1", "-s", "0", "--dry-run", *args, "true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "DMLC_PS_VAN_TYPE=p3" in res.stdout and "CUDA_VISIBLE_DEVICES=1" in res.stdout


def test_every_variable_the_launcher_sets_is_one_it_owns() -> None:
    job = dmlc_env.JobEnv("j", "s", "local", "127.0.0.1", 1, 1, 1, interface="lo")
    env = dmlc_env.build_env(job, dmlc_env.TaskEnv("worker", 0, 1, 0, "h", cuda_visible_devices="0"))
    # the user's to set: CUDA_VISIBLE_DEVICES without --gpus-per-worker, torchrun's role name and error file
    assert {name for name in env if not dmlc_env.launcher_owned(name)} == {
        dmlc_env.CUDA_VISIBLE_DEVICES,
        *dmlc_env.TORCH_DEFAULTS,
    }
    assert not dmlc_env.launcher_owned("LAUNCHKIT_HOME") and not dmlc_env.launcher_owned("DMLC_PS_VAN_TYPE")


@pytest.mark.parametrize("kind", KINDS)
def test_an_unusable_launchkit_home_stops_the_launch_before_it_starts(tmp_path: Path, kind: str) -> None:
    """LAUNCHKIT_HOME=/some/file ran the job, then ended in 'internal error: NotADirectoryError',
    exit 1, after a successful job."""
    home = odd_home(kind, tmp_path)
    marker = tmp_path / "started"
    env = {**os.environ, "LAUNCHKIT_HOME": str(home)}
    res = run(["launch", "-n", "1", "-s", "0", "sh", "-c", f"touch {marker}"], cwd=tmp_path, env=env)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert str(home) in res.stderr and "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert not marker.exists() and "on local" not in res.stderr  # no "job ...: 1 worker on local" start line


def test_a_removed_working_directory_stops_the_launch(tmp_path: Path, launchkit_home: Path) -> None:
    """Launching from a deleted directory: 'internal error: FileNotFoundError'."""
    gone = tmp_path / "gone"
    gone.mkdir()
    marker = tmp_path / "started"
    argv = ["launch", "-n", "1", "-s", "0", "sh", "-c", f"touch {marker}"]
    script = f'cd "{gone}" && rmdir "{gone}" && exec "$@"'
    res = subprocess.run(
        ["sh", "-c", script, "sh", *LAUNCHKIT, *argv], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "the current directory cannot be used" in res.stderr and "internal error" not in res.stderr
    assert not marker.exists() and not job_ids(launchkit_home)


def test_dmlc_interface_may_be_set_as_the_docs_say_with_one_warning(tmp_path: Path) -> None:
    """docs/migrating-from-mxnet.md keeps ps-lite on loopback with --env DMLC_INTERFACE:lo: taken,
    with one warning that --interface also picks the launcher's addresses."""
    args = ["--env", "DMLC_INTERFACE:lo", "--env-worker", "DMLC_INTERFACE:lo", "DMLC_INTERFACE=lo"]
    res = run(["launch", "-n", "1", "-s", "0", "--dry-run", *args, "true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("warning") == 1 and "--interface does all three" in res.stderr, res.stderr
    assert "DMLC_INTERFACE=lo" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-i", "/keys/id"], "-i/--identity does not apply to --launcher local; it is for --launcher ssh or mpi"),
        (["--sync-dst-dir", "/srv/job"], "--sync-dst-dir does not apply to --launcher local; it is for --launcher ssh"),
        (["--sync-timeout", "5"], "--sync-timeout does not apply to --launcher local; it is for --launcher ssh"),
        (["--heartbeat-timeout", "3"], "--heartbeat-timeout does not apply to --launcher local; it is for --launcher ssh"),
        (["--start-timeout", "60"], "--start-timeout does not apply to --launcher local; it is for --launcher ssh"),
        (["--queue", "all.q"], "--queue does not apply to --launcher local; it is for --launcher sge or yarn"),
        (["--mpirun", "mpirun"], "--mpirun does not apply to --launcher local; it is for --launcher mpi"),
        (["--launcher", "mpi", "--connect-timeout", "3", "--heartbeat-timeout", "3"],
         "--heartbeat-timeout does not apply to --launcher mpi; it is for --launcher ssh"),
        (["--launcher", "ssh", "-H", "hf", "--partition", "gpu"],
         "--partition does not apply to --launcher ssh; it is for --launcher slurm"),
        (["--launcher", "yarn", "--pe", "smp"], "--pe does not apply to --launcher yarn; it is for --launcher sge"),
        (["--launcher", "sge", "--mem", "4G"], "--mem does not apply to --launcher sge; it is for --launcher slurm or yarn"),
        (["--launcher", "slurm", "--yarn-rm", "http://rm:8088"],
         "--yarn-rm does not apply to --launcher slurm; it is for --launcher yarn"),
        (["--detach"], "--detach needs a batch engine (--launcher sge or slurm), not local"),
    ],
)  # fmt: skip
def test_a_flag_the_backend_does_not_take_is_refused(tmp_path: Path, args: list[str], message: str) -> None:
    """A backend declares what it takes (its Capabilities); a flag for another backend was dropped
    silently (`-i` on local, `--partition` on ssh, `--pe` on yarn) or with a warning
    (`--sync-dst-dir` on local), and the job ran without it: now exit 2 naming the flag and the
    backends that take it, before anything starts (a dry run too)."""
    (tmp_path / "hf").write_text("127.0.0.1\n")
    marker = tmp_path / "started"
    for dry in ([], ["--dry-run"]):
        res = run(["launch", "-n", "1", *args, *dry, "sh", "-c", f"touch {marker}"], cwd=tmp_path)
        assert res.returncode == 2, (dry, res.stdout, res.stderr)
        assert message in " ".join(res.stderr.split()) and "Traceback" not in res.stderr, res.stderr
        assert not marker.exists()


def test_the_flags_a_backend_takes_are_taken(tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("127.0.0.1\n")
    for args in (
        [
            "--launcher",
            "mpi",
            "-H",
            "hf",
            "-i",
            "/keys/id",
            "--connect-timeout",
            "3",
            "--node-python",
            "python3",
        ],
        [
            "--launcher",
            "ssh",
            "-H",
            "hf",
            "--scheduler-ip",
            "127.0.0.1",
            "--heartbeat-timeout",
            "3",
            "--sync-dst-dir",
            "/tmp/x",
        ],
        ["--launcher", "sge", "--queue", "all.q", "--pe", "smp"],
        ["--launcher", "local", "--max-restarts", "1", "--scheduler-ip", "127.0.0.1"],
    ):
        res = run(["launch", "-n", "1", *args, "--dry-run", "true"], cwd=tmp_path)
        assert res.returncode == 0, (args, res.stderr)


@pytest.mark.parametrize(
    "command", [["launch", "--launcher", "ssh", "-n", "1", "-s", "0"], ["hosts", "check"]]
)
def test_a_missing_key_file_is_exit_2_naming_it(tmp_path: Path, command: list[str]) -> None:
    """-i /nonexistent/key: was exit 1 'cannot connect: No such file or directory'."""
    (tmp_path / "hf").write_text("node1\n")
    marker = tmp_path / "started"
    tail = ["sh", "-c", f"touch {marker}"] if command[0] == "launch" else []
    res = run([*command, "-H", "hf", "-i", "/nonexistent/key", *tail], cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "-i /nonexistent/key: cannot read the key file /nonexistent/key: no such file" in res.stderr
    assert not marker.exists()
