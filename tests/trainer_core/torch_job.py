"""The worker of test_torch_jobs.py: ``python tests/trainer_core/torch_job.py MODE [options]`` under
``launchkit launch``; prints one ``RESULT {json}`` line. The test imports ``model`` and ``data`` to
build its single-process reference from the same definitions."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

# first: a scheduler or server serves its role on this import and ends there, never importing
# torch (a second of CPU per process)
import trainer_core  # noqa: F401

# isort: split
import torch

B, STEPS, LR = 4, 3, 0.1


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def data(workers: int, steps: int = STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(steps, workers * B, 6, generator=g), torch.randn(steps, workers * B, 3, generator=g)


def flat(m: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).tolist()


def optimizer_run(args: argparse.Namespace, hvd: Any) -> dict[str, Any]:
    """Every rank starts from its own seed; broadcast makes rank 0's model everyone's, then
    ``STEPS`` averaged steps on this rank's share of each batch."""
    r, n = hvd.rank(), hvd.size()
    dev = torch.device(args.device)
    m = model(seed=r).to(dev)
    extra = torch.nn.Linear(6, 3).to(dev)  # used by rank 0 only with --unused
    params = [*m.parameters(), *extra.parameters()]
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    hvd.broadcast_parameters(extra.state_dict(), root_rank=0)
    comp = {
        "none": hvd.Compression.none,
        "fp16": hvd.Compression.fp16,
        "1bit": hvd.Compression.onebit,
        "powersgd": hvd.Compression.powersgd(rank=1),
    }
    server = None
    if args.server_optimizer:
        from trainer_core.optim.server import SGD

        server = SGD(learning_rate=LR)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(params, lr=LR),
        compression=comp[args.compression],
        backward_passes_per_step=args.accum,
        average_aggregated_gradients=True,
        server_optimizer=server,
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ops = {}
    if server is None:  # tensor operations after the gradients' compression was set: exact
        probe = torch.linspace(-1, 1, 1001, device=dev) * (r + 1.2345)
        ops = {
            "sum": hvd.allreduce(probe, op=hvd.Sum).tolist(),
            "bcast": hvd.broadcast(probe, root_rank=n - 1).tolist(),
            "gather": hvd.allgather(probe[: r + 1]).tolist(),
        }
    xs, ys = (t.to(dev) for t in data(n, args.steps))
    if args.fixed:  # the same batch every step: the loss must fall
        xs, ys = xs[:1].expand_as(xs), ys[:1].expand_as(ys)
    losses = []
    for x, y in zip(xs, ys, strict=True):
        mine = slice(r * B, (r + 1) * B)
        for xp, yp in zip(x[mine].chunk(args.accum), y[mine].chunk(args.accum), strict=True):
            out = m(xp) + (extra(xp) if args.unused and r == 0 else 0)
            loss = torch.nn.functional.mse_loss(out, yp)
            loss.backward()
        # a server-side optimizer updates every key on the servers: no allreduce of the loss then
        losses.append(float(loss if server else hvd.allreduce(loss.detach())))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {
        "ops": ops,
        "params": flat(m),
        "extra": torch.cat([p.detach().reshape(-1) for p in extra.parameters()]).tolist(),
        "losses": losses,
    }


def ddp_run(args: argparse.Namespace, hvd: Any) -> dict[str, Any]:
    """The same DDP model trained twice over a gloo process group: gradients by gloo's allreduce,
    and by trainer_core through the communication hook; the parameters of both."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, n = hvd.rank(), hvd.size()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=r, world_size=n)
    comp = {
        "none": hvd.Compression.none,
        "fp16": hvd.Compression.fp16,
        "1bit": hvd.Compression.onebit,
        "powersgd": hvd.Compression.powersgd(rank=1),
    }
    results = {}
    for name in ("gloo", "hook"):
        ddp = DDP(model(seed=r), bucket_cap_mb=0.0005)  # several buckets (DDP's broadcast: rank 0's)
        state = None
        if name == "hook":
            state = hvd.HookState(compression=comp[args.compression])
            ddp.register_comm_hook(state, hvd.comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        xs, ys = data(n, args.steps)
        for x, y in zip(xs, ys, strict=True):
            mine = slice(r * B, (r + 1) * B)
            torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
            opt.step()
            opt.zero_grad()
        results[name] = flat(ddp.module)
        if state is not None:
            state.close()
    dist.destroy_process_group()
    return results


def main() -> None:
    import trainer_core.torch as hvd

    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["optimizer", "ddp"])
    p.add_argument("--compression", default="none")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--unused", action="store_true")
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--server-optimizer", action="store_true")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the model and the batches live (cpu, cuda)")
    p.add_argument("--path", default=None, help="init's path (allreduce, ps; default: the job's)")
    p.add_argument("--kv-too", action="store_true", help="after training, pushpull a key of the KV store")
    args = p.parse_args()
    hvd.init(path=args.path)
    out = optimizer_run(args, hvd) if args.mode == "optimizer" else ddp_run(args, hvd)
    if args.kv_too:  # the store of this process's one registration (a job with servers)
        import numpy as np

        import trainer_core.kv as kv

        store = kv.create("dist_sync")
        store.init("kv-too", np.zeros(3))
        got = np.zeros(3)
        store.pushpull("kv-too", np.full(3, hvd.rank() + 1.0), got)
        out["kv_too"] = got.tolist()
    out.update(rank=hvd.rank(), size=hvd.size(), comm=hvd.comm(), local=[hvd.local_rank(), hvd.local_size()])
    out["role_env"] = os.environ.get("DMLC_ROLE")
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
