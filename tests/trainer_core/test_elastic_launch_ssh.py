"""An elastic job of trainer_core workers (``tests/trainer_core/elastic_launchjob.py``, torch and
``hvd.elastic``) over ssh (a real sshd on loopback) with ``--host-discovery-script``: when the
script offers one more slot, the launcher starts a worker there, which joins at the others' next
commit (``HostsUpdatedInterrupt``); the job grows to MAX and the new worker ends with the others'
parameters, bit for bit."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

from pathlib import Path

from tests.cluster.conftest import sshd_loopback  # noqa: F401
from tests.launchkit.procs import pids_with_job, start, wait_for_job, wait_until

from .test_elastic_launch_jobs import WAIT, finish, launch, steps


@pytest.mark.timeout(400)
def test_a_host_slot_the_discovery_script_adds_grows_the_job_to_max_at_the_next_commit(
    sshd_loopback,  # noqa: F811
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    slots = tmp_path / "slots"
    slots.write_text("3")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\necho {sshd_loopback.host}:$(cat {slots})\n")
    script.chmod(0o755)
    ssh = ["--launcher", "ssh", "--ssh-port", str(sshd_loopback.port), "-i", str(sshd_loopback.identity)]
    ssh += ["--known-hosts", str(tmp_path / "known_hosts")]
    args = launch(out, "2:4", 0, "--host-discovery-script", str(script), *ssh)
    proc = start(args, cwd=tmp_path)
    try:
        assert wait_until(lambda: all(len(steps(out, i)) >= 3 for i in range(3)), WAIT), proc.pid
        assert not (out / "pid-3").exists()
        slots.write_text("4")  # the host offers a fourth slot: a worker starts and joins
        assert wait_until(lambda: all(any(s["size"] == 4 for s in steps(out, i)) for i in range(4)), WAIT)
        job = wait_for_job(launchkit_home)
    finally:
        stdout, stderr = finish(proc, out)
    assert proc.returncode == 0, stderr
    results = {
        r["me"]: r
        for r in (json.loads(x.split("RESULT ", 1)[1]) for x in stdout.splitlines() if "RESULT " in x)
    }
    assert set(results) == {"0", "1", "2", "3"}, stdout
    assert {r["size"] for r in results.values()} == {4}
    # the newcomer got rank 0's state at the sync and trained the same steps since
    assert (
        results["3"]["params"] == results["0"]["params"] == results["1"]["params"] == results["2"]["params"]
    )
    assert len({r["steps"] for r in results.values()}) == 1
    first = steps(out, 3)[0]
    assert first["size"] == 4 and first["step"] > 3  # it joined the running training
    assert "joined: worker 3 on " in stderr, stderr
    assert not pids_with_job(job)
