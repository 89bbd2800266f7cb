"""A worker program for elastic jobs run through ``launchkit launch -n MIN:MAX`` (torch and
``hvd.elastic``): every worker trains a small linear model in lockstep steps, committing after
each, and appends one JSON line per committed step to ``$OUT/steps-INDEX`` (``INDEX``: its
``LAUNCHKIT_ROLE_RANK``), after writing its pid to ``$OUT/pid-INDEX``. Training ends at the first
commit after ``$OUT/stop`` exists (rank 0 decides for every rank). Then each worker prints its
``RESULT`` line (rank, size, steps, pid, parameters). In the scheduler role it does nothing:
importing trainer_core serves the scheduler there."""

import json
import os
import time
from pathlib import Path

import torch

import trainer_core.torch as hvd

hvd.init()
out = Path(os.environ["OUT"])
me = os.environ["LAUNCHKIT_ROLE_RANK"]
(out / f"pid-{me}").write_text(str(os.getpid()))
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 8, generator=g)
Y = X @ torch.arange(1.0, 9.0).reshape(8, 1)
state = hvd.elastic.TorchState(model, opt, steps=0, done=False)
log = (out / f"steps-{me}").open("a")


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while not state.done:
        idx = torch.arange(hvd.rank(), 64, hvd.size())[:4]
        opt.zero_grad()
        ((model(X[idx]) - Y[idx]) ** 2).mean().backward()
        opt.step()
        state.steps += 1
        state.done = bool(hvd.broadcast_object((out / "stop").exists(), 0))
        state.commit()
        line = {"step": state.steps, "size": hvd.size(), "rank": hvd.rank(), "t": time.time()}
        log.write(json.dumps(line) + "\n")
        log.flush()


train(state)
params = [p.detach().reshape(-1).tolist() for p in model.parameters()]
result = {"me": me, "rank": hvd.rank(), "size": hvd.size(), "steps": state.steps, "pid": os.getpid()}
print("RESULT " + json.dumps({**result, "params": params}), flush=True)
hvd.shutdown()
