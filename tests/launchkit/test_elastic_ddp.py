"""A plain torch.distributed script (DDP over gloo, ``tests/launchkit/elasticddp.py``) in an
elastic job: it reports no in-process figure, so a lost worker restarts the others (torchrun's
behaviour) at the new size, with dense ``RANK``/``WORLD_SIZE`` and ``TORCHELASTIC_RESTART_COUNT``
one higher, and the program resumes from its own snapshot. The job's scheduler process runs
trainer_core's scheduler, never the script: no process of the script sees ``DMLC_ROLE=scheduler``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.launchkit.procs import pids_with_job, record, run, wait_for_job

pytest.importorskip("torch", reason="the torch extra")

PROG = str(Path(__file__).with_name("elasticddp.py"))
STEPS = 12


def steps(out: Path) -> dict[int, list[dict]]:
    return {
        int(f.name.split("-")[1]): [json.loads(line) for line in f.read_text().splitlines()]
        for f in out.glob("steps-*")
    }


@pytest.mark.timeout(300)
def test_a_ddp_script_that_loses_a_worker_restarts_at_three_and_resumes_from_its_snapshot(
    tmp_path: Path, launchkit_home: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    envs = (f"OUT:{out}", f"STEPS:{STEPS}", "DIE:2", "DIE_AT:4")
    args = ["launch", "-n", "2:4", "-s", "0", "--no-dashboard", "--grace-period", "2"]
    args += ["--blacklist-cooldown", "600", *[a for e in envs for a in ("--env", e)], sys.executable, PROG]
    done = run(args, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = steps(out)
    assert set(seen) == {0, 1, 2, 3, 4, 5, 6}, seen  # 4 first workers, then 3 started again
    for i in range(4):
        assert all(s["TORCHELASTIC_RESTART_COUNT"] == "0" and s["WORLD_SIZE"] == "4" for s in seen[i])
    assert [s["step"] for s in seen[2]] == [1, 2, 3, 4]
    again = [seen[i] for i in (4, 5, 6)]
    assert sorted(s[0]["RANK"] for s in again) == ["0", "1", "2"]
    for s in again:
        assert {x["WORLD_SIZE"] for x in s} == {"3"} and {x["TORCHELASTIC_RESTART_COUNT"] for x in s} == {"1"}
        # resumed from the snapshot (step 4 was the last every worker finished), not from 0
        assert 4 <= s[0]["step"] - 1 < 8 and s[-1]["step"] == STEPS, s
    assert "epoch 1; left: worker 2 on localhost (signal 9)" in done.stderr, done.stderr
    assert "restart 1 of the workers" in done.stderr
    job = wait_for_job(launchkit_home)
    assert not pids_with_job(job)
    roles = {p["role"] for p in record(launchkit_home, job)["processes"]}
    assert roles == {"scheduler", "worker"}
