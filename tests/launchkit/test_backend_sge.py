"""Grid Engine command lines, the job script and qacct parsing (pure), with hostile values."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from launchkit.backends.sge import (
    SgeOptions,
    error_state,
    job_code,
    job_script,
    parse_pe,
    parse_qacct,
    placeholder_hosts,
    qsub_argv,
    queue_slots,
    scheduler_first,
    scheduling_info,
    slots_short,
    task_env,
    task_states,
)
from launchkit.core.spec import LaunchSpec
from launchkit.errors import UsageError
from tests.launchkit.plans import make_plan
from tests.launchkit.procs import fake_engine, run

HOSTILE = "a b'c\"$HOME\n`x`;rm -rf /nope"


def plan_for(n: int = 2, s: int = 2):
    hosts = placeholder_hosts(n + s)
    spec = LaunchSpec(
        num_workers=n,
        num_servers=s,
        command=("python3", "t.py", HOSTILE),
        backend="sge",
        hosts=hosts,
        env=(("HOSTILE", HOSTILE),),
        cwd="/work dir/$x",
    )
    return make_plan(
        spec, job_id="j1", secret="topsecret", root_uri="", root_port=0, node_host_of=dict.fromkeys(hosts, "")
    )


def test_one_array_job_with_a_task_per_process_and_names_only() -> None:
    plan = plan_for()
    env = task_env(plan, "/w/launchkit-j1")
    opts = SgeOptions(queue="all.q", pe="smp:2", resources=("h_vmem=2G", "gpu=1"), extra=("-P", "proj"))
    argv = qsub_argv(plan, opts, sorted(env), "/w/launchkit-j1", "/work dir/$x")
    assert argv[:9] == ["qsub", "-terse", "-N", "lk-j1", "-t", "1-5", "-wd", "/work dir/$x", "-o"]
    assert argv[9] == "/w/launchkit-j1/task-$TASK_ID.out"  # Grid Engine expands $TASK_ID itself
    assert argv[argv.index("-q") : argv.index("-q") + 2] == ["-q", "all.q"]
    assert argv[argv.index("-pe") + 1 : argv.index("-pe") + 3] == ["smp", "2"]
    assert argv.count("-l") == 2 and argv[-2:] == ["-P", "proj"]
    names = argv[argv.index("-v") + 1].split(",")
    assert "LAUNCHKIT_JOB_SECRET" not in names and "LAUNCHKIT_SECRET_FILE" in names
    assert "topsecret" not in shlex.join(argv) and HOSTILE not in shlex.join(argv)
    assert "topsecret" not in str(env)  # the secret goes in a file, not the job's environment
    assert env["DMLC_PS_ROOT_URI"] == "" and env["LAUNCHKIT_RENDEZVOUS"] == "/w/launchkit-j1/scheduler"


def test_rows_put_the_scheduler_first_for_1_based_task_ids() -> None:
    rows = [(t.role, t.rank) for t in scheduler_first(plan_for(2, 1))]
    assert rows == [("scheduler", 0), ("server", 0), ("worker", 0), ("worker", 1)]  # SGE_TASK_ID k -> row k-1


def test_pe_values() -> None:
    assert parse_pe("smp") == ("smp", 1) and parse_pe("mpi-fill:4") == ("mpi-fill", 4)
    for bad in ("smp:x", ":3", "smp:0", "a b"):
        with pytest.raises(UsageError, match="expected NAME or NAME:SLOTS"):
            parse_pe(bad)


def test_job_script_runs_hostile_words_literally() -> None:
    plan = plan_for()
    script = job_script("/usr/bin/printf", plan.tasks[0])
    # the script is /bin/sh: run it with a printf in place of python to see the words arrive
    script = script.replace("-m launchkit.hostside.shim --", "'%s\\n'")
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == f"python3\nt.py\n{HOSTILE}\n"


QACCT = """==============================================================
qname        all.q
jobnumber    15
taskid       1
failed       0
exit_status  3
==============================================================
qname        all.q
jobnumber    15
taskid       2
failed       100 : assumedly after job
exit_status  137                  (Killed)
==============================================================
qname        all.q
jobnumber    15
taskid       3
failed       26  : opening input/output file
exit_status  0
"""


def test_qacct_codes() -> None:
    codes = parse_qacct(QACCT)
    assert codes == {1: 3, 2: 137, 3: 1}
    assert job_code(codes) == 3 and job_code({1: 0, 2: 0}) == 0


def test_error_state_from_the_listing() -> None:
    listing = (
        "job-ID  prior   name       user  state submit/start at     queue  slots ja-task-ID\n"
        "-------------------------------------------------------------------------\n"
        "     15 0.55500 lk-1123-01 root  Eqw   11/23/2026 01:08:38        1 1-3:1\n"
        "     16 0.55500 lk-1123-02 root  r     11/23/2026 01:08:38 all.q  1 1\n"
    )
    assert error_state(listing, "15") and not error_state(listing, "16") and not error_state(listing, "1")


QSTAT_GC = """\
CLUSTER QUEUE                   CQLOAD   USED    RES  AVAIL  TOTAL aoACDS  cdsuE
--------------------------------------------------------------------------------
all.q                             0.46      8      0      0      8      0      0
big.q                             0.00      0      0     16     16      0      0
"""
QSTAT_GD = """\
job-ID  prior   name       user         state submit/start at     queue                          slots ja-task-ID
-----------------------------------------------------------------------------------------------------------------
      4 0.50000 sleep      root         r     11/27/2026 11:24:19 all.q@vm                           1 1
      4 0.50000 sleep      root         r     11/27/2026 11:24:19 all.q@vm                           1 2
      4 0.50000 sleep      root         qw    11/27/2026 11:24:19                                    1 9
      5 0.50000 other      root         qw    11/27/2026 11:24:19                                    1 1
