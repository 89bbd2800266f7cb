"""A worker of test_torch_horovod_jobs.py: Horovod's operations as a Horovod script calls them
(``import trainer_core.torch as hvd``), each result printed as one ``RESULT`` JSON line for the
test to check against numpy (the inputs are functions of the rank: ``values``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def values(rank: int) -> np.ndarray:
    """Rank ``rank``'s integers (the test computes its references from the same function)."""
    return np.array([7, -5, 3, 12, -1, 0], dtype=np.int64) * (rank + 1) + rank


def adasum_model() -> Any:
    """The same small model on every rank (and in the test's reference)."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(3, 2).double()


def adasum_input(rank: int) -> np.ndarray:
    return values(rank)[:3].astype(np.float64).reshape(1, 3) / 10


def main() -> None:
    # first: a server or the scheduler (-s 1) serves its role on this import and ends, without torch
    import trainer_core  # noqa: F401

    # isort: split
    import torch

    import trainer_core.torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    v = torch.from_numpy(values(r))
    out: dict[str, Any] = {"rank": r, "size": n, "comm": hvd.comm()}
    out["layout"] = [
        hvd.local_rank(),
        hvd.local_size(),
        hvd.cross_rank(),
        hvd.cross_size(),
        hvd.is_homogeneous(),
    ]
    out["built"] = [hvd.mpi_built(), hvd.gloo_built()]
    out["avg_int32"] = hvd.allreduce(v.to(torch.int32), name="avg").tolist()
    out["avg_scaled_int64"] = hvd.allreduce(
        v, op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0
    ).tolist()
    out["sum_async"] = hvd.synchronize(hvd.allreduce_async(v.double(), None, "s", hvd.Sum)).tolist()
    out["product"] = hvd.allreduce(v, op=hvd.Product).tolist()
    try:
        out["adasum"] = hvd.allreduce(v.double(), op=hvd.Adasum).tolist()
    except ValueError as e:  # a size that is not a power of two
        out["adasum"] = str(e)
    out["max_inplace"] = hvd.allreduce_(v.float().clone(), op=hvd.Max).tolist()
    out["grouped"] = [t.tolist() for t in hvd.grouped_allreduce([v.float(), v[:2].double()], op=hvd.Sum)]
    out["gather"] = hvd.allgather(v[: r + 1]).tolist()
    splits = [(r + j) % 3 for j in range(n)]
    rows = torch.arange(sum(splits), dtype=torch.float32) + 100 * r
    got, received = hvd.alltoall(rows, splits=splits)
    out["alltoall"] = [got.tolist(), received.tolist()]
    out["reducescatter"] = hvd.reducescatter(torch.arange(10.0).reshape(5, 2) * (r + 1), op=hvd.Sum).tolist()
    out["bcast_object"] = hvd.broadcast_object({"from": r, "betas": (0.9, 0.99)}, root_rank=n - 1)
    out["gather_object"] = hvd.allgather_object([r, "x" * r])
    x = torch.full((2,), float(r), requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * (r + 1)).sum().backward()
    out["grad_allreduce"] = x.grad.tolist()
    bn = hvd.SyncBatchNorm(2, momentum=None).double()
    xb = torch.from_numpy(values(r)[:4].reshape(2, 2).astype(np.float64))
    out["syncbn"] = [bn(xb).tolist(), bn.running_mean.tolist(), bn.running_var.tolist()]
    lin = adasum_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), op=hvd.Adasum)
    lin(torch.from_numpy(adasum_input(r))).pow(2).sum().backward()
    try:
        opt.step()
        out["adasum_step"] = [p.detach().reshape(-1).tolist() for p in lin.parameters()]
    except ValueError as e:  # a size that is not a power of two
        out["adasum_step"] = str(e)
    try:
        hvd.broadcast_object(object(), root_rank=0)
    except (TypeError, ValueError) as e:
        out["refused"] = type(e).__name__
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
