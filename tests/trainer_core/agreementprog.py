"""The program of test_collective_agreement_jobs.py: every worker of a ``-s 0`` job joins the
collective group and, after a barrier each, submits operations that differ across ranks (the
issue's cases), then a correct one; prints what each rank got as one JSON line.

    agreementprog.py cases      every mismatch case, each followed by a correct allreduce
    agreementprog.py threads    two threads per rank submit named allreduces in opposite orders
    agreementprog.py torch      a Linear(4, 2 + rank): DistributedOptimizer's first step and
                                broadcast_parameters, then a model alike on every rank
    agreementprog.py shutdown   an allreduce, then rank 1 shuts down while the others allreduce
    agreementprog.py twice      rank 0 submits 'a', then 'x' twice while 'a' waits for the others
                                (they submit 'a' and 'x' once it has: a file in the working
                                directory says so), then a correct allreduce
    agreementprog.py busy       rank 0 computes 6 s between two allreduces (the others warn of the
                                stall with TRAINER_CORE_STALL_CHECK_SECONDS=1, and wait)
    agreementprog.py stopped    the last rank stops itself (SIGSTOP) after an allreduce while the
                                others allreduce: they fail within the heartbeat bound, naming it
    agreementprog.py MODE ALGO  with the allreduce algorithm forced (``Thresholds(force=ALGO)``:
                                ring, recursive_doubling, tree), off the host's segment
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from trainer_core import collective


def cases(g: Any) -> dict[str, Any]:
    r = g.rank
    ones = np.ones(4, np.float32)
    todo = {
        "lengths": lambda: g.allreduce(np.ones(4 + r, np.float32)),
        "dtypes": lambda: g.allreduce(ones.astype(("float32", "float64", "int32", "int64")[r])),
        "ops": lambda: g.allreduce(ones, op=("sum", "max", "min", "mean")[r]),
        "roots": lambda: g.broadcast(np.full(3, r, np.float32), root=r),
        "kinds": lambda: g.allreduce(ones) if r == 0 else g.broadcast(ones, root=0),
        "refused": lambda: g.allreduce(ones, op="prod" if r == 1 else "sum"),
        "list": lambda: g.allreduce([1.0, 2.0] if r == 1 else ones),
        "agreed": lambda: g.allreduce(ones),
    }
    out: dict[str, Any] = {}
    for case, fn in todo.items():
        g.barrier()
        start = time.monotonic()
        try:
            res = fn()
            got = {"result": np.asarray(res).tolist()}
        except Exception as exc:
            got = {"error": f"{type(exc).__name__}: {exc}"}
        got["seconds"] = time.monotonic() - start
        got["next"] = g.allreduce(np.full(2, r + 1, np.float32)).tolist()
        out[case] = got
    return out


def threads(g: Any, steps: int = 10) -> dict[str, Any]:
    got: dict[str, float] = {}

    def one(tag: str, value: float) -> None:
        for i in range(steps):
            got[f"{tag}.{i}"] = float(g.allreduce(np.full(5, value * (i + 1)), name=f"{tag}.{i}")[0])

    order = ("a", "b") if g.rank % 2 else ("b", "a")
    ts = [threading.Thread(target=one, args=(t, 1.0 if t == "a" else 100.0)) for t in order]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got


def shut_down(g: Any) -> dict[str, Any]:
    before = float(g.allreduce(np.full(3, g.rank + 1, np.float32), name="before")[0])
    if g.rank == 1:
        collective.shutdown()  # waits in the scheduler's finish for the others
        return {"before": before}
    start = time.monotonic()
    try:
        g.allreduce(np.ones(4, np.float32), name="grad.3")
        error = ""
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"before": before, "error": error, "seconds": time.monotonic() - start}


BUSY_S = 6.0


def busy(g: Any) -> dict[str, Any]:
    g.allreduce(np.ones(10, np.float32), name="before")
    if g.rank == 0:  # evaluating, saving: alive (its heartbeats go on), in no collective
        time.sleep(BUSY_S)
    start = time.monotonic()
    total = float(g.allreduce(np.full(100, g.rank + 1, np.float32), name="after")[0])
    return {"sum": total, "waited": time.monotonic() - start}


def stopped(g: Any) -> dict[str, Any]:
    g.allreduce(np.ones(10, np.float32), name="before")
    if g.rank == g.size - 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped: no heartbeat any more (the launcher kills it)
    start = time.monotonic()
    try:
        g.allreduce(np.ones(100, np.float32), name="after")
        return {"error": ""}
    except Exception as exc:
        return {
            "error": f"{type(exc).__name__}: {exc}",
            "node": getattr(exc, "node", None),
            "seconds": time.monotonic() - start,
        }


def twice(g: Any) -> dict[str, Any]:
    """The name 'x' submitted twice while in flight (on rank 0): both of rank 0's and every other
    rank's 'x' fail, 'a' completes, and so does the next operation."""
    x = np.ones(3)
    if g.rank == 0:
        works = {"a": g.allreduce_async(x, name="a")}  # the others come later: "a" waits
        works["x1"], works["x2"] = g.allreduce_async(x, name="x"), g.allreduce_async(x, name="x")
        with open("submitted.tmp", "w") as f:
            f.write("x")
        os.replace("submitted.tmp", "submitted")
    else:
        while not os.path.exists("submitted"):  # rank 0's three operations are in flight
            time.sleep(0.02)
        works = {n: g.allreduce_async(x, name=n) for n in ("a", "x")}
    out: dict[str, Any] = {}
    for key, work in works.items():
        try:
            out[key] = work.wait().tolist()
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"
    out["next"] = g.allreduce(np.full(2, float(g.rank + 1))).tolist()
    return out


def torch_models() -> dict[str, Any]:
    import torch

    import trainer_core.torch as hvd

    hvd.init()
    r = hvd.rank()
    out: dict[str, Any] = {"rank": r, "size": hvd.size()}
    for case in ("optimizer", "broadcast_parameters", "alike"):
        model = torch.nn.Linear(4, 2 if case == "alike" else 2 + r)
        try:
            if case == "broadcast_parameters":
                hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            else:
                opt = hvd.DistributedOptimizer(
                    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
                )
                model(torch.ones(3, 4)).sum().backward()
                opt.step()
            out[case] = "ok"
        except Exception as exc:
            out[case] = f"{type(exc).__name__}: {exc}"
    hvd.shutdown()
    return out


def main(mode: str, force: str | None = None) -> int:
    if mode == "torch":
        print(json.dumps(torch_models()), flush=True)
        return 0
    g = collective.group()
    if force is not None:
        g.thresholds = collective.Thresholds(force=force)
    modes = {"cases": cases, "threads": threads, "shutdown": shut_down, "twice": twice, "busy": busy}
    out = {**modes, "stopped": stopped}[mode](g)
    print(json.dumps({"rank": g.rank, "size": g.size, "host": g.hosts[g.rank], **out}), flush=True)
    if mode == "stopped":
        os._exit(1)  # (the job has failed: its scheduler is gone with the stopped rank's)
    collective.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
