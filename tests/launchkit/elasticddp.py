"""A plain torch.distributed program (DDP over gloo, no trainer_core) in torchrun's
snapshot-and-resume pattern, for elastic jobs in restart mode: every worker loads
``$OUT/snapshot.pt`` if it exists (the model and the step it got to), trains to step ``$STEPS``,
and rank 0 saves the snapshot after each step. Each worker appends one JSON line per step to
``$OUT/steps-INDEX`` (``INDEX``: its ``LAUNCHKIT_ROLE_RANK``) with its ``RANK``,
``WORLD_SIZE`` and ``TORCHELASTIC_RESTART_COUNT``. The worker of index ``$DIE`` SIGKILLs itself
after step ``$DIE_AT`` (in the first attempt of the workers)."""

import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

e = os.environ
out = Path(e["OUT"])
me = e["LAUNCHKIT_ROLE_RANK"]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
snapshot = out / "snapshot.pt"
step = 0
if snapshot.exists():
    held = torch.load(snapshot, weights_only=True)
    model.load_state_dict(held["model"])
    step = held["step"]
ddp = DistributedDataParallel(model)
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 8, generator=g)
Y = X @ torch.arange(1.0, 9.0).reshape(8, 1)
with (out / f"steps-{me}").open("a") as log:
    while step < int(e["STEPS"]):
        idx = torch.arange(rank, 64, world)[:4]
        opt.zero_grad()
        ((ddp(X[idx]) - Y[idx]) ** 2).mean().backward()
        opt.step()
        step += 1
        if rank == 0:
            torch.save({"model": model.state_dict(), "step": step}, out / "snapshot.tmp")
            os.replace(out / "snapshot.tmp", snapshot)
        seen = {k: e[k] for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")}
        log.write(json.dumps({"step": step, "t": time.time(), **seen}) + "\n")
        log.flush()
        dist.barrier()  # (the snapshot of this step is written before any worker goes on)
        if me == e.get("DIE") and step == int(e["DIE_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
