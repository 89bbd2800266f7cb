"""Horovod's elastic API in real jobs (a scheduler process and workers started as an elastic
job's, ``tests/trainer_core/cluster.py``): a worker that dies mid-epoch is a
``HorovodInternalError`` on the survivors, which go back to their last commit, re-form at two and
train on in their own processes; a worker started later joins at the next change and gets the
state from rank 0. The epoch skips no sample and repeats none but the sampler's padding, and every
worker ends with the same parameters, bit for bit."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

from .cluster import Job, run_job
from .test_node_elastic import late_worker, wait_for

# (a worker importing torch on a loaded machine can miss a heartbeat for a few seconds)
ELASTIC = {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "6", "PS_START_TIMEOUT": "60"}
N = 48

#: two epochs of lockstep steps (batches of 2 per worker, a commit after each); launcher worker 2
#: exits after its third committed step; epoch 1 starts once the group has TEST_SIZE workers
WORKER = f"""
import json, os, time
import torch
import trainer_core.torch as hvd
hvd.init()
me = os.environ["LAUNCHKIT_ROLE_RANK"]
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
g = torch.Generator().manual_seed(1)
X = torch.randn({N}, 4, generator=g)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
sampler = hvd.elastic.ElasticSampler(range({N}), shuffle=True, seed=3)
state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, steps=0)
sizes = []
state.register_reset_callbacks([lambda: sizes.append(hvd.size())])
def emit(**v):
    print("RESULT " + json.dumps(v), flush=True)

@hvd.elastic.run
def train(state):
    while state.epoch < 2:
        while state.epoch == 1 and hvd.size() < int(os.environ["TEST_SIZE"]):
            state.commit()  # epoch 1 waits for the late worker: a HostsUpdatedInterrupt brings it in
            time.sleep(0.05)
        b = 0
        while b * 2 < len(sampler):
            idx = sampler.get_indices(b, 2)
            opt.zero_grad()
            ((model(X[idx]) - Y[idx]) ** 2).mean().backward()
            opt.step()
            sampler.record_batch(b, 2)
            b += 1
            state.steps += 1
            emit(at="step", epoch=state.epoch, idx=idx, size=hvd.size(), steps=state.steps)
            state.commit()
            if me == "2" and state.steps == 3:
                os._exit(3)
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()

train(state)
emit(at="done", rank=hvd.rank(), size=hvd.size(), steps=state.steps, sizes=sizes, pid=os.getpid(),
     params=[p.detach().reshape(-1).tolist() for p in model.parameters()])
hvd.shutdown()
"""


@pytest.mark.proc
@pytest.mark.timeout(240)
def test_a_lost_worker_and_a_late_one_keep_training_from_the_last_commit() -> None:
    extra = {**ELASTIC, "LAUNCHKIT_ELASTIC": "2:3", "TEST_SIZE": "3"}

    def during(job: Job) -> None:
        w0 = job.workers[0]
        wait_for(lambda: any(r.get("size") == 2 for r in w0.results()), 60)  # re-formed at 2
        job.procs.append(late_worker(job, 3, 3, "2:3", extra, code=WORKER))

    job = run_job(WORKER, 3, 0, extra_env=extra, during=during, timeout=120)
    out = job.outputs()
    assert job.codes() == {"scheduler 0": 0, "worker 0": 0, "worker 1": 0, "worker 2": 3, "worker 3": 0}, out
    w0, w1, w2, w3 = job.workers
    done = {w.rank: next(r for r in w.results() if r["at"] == "done") for w in (w0, w1, w3)}
    assert {d["size"] for d in done.values()} == {3}, out
    assert done[0]["params"] == done[1]["params"] == done[3]["params"], out  # bit for bit
    assert done[0]["steps"] == done[1]["steps"] == done[3]["steps"], out
    for w in (w0, w1):
        assert done[w.rank]["pid"] == w.popen.pid  # the survivors kept their processes
        assert done[w.rank]["sizes"][0] == 2 and done[w.rank]["sizes"][-1] == 3, out
    # every sample of each epoch was trained on; repeats only from the padding at a new size
    steps = [r for w in (w0, w1, w2, w3) for r in w.results() if r["at"] == "step"]
    for epoch in (0, 1):
        seen = Counter(i for r in steps if r["epoch"] == epoch for i in r["idx"])
        assert set(seen) == set(range(N)), (epoch, sorted(seen))
        assert sum(seen.values()) - N <= 2 * 2, (epoch, seen)  # two changes, < size padding each
