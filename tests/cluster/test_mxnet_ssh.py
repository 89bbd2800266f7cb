"""The real MXNet 1.9.1 launched over ssh on network-namespace hosts, with --sync-dst-dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.compat.conftest import mxnet_python  # noqa: F401
from tests.launchkit.procs import run

PROG = Path(__file__).resolve().parents[1] / "compat" / "progs" / "mx_sum.py"


def test_mxnet_dist_sync_over_ssh_with_sync(netns_hosts, mxnet_python: str, tmp_path: Path) -> None:  # noqa: F811
    group = netns_hosts(3)
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(PROG, job / "mx_sum.py")
    hostfile = group.write_hostfile(tmp_path / "hosts")
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "-H",
            str(hostfile),
            "-i",
            str(group.identity),
            "--known-hosts",
            str(group.known_hosts),
            "--sync-dst-dir",
            "/srv/mxjob",
            mxnet_python,
            "mx_sum.py",
        ],
        cwd=job,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = [
        json.loads(line.split("] ", 1)[1])
        for line in res.stdout.splitlines()
        if line.startswith("[worker") and "{" in line
    ]
    assert len(out) == 2 and sorted(o["rank"] for o in out) == [0, 1]
    for o in out:
        for rnd in range(3):
            for key in ("3", "7", "9"):
                assert o["results"][f"{key}/{rnd}"] == [float(3 * (rnd + 1))]
    for h in group:  # synced, and the job ran there
        assert "mx_sum.py" in h.run("ls /srv/mxjob").stdout
