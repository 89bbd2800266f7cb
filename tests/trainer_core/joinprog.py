"""The program of test_collective_joining_jobs.py: every worker of a ``-s 0`` job has ``1 + rank``
batches; the ranks that run out join (``hvd.join``) while the others go on. Prints what each rank
got as one JSON line.

    joinprog.py collective [ALGO]   per batch: allreduce (sum, mean, max; sync and async), grouped
                                    allreduce, ragged allgather, broadcast from the last rank;
                                    then ``join``, an unnamed allreduce and a second ``join``
                                    (``ALGO``: the allreduce algorithm forced, off the host's segment)
    joinprog.py torch               a DistributedOptimizer loop over the uneven batches (and an
                                    Adasum allreduce per batch at a power-of-two size), ``join``,
                                    then ``broadcast_parameters`` from the rank that joined last
    joinprog.py ps                  (a job with servers) what ``hvd.join()`` and a process set
                                    raise there
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from trainer_core import collective


def batches(rank: int) -> int:
    return 1 + rank


def value(rank: int, step: int) -> np.ndarray:
    return (np.arange(5, dtype=np.float64) + 10 * rank + step).astype(np.float32)


def run_collective(g: Any) -> dict[str, Any]:
    r, w = g.rank, g.size
    seen: list[Any] = []
    for step in range(batches(r)):
        x = value(r, step)
        seen.append([g.allreduce(x, op=op).tolist() for op in ("sum", "mean", "max")])
        seen.append(g.allreduce_async(x.astype(np.int64), name=f"int.{step}").wait().tolist())
        seen.append([a.tolist() for a in g.grouped_allreduce([x, x[:2].astype(np.float64)])])
        seen.append(g.allgather(np.full((1 + r, 2), step, np.int32)).tolist())
        seen.append(g.broadcast(np.full(3, r, np.float64), root=w - 1).tolist())
    first = g.join()
    after = g.allreduce(np.full(2, r + 1, np.float32)).tolist()
    return {"seen": seen, "join": first, "after": after, "join2": g.join()}


def batch(rank: int, step: int) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(4, 3, generator=gen), torch.randn(4, 1, generator=gen)


def model_at_start() -> Any:
    import torch

    model = torch.nn.Linear(3, 1)
    torch.nn.init.constant_(model.weight, 0.5)
    torch.nn.init.constant_(model.bias, 0.0)
    return model


def run_torch() -> dict[str, Any]:
    import torch

    import trainer_core.torch as hvd

    hvd.init()
    r = hvd.rank()
    model = model_at_start()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    adasum = []
    for step in range(batches(r)):
        x, y = batch(r, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if hvd.size() & (hvd.size() - 1) == 0:  # Adasum pairs a power of two of ranks
            v = torch.from_numpy(value(r, step)).double()
            adasum.append(hvd.allreduce(v, op=hvd.Adasum, name=f"adasum.{step}").tolist())
    last = hvd.join()
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    out = {"rank": r, "size": hvd.size(), "join": last, "params": params, "adasum": adasum}
    hvd.shutdown()
    return out


def run_ps() -> dict[str, Any]:
    import trainer_core.torch as hvd

    hvd.init()
    out: dict[str, Any] = {"rank": hvd.rank()}
    try:
        out["join"] = hvd.join()
    except NotImplementedError as exc:
        out["join"] = f"{type(exc).__name__}: {exc}"
    import torch

    for what, call in (
        ("allreduce", lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0]))),
        ("add_process_set", lambda: hvd.add_process_set([0])),
    ):
        try:
            call()
            out[what] = ""
        except ValueError as exc:
            out[what] = str(exc)
    hvd.shutdown()
    return out


def main(mode: str, force: str | None = None) -> int:
    if mode in ("torch", "ps"):
        print(json.dumps(run_torch() if mode == "torch" else run_ps()), flush=True)
        return 0
    g = collective.group()
    if force is not None:
        g.thresholds = collective.Thresholds(force=force)
    print(json.dumps({"rank": g.rank, "size": g.size, **run_collective(g)}), flush=True)
    collective.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
