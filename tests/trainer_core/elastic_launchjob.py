"""A worker program for elastic jobs run through ``launchkit launch -n MIN:MAX`` (torch and
``hvd.elastic``): every worker trains a small linear model in lockstep steps, committing after
each, and appends one JSON line per committed step to ``$OUT/steps-INDEX`` (``INDEX``: its
``LAUNCHKIT_ROLE_RANK``), after writing its pid to ``$OUT/pid-INDEX``. Training ends at the first
commit after ``$OUT/stop`` exists (rank 0 decides for every rank). Then each worker prints its
``RESULT`` line (rank, size, steps, pid, parameters). In the scheduler role it does nothing:
importing trainer_core serves the scheduler there.

The model, its data and its step (``problem``, ``loss``) and the elastic training loop
(``train_elastic``) are also what ``bench/elastic.py`` measures (``bench/elastic_worker.py``
imports them): the bench's torch.distributed leg trains the same model with the same step."""

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

FEATURES, SAMPLES, BATCH = 8, 64, 4


def problem() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    """The model and the data, the same on every worker (seeded): a linear layer to fit."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    return model, x, x @ torch.arange(1.0, FEATURES + 1).reshape(FEATURES, 1)


def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """One step's loss on this worker's ``BATCH`` samples (every ``size``-th from ``rank``)."""
    idx = torch.arange(rank, SAMPLES, size)[:BATCH]
    return ((model(x[idx]) - y[idx]) ** 2).mean()


def train_elastic(out: Path, committed: Callable[..., None]) -> tuple:
    """``hvd.elastic`` training of ``problem()`` until ``out/stop`` exists, ``committed(state)``
    after each commit; returns the model and the state (``state.steps``: the committed steps)."""
    import trainer_core.torch as hvd

    hvd.init()
    model, x, y = problem()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, opt, steps=0, done=False)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while not state.done:
            opt.zero_grad()
            loss(model, x, y, hvd.rank(), hvd.size()).backward()
            opt.step()
            state.steps += 1
            state.done = bool(hvd.broadcast_object((out / "stop").exists(), 0))
            state.commit()
            committed(state)

    train(state)
    return model, state


def main() -> None:
    import trainer_core.torch as hvd

    out = Path(os.environ["OUT"])
    me = os.environ["LAUNCHKIT_ROLE_RANK"]
    (out / f"pid-{me}").write_text(str(os.getpid()))
    log = (out / f"steps-{me}").open("a")

    def committed(state: hvd.elastic.TorchState) -> None:
        line = {"step": state.steps, "size": hvd.size(), "rank": hvd.rank(), "t": time.time()}
        log.write(json.dumps(line) + "\n")
        log.flush()

    model, state = train_elastic(out, committed)
    params = [p.detach().reshape(-1).tolist() for p in model.parameters()]
    result = {"me": me, "rank": hvd.rank(), "size": hvd.size(), "steps": state.steps, "pid": os.getpid()}
    print("RESULT " + json.dumps({**result, "params": params}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
