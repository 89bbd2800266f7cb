"""Operations that differ across ranks, among the workers of a ``-s 0`` job over ssh on three
namespace hosts (tests/cluster/netns.py): the records go to rank 0 over the links and rank 0's
table comes back, as across real hosts. The same program and expectations as on one host
(tests/trainer_core/agreementprog.py, test_collective_agreement_jobs.py): every mismatch case is
an error on every rank within 2 s saying which ranks passed what, each followed by a right
allreduce; a rank's own refusal; two threads per rank in opposite orders matched by name. And a
rank that shuts down while the others wait for it: each waiting rank's ``PeerShutDown`` names it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.cluster.test_trainer_core_ssh import host_python  # noqa: F401
from tests.launchkit.procs import parse_prefixed, run
from tests.trainer_core import agreementprog
from tests.trainer_core.test_collective_agreement_jobs import check_cases, check_shut_down, check_threads

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT = {"PS_HEARTBEAT_INTERVAL": "0.3", "PS_HEARTBEAT_TIMEOUT": "3"}


def launch(
    group, tmp_path: Path, python: str, workers: int, mode: str, env_more: dict[str, str] | None = None
) -> dict[int, dict]:
    """Each worker's printed object, by rank (the job succeeded; ``stopped``: failed, and the last
    worker printed nothing); the launcher's output is in ``tmp_path / "output"``."""
    job = tmp_path / "job"
    job.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):  # the workers need the env contract, not launchkit
        shutil.copytree(ROOT / pkg, job / pkg, ignore=shutil.ignore_patterns("__pycache__", "torch"))
    shutil.copy(agreementprog.__file__, job / "prog.py")
    hostfile = group.write_hostfile(tmp_path / "hosts")
    env = [a for k, v in {**HEARTBEAT, **(env_more or {})}.items() for a in ("--env", f"{k}:{v}")]
    argv = ["launch", "--launcher", "ssh", "-H", str(hostfile), "-i", str(group.identity)]
    argv += ["--known-hosts", str(group.known_hosts), "--sync-dst-dir", "/srv/agreejob"]
    argv += ["-n", str(workers), "-s", "0", "--grace-period", "2", *env, python, "prog.py", mode]
    res = run(argv, cwd=job, timeout=180)
    (tmp_path / "output").write_text(res.stdout + res.stderr)
    assert (res.returncode != 0) == (mode == "stopped"), res.stdout[-3000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    printed = range(workers - 1) if mode == "stopped" else range(workers)
    assert sorted(outs) == [("worker", r) for r in printed], res.stdout[-3000:]
    by_rank = {r: outs[("worker", r)] for r in printed}
    hosts = {o["host"] for o in by_rank.values()}
    assert len(hosts) == min(3, len(printed)), hosts  # round robin over the three hosts
    for o in by_rank.values():
        del o["host"]
    return by_rank


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_every_mismatch_fails_on_every_rank_across_hosts(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
    workers: int,
) -> None:
    check_cases(launch(netns_hosts(3), tmp_path, host_python, workers, "cases"), workers)


@pytest.mark.timeout(300)
def test_two_threads_per_rank_are_matched_by_name_across_hosts(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    check_threads(launch(netns_hosts(3), tmp_path, host_python, 3, "threads"), 3)


@pytest.mark.timeout(300)
def test_a_rank_that_shut_down_fails_the_others_wait_across_hosts(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    group = netns_hosts(3)
    outs = launch(group, tmp_path, host_python, 3, "shutdown")
    check_shut_down(outs, 3)
    assert all(f"worker 1 on {group.subnet.prefix}." in o["error"] for r, o in outs.items() if r != 1), outs


@pytest.mark.timeout(300)
def test_a_rank_busy_between_collectives_is_waited_for_across_hosts(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    """Rank 0 computes 6 s between two allreduces (a stall warning after 1 s): the ranks on the
    other hosts warn, more than once, naming the operation, and the job succeeds with the sum."""
    outs = launch(netns_hosts(3), tmp_path, host_python, 3, "busy", {"TRAINER_CORE_STALL_CHECK_SECONDS": "1"})
    output = (tmp_path / "output").read_text()
    for r, o in outs.items():
        assert o["sum"] == 6.0, outs
        if r:
            assert o["waited"] > agreementprog.BUSY_S - 2, outs
            warned = re.findall(
                rf"collective stall: rank {r} has waited [\d.]+ s in allreduce 'after'", output
            )
            assert len(warned) >= 2, output[-3000:]
    assert "collective stall: rank 0 " not in output


@pytest.mark.timeout(300)
def test_a_stopped_rank_fails_the_others_within_the_heartbeat_bound_across_hosts(
    netns_hosts,  # noqa: F811
    host_python: str,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    """The last rank (on the third host) stops itself: the others' allreduce fails within the
    heartbeat timeout (3 s) + 2 s, naming it; the job fails."""
    outs = launch(
        netns_hosts(3), tmp_path, host_python, 3, "stopped", {"TRAINER_CORE_STALL_CHECK_SECONDS": "1"}
    )
    bound = float(HEARTBEAT["PS_HEARTBEAT_TIMEOUT"]) + 2
    for o in outs.values():
        assert o["node"] == "worker 2" and "sent no heartbeat" in o["error"], outs
        assert o["seconds"] < bound, outs
