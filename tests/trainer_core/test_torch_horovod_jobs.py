"""Horovod's API in real jobs: ``launchkit launch -n N -s S --launcher local`` (or ``mpi``, Open
MPI's mpirun on this machine) runs ``tests/trainer_core/torch_hvdjob.py`` (a Horovod script's
calls) and the test checks every worker's results against numpy references computed here from the
same inputs, on the collective path (``-s 0``, 2, 3 and 4 workers) and through the parameter
servers (``-s 1``)."""

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


def launch(workers: int, servers: int, launcher: str) -> list[dict[str, Any]]:
    rc, out = run_marked(
        ["-n", str(workers), "-s", str(servers)],
        [sys.executable, "tests/trainer_core/torch_hvdjob.py"],
        "TORCH_HVD_JOB_TEST",
        120,
        launcher=launcher,
    )
    assert rc == 0, out
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == list(range(workers)), out
    return sorted(results, key=lambda r: r["rank"])


def block(rows: int, size: int, rank: int) -> slice:
    """Horovod's reducescatter split: the first ``rows % size`` ranks get one row more."""
    start = rank * (rows // size) + min(rank, rows % size)
    return slice(start, start + rows // size + (1 if rank < rows % size else 0))


@pytest.mark.parametrize(
    ("workers", "servers", "launcher"),
    [(2, 0, "local"), (3, 0, "local"), (4, 0, "local"), (2, 1, "local"), (4, 0, "mpi"), (3, 1, "mpi")],
)
def test_horovods_operations_equal_numpy(workers: int, servers: int, launcher: str) -> None:
    if launcher == "mpi" and not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (scripts/test.sh installs Open MPI)")
    got = launch(workers, servers, launcher)
    n = workers
    every = np.stack([values(r) for r in range(n)])
    i32 = every.astype(np.int32)
    avg_int32 = np.trunc(i32.sum(0, dtype=np.int32).astype(np.float64) * (1.0 / n)).astype(np.int32)
    pre = np.trunc(every.astype(np.float64) * 0.5).astype(np.int64)
    avg_scaled = np.trunc(pre.sum(0).astype(np.float64) * (3.0 / n)).astype(np.int64)
    bn = torch.nn.BatchNorm1d(2, momentum=None).double()
    batch = torch.from_numpy(
        np.concatenate([values(r)[:4].reshape(2, 2) for r in range(n)]).astype(np.float64)
    )
    bn_out = bn(batch).detach()
    splits = [[(s + j) % 3 for j in range(n)] for s in range(n)]
    sent = [np.arange(sum(splits[s]), dtype=np.float32) + 100 * s for s in range(n)]
    total = np.arange(10.0).reshape(5, 2) * sum(r + 1 for r in range(n))
    for r, res in enumerate(got):
        assert res["size"] == n and res["comm"] == ("ps" if servers else "allreduce")
        assert res["layout"] == [r, n, 0, 1, True]  # one host: every worker local, one cross rank
        assert res["built"] == [False, False]
        assert res["avg_int32"] == avg_int32.tolist()
        assert res["avg_scaled_int64"] == avg_scaled.tolist()
        assert res["sum_async"] == every.sum(0).astype(np.float64).tolist()
        assert res["product"] == np.prod(every, axis=0).tolist()
        if n == 3:
            assert "op=Adasum needs a power-of-two number of ranks" in res["adasum"]
            assert "this job has 3" in res["adasum"]
            assert "this job has 3" in res["adasum_step"]
        else:
            np.testing.assert_allclose(np.concatenate(res["adasum_step"]), adasum_step(range(n)), rtol=1e-12)
            assert res["adasum_step"] == got[0]["adasum_step"]
            want_adasum = adasum_reference([values(s).astype(float).tolist() for s in range(n)])
            np.testing.assert_allclose(res["adasum"], want_adasum, rtol=1e-12)
            assert res["adasum"] == got[0]["adasum"]  # the same bits on every rank
        assert res["max_inplace"] == every.max(0).astype(np.float32).tolist()
        assert res["grouped"] == [every.sum(0).tolist(), every[:, :2].sum(0).tolist()]
        assert res["gather"] == np.concatenate([values(s)[: s + 1] for s in range(n)]).tolist()
        want = np.concatenate(
            [sent[s][sum(splits[s][:r]) : sum(splits[s][:r]) + splits[s][r]] for s in range(n)]
        )
        assert res["alltoall"] == [want.tolist(), [splits[s][r] for s in range(n)]]
        assert res["reducescatter"] == total[block(5, n, r)].tolist()
        assert res["bcast_object"] == {"from": n - 1, "betas": [0.9, 0.99]}
        assert res["gather_object"] == [[s, "x" * s] for s in range(n)]
        assert res["grad_allreduce"] == [float(sum(range(1, n + 1)))] * 2
        out, mean, var = res["syncbn"]
        np.testing.assert_allclose(out, bn_out[2 * r : 2 * r + 2].numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(mean, bn.running_mean.numpy(), rtol=1e-9)
        np.testing.assert_allclose(var, bn.running_var.numpy(), rtol=1e-9)
        assert res["refused"] == ("TypeError" if r == 0 else "ValueError")
