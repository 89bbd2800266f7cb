"""Horovod's process sets in real jobs: ``launchkit launch -n 3|4 -s 0 --launcher local`` (and
``mpi`` at 4, Open MPI's mpirun on this machine) runs
``tests/trainer_core/torch_psetsjob.py``; the even and the odd ranks' sets reduce concurrently with
the global set (each its own group over the job's links), and every result equals numpy's; Adasum
among a set's ranks (a set of 2) and among all 4 equals the reference (``adasumref``), the same bits
on every member."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="trainer_core.torch needs torch (the torch extra: pip install -e '.[torch]')"
)

from tests.trainer_core.adasumref import adasum_reference, adasum_step  # noqa: E402
from tests.trainer_core.markedjob import run_marked  # noqa: E402
from tests.trainer_core.torch_hvdjob import values  # noqa: E402
from tests.trainer_core.torch_psetsjob import ROUNDS, big  # noqa: E402


def launch(workers: int, launcher: str) -> list[dict[str, Any]]:
    rc, out = run_marked(
        ["-n", str(workers), "-s", "0"],
        [sys.executable, "tests/trainer_core/torch_psetsjob.py"],
        "TORCH_PSETS_JOB_TEST",
        180,
        env=["HOROVOD_DYNAMIC_PROCESS_SETS:1"],
        launcher=launcher,
    )
    assert rc == 0, out
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == list(range(workers)), out
    return sorted(results, key=lambda r: r["rank"])


@pytest.mark.parametrize(("workers", "launcher"), [(3, "local"), (4, "local"), (4, "mpi")])
def test_two_disjoint_sets_reduce_concurrently_with_the_global_set(workers: int, launcher: str) -> None:
    if launcher == "mpi" and not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (scripts/test.sh installs Open MPI)")
    got = launch(workers, launcher)
    for r, res in enumerate(got):
        members = list(range(r % 2, workers, 2))
        assert res["ids"] == [1, 2]
        assert (res["set_rank"], res["set_size"], res["included"]) == (members.index(r), len(members), False)
        for k in range(ROUNDS):
            assert res["set_sums"][k] == float(sum(big(m, k) for m in members).sum())
            assert res["global_sums"][k] == float(sum(big(m, k) for m in range(workers)).sum())
        ints = np.array([[m + 1, -m, 5 * m] for m in members]).max(axis=0)
        assert res["int_max"] == ints.tolist()
        assert res["gather"] == [[m, -m] for m in members]
        assert res["bcast"] == [members[-1] * 1.5]
        assert res["a2a"] == [100 * m + members.index(r) for m in members]
        assert res["rs"] == [[float(sum(m + 1 for m in members))] * 2]
        assert res["obj"] == {"root": members[0]}
        want = adasum_reference([values(m).astype(float).tolist() for m in members])
        np.testing.assert_allclose(res["adasum_set"], want, rtol=1e-12)
        assert res["adasum_set"] == got[members[0]]["adasum_set"]  # the same bits on every member
        np.testing.assert_allclose(res["adasum_step"], adasum_step(members), rtol=1e-12)
        assert res["adasum_step"] == got[members[0]]["adasum_step"]
        if workers == 4:
            want = adasum_reference([values(m).astype(float).tolist() for m in range(workers)])
            np.testing.assert_allclose(res["adasum_all"], want, rtol=1e-12)
            assert res["adasum_all"] == got[0]["adasum_all"]
        else:
            assert (
                "power-of-two number of ranks" in res["adasum_all"] and "this job has 3" in res["adasum_all"]
            )
        assert f"rank {r} is not in process set {2 - r % 2}" in res["outsider"]
        assert res["added"] == 3 and res["removed"] is True
        if r in (0, 1):
            assert res["ends"] == [1.0]
        else:
            assert "ends" not in res
        assert res["after"] == [float(workers)]
        assert res.get("late") == ([float(len(members))] if r % 2 else None)
        if r % 2 and len(members) > 1 and r == members[-1]:  # told at once that rank 1 shut down
            assert f"rank {members[0]} " in res["unmatched"] and "shut down" in res["unmatched"]
            assert "operations of process set 2" in res["unmatched"], res["unmatched"]
        else:
            assert "unmatched" not in res
