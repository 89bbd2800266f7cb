"""A worker of test_torch_process_sets_jobs.py: Horovod's process sets as a script uses them
(``hvd.init(process_sets=[even, odd])``, ``add_process_set`` with HOROVOD_DYNAMIC_PROCESS_SETS),
the two sets reducing concurrently with the global set; each result printed as one ``RESULT`` JSON
line for the test to check against numpy (inputs are functions of the rank: ``big``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: elements of the large allreduces (several ring segments)
N = 300_007
ROUNDS = 4


def big(rank: int, k: int) -> np.ndarray:
    """Rank ``rank``'s input of round ``k`` (integers in float64: sums are exact)."""
    return (np.arange(N, dtype=np.float64) % 1000) * (rank + 1) + rank * 7 + k


def adasum(hvd: Any, r: int, mine: Any, out: dict[str, Any]) -> None:
    """Adasum among the set's ranks and among every rank (refused where the size is not a power
    of two), and one step of the Adasum optimizer among the set's ranks."""
    import torch

    from tests.trainer_core.torch_hvdjob import adasum_input, adasum_model, values

    v = torch.from_numpy(values(r)).double()
    out["adasum_set"] = hvd.allreduce(v, op=hvd.Adasum, name="adasum", process_set=mine).tolist()
    try:
        out["adasum_all"] = hvd.allreduce(v, op=hvd.Adasum, name="adasum").tolist()
    except ValueError as e:
        out["adasum_all"] = str(e)
    lin = adasum_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), op=hvd.Adasum, process_set=mine)
    lin(torch.from_numpy(adasum_input(r))).pow(2).sum().backward()
    opt.step()
    out["adasum_step"] = [x for p in lin.parameters() for x in p.detach().reshape(-1).tolist()]


def main() -> None:
    import torch

    import trainer_core.torch as hvd

    world = int(__import__("os").environ["DMLC_NUM_WORKER"])
    even = hvd.ProcessSet(range(0, world, 2))
    odd = hvd.ProcessSet(range(1, world, 2))
    hvd.init(process_sets=[even, odd])
    r = hvd.rank()
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    members = mine.ranks
    assert members is not None
    out: dict[str, Any] = {"rank": r, "ids": [even.process_set_id, odd.process_set_id]}
    out["set_rank"], out["set_size"], out["included"] = mine.rank(), mine.size(), other.included()
    sums, totals = [], []
    for k in range(ROUNDS):  # the set's operation and the global one in flight together
        t = torch.from_numpy(big(r, k))
        hs = hvd.allreduce_async(t, op=hvd.Sum, name=f"set.{k}", process_set=mine)
        hg = hvd.allreduce_async(t, op=hvd.Sum, name=f"all.{k}")
        totals.append(float(hvd.synchronize(hg).sum()))
        sums.append(float(hvd.synchronize(hs).sum()))
    out["set_sums"], out["global_sums"] = sums, totals
    ints = torch.tensor([r + 1, -r, 5 * r], dtype=torch.int32)
    out["int_max"] = hvd.allreduce(ints, op=hvd.Max, process_set=mine).tolist()
    out["gather"] = hvd.allgather(torch.tensor([[r, -r]]), process_set=mine).tolist()
    out["bcast"] = hvd.broadcast(torch.tensor([r * 1.5]), members[-1], process_set=mine).tolist()
    out["a2a"] = hvd.alltoall(torch.arange(len(members)) + 100 * r, process_set=mine).tolist()
    out["rs"] = hvd.reducescatter(
        torch.ones(len(members), 2) * (r + 1), op=hvd.Sum, process_set=mine
    ).tolist()
    out["obj"] = hvd.broadcast_object({"root": r}, members[0], process_set=mine)
    adasum(hvd, r, mine, out)
    hvd.barrier(process_set=mine)
    try:
        hvd.allreduce(torch.ones(1), process_set=other)
        out["outsider"] = ""
    except ValueError as e:
        out["outsider"] = str(e)
    ends = hvd.add_process_set([0, 1])  # HOROVOD_DYNAMIC_PROCESS_SETS=1
    out["added"] = ends.process_set_id
    if ends.included():
        out["ends"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=ends).tolist()
    out["removed"] = hvd.remove_process_set(ends)
    out["after"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).tolist()
    if r % 2 == 1:  # rank 0 shuts down meanwhile: the odd set's operations go on without it
        if r == members[-1]:
            time.sleep(1.0)  # (so that the set's other rank waits in it, past rank 0's goodbye)
        out["late"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=mine).tolist()
    if r % 2 == 1 and len(members) > 1 and r == members[-1]:  # one its fellow member never makes
        try:
            hvd.allreduce(torch.ones(1), process_set=mine, name="unmatched")
            out["unmatched"] = ""
        except hvd.HorovodInternalError as e:
            out["unmatched"] = str(e)
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
