"""The programs each peer of bench/allreduce_hosts.py runs in every worker process.

Each takes ``SIZES REPS WARMUP`` (sizes comma-separated): for every size, ``WARMUP`` untimed then
``REPS`` timed operations on a float32 array of ones, back to back (more of them below 1e6
elements); rank 0 prints ``RESULT {json}``: the median seconds per size and the bytes its host's
``eth0`` carried per operation (both ways). Every program checks the sum it got.
"""

from __future__ import annotations

COMMON = r"""
import json, os, sys, time
import numpy as np
sizes = [int(float(s)) for s in sys.argv[1].split(",")]
reps, warmup = int(sys.argv[2]), int(sys.argv[3])
def link_bytes(dev="eth0"):
    for line in open("/proc/net/dev"):
        name, _, rest = line.partition(":")
        if name.strip() == dev:
            f = rest.split()
            return int(f[0]) + int(f[8])
    return 0
def reps_for(n):
    return reps * 4 if n < 1_000_000 else reps
cpu = {}  # process CPU seconds (every thread) per operation, by the key timed() was given
def timed(op, n, before=None, key=None):
    for _ in range(warmup):
        op()
    times = []
    b0, c0 = link_bytes(), time.process_time()
    for _ in range(reps_for(n)):
        if before:
            before()
        t = time.perf_counter()
        op()
        times.append(time.perf_counter() - t)
    if key:
        cpu[key] = (time.process_time() - c0) / reps_for(n)
    times.sort()
    return times[len(times) // 2], (link_bytes() - b0) / reps_for(n)
"""

# trainer_core: 32-bit allreduce (the default choice: hierarchical with 2 workers per host), the
# 1-bit compressed allreduce with error feedback (Group.compressed_allreduce, into a reused out=
# where the tree has it), and, after both, the local CPU costs that bound them: a float32 add of the whole array (the reduction's arithmetic),
# and 1-bit encode + decode of the whole array (what a rank compresses and decodes per operation,
# roughly), timed on every rank at once as in the job; and the CPU time every rank spent per
# allreduce, summed over the ranks (an allgather): divided by the time, the cores the job kept busy.
TC = (
    COMMON
    + r"""
from inspect import signature
from trainer_core import collective
from trainer_core.collective import ErrorFeedback
from trainer_core.compression import get_compressor
from trainer_core.compression.codec import decode
g = collective.group()
params = {"type": "1bit"}
feedback = ErrorFeedback(dict(params))
out = {"local_size": g.local_size, "hosts": len(set(g.hosts))}
for n in sizes:
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    out[f"tc32/{n}"], out[f"tc32_bytes/{n}"] = timed(lambda: g.allreduce(x, out=y), n, key=f"tc32/{n}")
    assert (y == g.size).all(), y[:4]
    out[f"algorithm/{n}"] = g.last_algorithm
    g.barrier()
    res = {}
    # into a reused array where the tree's compressed_allreduce takes out= (as a training loop would)
    into = {"out": np.empty_like(x)} if "out" in signature(g.compressed_allreduce).parameters else {}
    out["tc1_out"] = bool(into)
    def one_bit():
        res["y"] = g.compressed_allreduce(x, feedback, key=n, op="sum", **into)
    out[f"tc1/{n}"], out[f"tc1_bytes/{n}"] = timed(one_bit, n, key=f"tc1/{n}")
    assert abs(float(res["y"][0]) - g.size) < 1e-3 * g.size, res["y"][:4]
    g.barrier()
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    out[f"add/{n}"], _ = timed(lambda: np.add(a, b, out=a), n)
    comp = get_compressor(params)
    def codec():
        payload, meta = comp.encode(x)
        decode(bytes(np.asarray(payload).view(np.uint8).reshape(-1)), meta, n, np.float32)
    out[f"codec/{n}"], _ = timed(codec, n)
    g.barrier()
keys = sorted(cpu)
every = g.allgather(np.array([[cpu[k] for k in keys]]))
out.update({f"cpu_{k}": float(every[:, i].sum()) for i, k in enumerate(keys)})
if g.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
collective.shutdown()
"""
)

# torch.distributed with gloo on CPU, env:// (MASTER_ADDR/PORT, RANK, WORLD_SIZE from the launcher).
GLOO = (
    COMMON
    + r"""
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
out = {}
for n in sizes:
    t = torch.ones(n, dtype=torch.float32)
    out[f"gloo/{n}"], out[f"gloo_bytes/{n}"] = timed(lambda: dist.all_reduce(t), n, before=lambda: t.fill_(1.0))
    assert float(t[0]) == dist.get_world_size()
if dist.get_rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""
)

# Open MPI's MPI_Allreduce through mpi4py (buffer interface), started by mpirun on the hosts.
MPI = (
    COMMON
    + r"""
import mpi4py
from mpi4py import MPI
comm = MPI.COMM_WORLD
version = MPI.Get_library_version().replace("\x00", "").split(",")[0].strip()
out = {"library": f"{version}, mpi4py {mpi4py.__version__}"}
for n in sizes:
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    out[f"mpi/{n}"], out[f"mpi_bytes/{n}"] = timed(lambda: comm.Allreduce(x, y, op=MPI.SUM), n)
    assert (y == comm.Get_size()).all(), y[:4]
if comm.Get_rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
"""
)
