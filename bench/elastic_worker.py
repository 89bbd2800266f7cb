"""The training program of ``bench/elastic.py``: one small model (a linear layer on 64 samples),
lockstep steps, each completed step appended as ``{"t": time, "size": workers, "attempt": n}`` to
``$OUT/steps-INDEX-ATTEMPT``.
``hvd``: trainer_core's ``hvd.elastic`` (a commit per step); ``ddp``: plain torch.distributed (gloo)
in torchrun's snapshot-and-resume pattern (rank 0 saves ``$OUT/snapshot.pt`` each step, every
worker loads it at its start). The first attempt's workers write their pid to ``$OUT/pid-INDEX``.
Training ends at the first step after ``$OUT/stop`` exists (``hvd``: rank 0 decides; ``ddp``: an
allreduce of the workers' view)."""

import json
import os
import sys
import time
from pathlib import Path

import torch

e = os.environ
out = Path(e["OUT"])
mode = sys.argv[1]
index = e.get("LAUNCHKIT_ROLE_RANK", e.get("LOCAL_RANK", "0"))
attempt = int(e.get("TORCHELASTIC_RESTART_COUNT", "0")) + int(e.get("LAUNCHKIT_RESTART_COUNT", "0"))
if attempt == 0:
    (out / f"pid-{index}").write_text(str(os.getpid()))
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 16, generator=g)
Y = X @ torch.arange(1.0, 17.0).reshape(16, 1)
log = (out / f"steps-{index}-{attempt}").open("a")


def done_step(size: int) -> None:
    log.write(json.dumps({"t": time.time(), "size": size, "attempt": attempt}) + "\n")
    log.flush()


if mode == "hvd":
    import trainer_core.torch as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, opt, done=False)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while not state.done:
            idx = torch.arange(hvd.rank(), 64, hvd.size())[:4]
            opt.zero_grad()
            ((model(X[idx]) - Y[idx]) ** 2).mean().backward()
            opt.step()
            state.done = bool(hvd.broadcast_object((out / "stop").exists(), 0))
            state.commit()
            done_step(hvd.size())

    train(state)
    hvd.shutdown()
else:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    snapshot = out / "snapshot.pt"
    if snapshot.exists():
        model.load_state_dict(torch.load(snapshot, weights_only=True))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while True:
        idx = torch.arange(rank, 64, world)[:4]
        opt.zero_grad()
        ((ddp(X[idx]) - Y[idx]) ** 2).mean().backward()
        opt.step()
        if rank == 0:
            torch.save(model.state_dict(), out / "snapshot.tmp")
            os.replace(out / "snapshot.tmp", snapshot)
        stop = torch.tensor([float((out / "stop").exists())])
        dist.all_reduce(stop)
        done_step(world)
        if stop.item() > 0:
            break
    dist.destroy_process_group()
