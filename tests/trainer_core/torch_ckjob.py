"""The worker of test_torch_checkpoint_jobs.py: ``python tests/trainer_core/torch_ckjob.py MODE PATH``
under ``launchkit launch -n 2 -s 2``, a small model trained ``N`` steps through the parameter
servers with 1-bit compression and a server-side Adam. ``first`` saves a checkpoint at step ``K``
and goes on, ``resume`` starts from it, ``straight`` saves nothing; each prints one ``RESULT
{json}`` line with its final parameters."""

from __future__ import annotations

import argparse
import json

# first: the scheduler and the servers serve their role on this import and end, without torch
import trainer_core  # noqa: F401

# isort: split
import torch

K, N = 3, 6


def main() -> None:
    import trainer_core.torch as hvd
    from trainer_core.optim.server import Adam
    from trainer_core.torch import checkpoint

    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["first", "resume", "straight"])
    p.add_argument("path")
    args = p.parse_args()
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(r)  # broadcast_parameters makes rank 0's everyone's
    m = torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1),
        named_parameters=m.named_parameters(),
        compression=hvd.Compression.onebit,
        server_optimizer=Adam(learning_rate=0.01),
        fusion_threshold=1024,
    )
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    start = 0
    if args.mode == "resume":
        got = checkpoint.load(args.path, m, opt)
        assert got is not None
        start = got[0]
    for step in range(start, N):
        g = torch.Generator().manual_seed(1000 * step + r)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad()
        if args.mode == "first" and step + 1 == K:
            checkpoint.save(args.path, K, m, opt)
    params = torch.cat([q.detach().reshape(-1) for q in m.parameters()]).tolist()
    print("RESULT " + json.dumps({"rank": r, "start": start, "params": params}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
