"""Job-wide settings that differ, and calls out of step, on the parameter servers' path across
three namespace hosts (tests/cluster/netns.py): a ``-s 1`` job over ssh, its scheduler, server and
workers on different hosts, the agreement going through the scheduler over the hosts' links. The
same programs and expectations as on one host (tests/trainer_core/test_kv_agreement.py): every
worker gets the error naming what differs, or who is where, within the bound."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.cluster.test_trainer_core_ssh import host_python  # noqa: F401
from tests.launchkit.procs import run
from tests.trainer_core import test_kv_agreement as cases
from tests.trainer_core.cluster import FAST_LIVENESS

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3

CASES = {
    "compression types": (cases.COMPRESSION_TYPES, 1, cases.check_compression_types),
    "server optimizers": (cases.OPTIMIZERS, 1, cases.check_optimizers),
    "a key initialized again": (cases.INIT_AGAIN, 2, cases.check_init_again),
    "a pull while the others are in a barrier": (cases.PULL_IN_BARRIER, 1, cases.check_pull_in_barrier),
}


def results(stdout: str) -> list[dict]:
    """Each worker's ``RESULT`` object (``[worker r] RESULT {...}`` lines), by rank."""
    by_rank: dict[int, list[dict]] = {}
    for line in stdout.splitlines():
        if line.startswith("[worker ") and "] RESULT {" in line:
            label, _, body = line.partition("] RESULT ")
            by_rank.setdefault(int(label.split()[1]), []).append(json.loads(body))
    assert sorted(by_rank) == list(range(WORKERS)), stdout[-3000:]
    assert all(len(v) == 1 for v in by_rank.values()), by_rank
    return [by_rank[r][0] for r in range(WORKERS)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_parameter_server_settings_that_differ_fail_on_every_worker_across_hosts(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
    case: str,
) -> None:
    body, servers, check = CASES[case]
    group = netns_hosts(3)
    job = tmp_path / "job"
    job.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):  # the workers need the env contract, not launchkit
        shutil.copytree(ROOT / pkg, job / pkg, ignore=shutil.ignore_patterns("__pycache__", "torch"))
    (job / "prog.py").write_text(cases.attempt(body))
    hostfile = group.write_hostfile(tmp_path / "hosts")
    env = [a for k, v in FAST_LIVENESS.items() for a in ("--env", f"{k}:{v}")]
    argv = ["launch", "--launcher", "ssh", "-H", str(hostfile), "-i", str(group.identity)]
    argv += ["--known-hosts", str(group.known_hosts), "--sync-dst-dir", "/srv/kvagreejob"]
    argv += ["-n", str(WORKERS), "-s", str(servers), "--grace-period", "2", *env, host_python, "prog.py"]
    res = run(argv, cwd=job, timeout=180)
    got = results(res.stdout)
    assert all(r["t"] < cases.BOUND for r in got), got
    check(got, WORKERS)
