"""``launchkit launch -n MIN:MAX`` on the command line: the plan it makes and what it refuses
(exit 2, a message naming what was wrong, nothing started)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.launchkit.procs import run


def test_an_elastic_plan_starts_max_with_a_scheduler_even_without_servers(tmp_path: Path) -> None:
    res = run(["launch", "-n", "2:3", "-s", "0", "--dry-run", "--json", "true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    tasks = plan["tasks"]
    assert [t["role"] for t in tasks] == ["scheduler", "worker", "worker", "worker"]
    assert any(n.startswith("elastic (2:3): 3 workers start") for n in plan["notes"]), plan["notes"]
    assert {t["env"]["LAUNCHKIT_ELASTIC"] for t in tasks} == {"2:3"}
    assert {t["env"]["DMLC_NUM_WORKER"] for t in tasks} == {"3"}


def test_an_elastic_job_starts_with_the_slots_the_hostfile_offers(tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("127.0.0.11 slots=2\n127.0.0.12\n")
    res = run(["launch", "-n", "2:5", "-s", "0", "-H", "hf", "--dry-run", "--json", "true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert [t["role"] for t in json.loads(res.stdout)["tasks"]].count("worker") == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "3:2"], "-n 3:2: MIN is above MAX"),
        (["-n", "0:2"], "-n 0:2: MIN must be at least 1"),
        (["-n", "2:x"], "'2:x': expected N, or MIN:MAX"),
        (["-n", "2:4", "--max-restarts", "1"], "--max-restarts with -n 2:4: an elastic job replaces"),
        (["-n", "2:4", "--launcher", "yarn"], "--launcher yarn does not run elastic jobs (only local, ssh"),
        (["-n", "4:6", "-H", "hf"], "the hostfile offers 3 slots, fewer than MIN (4)"),
        (
            ["-n", "2:4", "--launcher", "mpi", "-H", "hf"],
            "cannot add workers to a running job, so it starts MAX",
        ),
        (["-n", "2", "--host-discovery-script", "d.sh"], "--host-discovery-script needs an elastic job"),
        (
            ["-n", "2:4", "--host-discovery-script", "nosuch", "--launcher", "ssh"],
            "--host-discovery-script nosuch: expected an executable",
        ),
        (["-n", "2:4", "--host-discovery-script", "d.sh", "-H", "hf"], "the script gives the hosts"),
        (
            ["-n", "2:4", "--host-discovery-script", "bad.sh", "--launcher", "ssh"],
            "bad.sh exited 3: no hosts today",
        ),
        (
            ["-n", "2:4", "--host-discovery-script", "d.sh"],
            "--launcher local does not start workers on hosts",
        ),
    ],
)
def test_refusals(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "hf").write_text("127.0.0.11 slots=2\n127.0.0.12\n")
    for name, body in (("d.sh", "echo 127.0.0.11:2"), ("bad.sh", "echo no hosts today >&2; exit 3")):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        os.chmod(tmp_path / name, 0o755)
    marker = tmp_path / "started"
    res = run(["launch", *args, "--", "touch", str(marker)], cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not marker.exists()


def test_a_discovery_script_gives_the_first_hosts(tmp_path: Path) -> None:
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.11:2\necho 127.0.0.12:1\n")
    os.chmod(script, 0o755)
    args = ["launch", "-n", "1:8", "-s", "0", "--launcher", "ssh", "--host-discovery-script", "d.sh"]
    res = run([*args, "--dry-run", "--json", "true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    workers = [t for t in json.loads(res.stdout)["tasks"] if t["role"] == "worker"]
    assert [w["host"] for w in workers] == ["127.0.0.11", "127.0.0.11", "127.0.0.12"]
