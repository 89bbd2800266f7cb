"""The training program of ``bench/elastic.py``: the model, data and step of the elastic tests'
worker (``tests/trainer_core/elastic_launchjob.py``: a linear layer, 4 samples a worker a step),
lockstep steps, each completed step appended as ``{"t": time, "size": workers, "attempt": n}`` to
``$OUT/steps-INDEX-ATTEMPT``.
``hvd``: trainer_core's ``hvd.elastic``, that module's own loop (a commit per step); ``ddp``: plain
torch.distributed (gloo) in torchrun's snapshot-and-resume pattern (rank 0 saves
``$OUT/snapshot.pt`` each step, every worker loads it at its start). Every worker writes its pid
to ``$OUT/pid-INDEX-ATTEMPT``. Training ends at the first step after ``$OUT/stop`` exists
(``hvd``: rank 0 decides; ``ddp``: an allreduce of the workers' view). The ``ddp`` leg imports no
trainer_core (its restart pays for torch alone)."""

import json
import os
import sys
import time
from pathlib import Path

import torch

from tests.trainer_core.elastic_launchjob import loss, problem, train_elastic

e = os.environ
out = Path(e["OUT"])
mode = sys.argv[1]
index = e.get("LAUNCHKIT_ROLE_RANK", e.get("LOCAL_RANK", "0"))
attempt = int(e.get("TORCHELASTIC_RESTART_COUNT", "0"))  # (launchkit sets it too: the attempt)
(out / f"pid-{index}-{attempt}").write_text(str(os.getpid()))
log = (out / f"steps-{index}-{attempt}").open("a")


def done_step(size: int) -> None:
    log.write(json.dumps({"t": time.time(), "size": size, "attempt": attempt}) + "\n")
    log.flush()


if mode == "hvd":
    import trainer_core.torch as hvd

    train_elastic(out, lambda state: done_step(hvd.size()))
    hvd.shutdown()
else:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y = problem()
    snapshot = out / "snapshot.pt"
    if snapshot.exists():
        model.load_state_dict(torch.load(snapshot, weights_only=True))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while True:
        opt.zero_grad()
        loss(ddp, x, y, rank, world).backward()
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
