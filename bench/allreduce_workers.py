"""The programs each peer of bench/allreduce.py runs in every worker process.

Each takes ``SIZES REPS WARMUP`` (sizes comma-separated) and times its operation alike: the same
float32 array of ones summed over every rank, back to back, ``WARMUP`` untimed operations then
``REPS`` timed ones per size (five times as many up to 1e5 elements); rank 0 prints ``RESULT {json}`` with the median seconds per size
(and, for trainer_core's collective, the algorithm the default choice took). Every program
checks the sum it got.
"""

from __future__ import annotations

COMMON = r"""
import json, os, sys, time
import numpy as np
sizes = [int(float(s)) for s in sys.argv[1].split(",")]
reps, warmup = int(sys.argv[2]), int(sys.argv[3])
def median(times):
    times = sorted(times)
    return times[len(times) // 2]
def reps_for(n):
    return reps * 5 if n <= 100_000 else reps  # small operations are cheap: more of them
def timed(op, n):
    for _ in range(warmup):
        op()
    times = []
    for _ in range(reps_for(n)):
        t = time.perf_counter()
        op()
        times.append(time.perf_counter() - t)
    return median(times)
"""

# trainer_core's collective allreduce in a -s 0 job: the scheduler role only serves the node layer
# (importing trainer_core does that), the workers join the group. One job runs the default choice
# and each algorithm forced, size by size.
TC_COLLECTIVE = (
    "import trainer_core\n"
    + COMMON
    + r"""
if os.environ.get("DMLC_ROLE") != "worker":
    sys.exit(0)
from trainer_core.collective import Thresholds, join
g = join()
out = {}
for n in sizes:
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    for name, force in (("default", None), ("ring", "ring"), ("doubling", "recursive_doubling")):
        g.thresholds = Thresholds(force=force)
        out[f"{name}/{n}"] = timed(lambda: g.allreduce(x, out=y), n)
        assert (y == g.size).all(), (name, n, y[:4])
        if name == "default":
            out[f"algorithm/{n}"] = g.last_algorithm
if g.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
g.close()
"""
)

# trainer_core's parameter server: push the array, pull the sum (one round trip).
TC_PUSHPULL = (
    "import trainer_core\n"
    + COMMON
    + r"""
from trainer_core import kv as kvs
kv = kvs.create("dist_sync")
out = {}
for n in sizes:
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    kv.init(f"k{n}", np.zeros(n, np.float32))
    out[f"pushpull/{n}"] = timed(lambda: kv.pushpull(f"k{n}", x, y), n)
    assert float(y[0]) == kv.num_workers, y[0]
if kv.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
kv.close()
"""
)

# torch.distributed, gloo backend, CPU, in place (the array is refilled with ones, untimed).
TORCH_GLOO = (
    COMMON
    + r"""
if os.environ.get("DMLC_ROLE") != "worker":
    sys.exit(0)
import torch, torch.distributed as dist
port = sys.argv[4]
rank, world = int(os.environ["LAUNCHKIT_ROLE_RANK"]), int(os.environ["DMLC_NUM_WORKER"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.set_num_threads(1)
out = {}
for n in sizes:
    x = torch.ones(n, dtype=torch.float32)
    def op():
        x.fill_(1.0)
        t = time.perf_counter()
        dist.all_reduce(x)
        return time.perf_counter() - t
    for _ in range(warmup):
        op()
    out[f"gloo/{n}"] = median([op() for _ in range(reps_for(n))])
    assert float(x[0]) == world
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""
)

# Open MPI's MPI_Allreduce through mpi4py (buffer interface: no pickling), started by mpirun.
MPI_ALLREDUCE = (
    COMMON
    + r"""
from mpi4py import MPI
comm = MPI.COMM_WORLD
import mpi4py
version = MPI.Get_library_version().replace("\x00", "").split(",")[0].strip()  # "Open MPI v4.1.4"
out = {"library": f"{version}, mpi4py {mpi4py.__version__}"}
for n in sizes:
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    out[f"mpi/{n}"] = timed(lambda: comm.Allreduce(x, y, op=MPI.SUM), n)
    assert (y == comm.Get_size()).all(), y[:4]
if comm.Get_rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
"""
)

# The alternated protocol (bench/allreduce_alternated.py): exactly WARMUP untimed then REPS timed
# operations at every size, no more for small ones.
EXACT = r"""
import json, os, sys, time
import numpy as np
sizes = [int(float(s)) for s in sys.argv[1].split(",")]
reps, warmup = int(sys.argv[2]), int(sys.argv[3])
def median(times):
    times = sorted(times)
    return times[len(times) // 2]
def timed(op):
    for _ in range(warmup):
        op()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        op()
        times.append(time.perf_counter() - t)
    return median(times)
"""

# trainer_core's module-level allreduce (the job's default group, joined on first use) into ``out``.
TC_MODULE = (
    "import trainer_core\n"
    + EXACT
    + r"""
if os.environ.get("DMLC_ROLE") != "worker":
    sys.exit(0)
from trainer_core import collective
out = {}
for n in sizes:
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    out[f"tc/{n}"] = timed(lambda: collective.allreduce(x, out=y))
    assert (y == int(os.environ["DMLC_NUM_WORKER"])).all(), (n, y[:4])
    out[f"algorithm/{n}"] = collective.group().last_algorithm
if collective.group().rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
collective.shutdown()
"""
)

# gloo's all_reduce in place, the array not refilled (it holds world ** ops at the end), one thread
# (OMP_NUM_THREADS=1 in the environment too).
TORCH_GLOO_INPLACE = (
    EXACT
    + r"""
if os.environ.get("DMLC_ROLE") != "worker":
    sys.exit(0)
import torch, torch.distributed as dist
port = sys.argv[4]
rank, world = int(os.environ["LAUNCHKIT_ROLE_RANK"]), int(os.environ["DMLC_NUM_WORKER"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.set_num_threads(1)
out = {}
for n in sizes:
    x = torch.ones(n, dtype=torch.float32)
    out[f"gloo/{n}"] = timed(lambda: dist.all_reduce(x))
    assert float(x[0]) == float(world) ** (warmup + reps), (n, float(x[0]))
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""
)
