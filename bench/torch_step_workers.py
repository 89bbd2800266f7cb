"""The worker program of bench/torch_step.py, as text written into the job's directory (the
namespace hosts see that directory, not the checkout).

    step.py tc|ddp MODEL COMPRESSION STEPS WARMUP

``tc``: ``trainer_core.torch``'s ``DistributedOptimizer`` (``comm`` from the job: allreduce with
``-s 0``, the parameter servers with ``-s 1``), ``COMPRESSION`` none or 1bit; ``ddp``: torch's
``DistributedDataParallel`` with gloo (env://). ``MODEL``: ``cnn`` (examples/train_torch.py's,
copied beside as ``train_torch.py``) on 8x8 inputs, or ``mlp`` (1024-2048-1024-10, 4.2M parameters)
on 1024 inputs; 16 random samples per worker per step, SGD lr 0.01. After WARMUP steps and a
barrier, every step is timed (forward, backward, the exchange, the update); rank 0 prints
``RESULT {json}`` with the median, in seconds, and torch's intra-op threads (1 on both sides: 4
workers share the host's cores, as do trainer_core's collective thread and gloo's).
"""

STEP = """
import json, os, statistics, sys, time
import torch

torch.set_num_threads(1)
kind, name, comp, steps, warm = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
if name == "cnn":
    sys.path.insert(0, os.getcwd())
    from train_torch import make_model
    model, shape = make_model(), (16, 1, 8, 8)
else:
    L = torch.nn.Linear
    model = torch.nn.Sequential(L(1024, 2048), torch.nn.ReLU(), L(2048, 1024), torch.nn.ReLU(), L(1024, 10))
    shape = (16, 1024)
params = sum(p.numel() for p in model.parameters())
if kind == "tc":
    import trainer_core.torch as hvd

    hvd.init()
    rank, barrier = hvd.rank(), hvd.barrier
    compression = hvd.Compression.onebit if comp == "1bit" else hvd.Compression.none
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    end = hvd.shutdown
else:
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    rank, barrier = dist.get_rank(), dist.barrier
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = dist.destroy_process_group
gen = torch.Generator().manual_seed(rank)
x, y = torch.randn(*shape, generator=gen), torch.randint(0, 10, (16,), generator=gen)
times = []
for s in range(warm + steps):
    if s == warm:
        barrier()
    t0 = time.perf_counter()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if s >= warm:
        times.append(time.perf_counter() - t0)
barrier()
if rank == 0:
    out = {"step_s": statistics.median(times), "params": params, "threads": torch.get_num_threads()}
    print("RESULT " + json.dumps(out), flush=True)
end()
"""