"""


def test_slots_the_array_job_needs_against_the_queues() -> None:
    slots = queue_slots(QSTAT_GC)
    assert slots == {"all.q": 8, "big.q": 16}
    why = slots_short(plan_for(4, 4), SgeOptions(queue="all.q"), slots)
    assert why is not None and "needs 9 slots" in why and "queue all.q has 8" in why
    assert slots_short(plan_for(4, 4), SgeOptions(), slots) is None  # 24 slots in all
    assert slots_short(plan_for(2, 2), SgeOptions(queue="all.q@vm"), slots) is None
    why = slots_short(plan_for(2, 2), SgeOptions(queue="all.q", pe="smp:2"), slots)
    assert why is not None and "needs 10 slots" in why
    assert slots_short(plan_for(4, 4), SgeOptions(queue="unknown.q"), slots) is None  # nothing known


def test_pending_tasks_and_their_reason() -> None:
    assert task_states(QSTAT_GD, "4") == ([1, 2], [9])
    text = (
        'job_name: x\nscheduling info:            queue instance "all.q@vm" dropped because it is full\n'
        "                            All queues dropped because of overload or full\n"
    )
    assert scheduling_info(text) == 'queue instance "all.q@vm" dropped because it is full'
    assert scheduling_info("job_name: x\n") == ""


def test_no_qmaster_is_a_clear_refusal_exit_2(tmp_path: Path) -> None:
    """With no qmaster answering, qstat (before the submission) fails: exit 2 naming what it said,
    not a process that 'cannot start'."""
    said = (
        "error: commlib error: got select error (Connection refused)\n"
        'error: unable to send message to qmaster using port 6444 on host "vm": got send error\n'
    )
    env = fake_engine(tmp_path / "bin", "qstat", said)
    marker = tmp_path / "started"
    res = run(
        ["launch", "--launcher", "sge", "-n", "1", "-s", "0", "sh", "-c", f"touch {marker}"],
        cwd=tmp_path,
        env=env,
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert (
        "sge: not available: qstat -g c failed (exit 1): error: commlib error: got select error (Connection "
        'refused); error: unable to send message to qmaster using port 6444 on host "vm": got send error; '
        "nothing was started"
    ) in res.stderr, res.stderr
    assert not marker.exists()


def test_the_submitters_path_travels_again_under_the_shims_name(monkeypatch) -> None:
    """A login shell's profile (Grid Engine starts /bin/sh as one where the queue's login_shells
    names sh) sets PATH anew: the shim puts LAUNCHKIT_SHIM_PATH back (issue 40: `python` exited 127)."""
    from launchkit.backends.sge import SgeBackend

    monkeypatch.setenv("PATH", "/opt/venv/bin:/usr/bin")
    names = SgeBackend()._names(plan_for(), "/w/launchkit-j1")
    assert {"PATH", "LAUNCHKIT_SHIM_PATH"} <= set(names)
