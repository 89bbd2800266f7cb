"""trainer_core on a real GPU, in real jobs: workers that push cupy gradients to servers, and
trainer_core.torch with the model and its batches on CUDA, on the allreduce and parameter-server
paths. Every worker of a job shares the one GPU a test machine has; NCCL refuses two ranks on one
GPU, so the allreduce path's device arrays go through host memory there (``nccl.agree``). Each
test skips where there is no usable GPU (every CI machine); ``scripts/gpu-check.sh`` runs them on
a GPU machine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trainer_core.cluster import run_job, worker_script
from tests.trainer_core.gpu import gpu, torch_cuda
from tests.trainer_core.test_kv_compression import STEPS, assert_clean, reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DEVICE_BODY = """
import cupy
params = json.loads(os.environ['TEST_COMP'])
n = 3000
kv.init('g', np.zeros(n, np.float32))
kv.set_gradient_compression(params)
bounds = [(p.start, p.stop) for p in kv.meta['g'].parts]
for step in range(3):
    g = cupy.asarray(np.random.default_rng([kv.rank, step, n]).standard_normal(n).astype(np.float32))
    out = cupy.empty(n, np.float32)
    kv.pushpull('g', g, out)
    assert isinstance(out, cupy.ndarray)
    emit(step=step, out=cupy.asnumpy(out).tolist(), bounds=bounds)
"""


@pytest.mark.parametrize("params", [{"type": "2bit", "threshold": 0.5}, {"type": "1bit"}])
def test_two_workers_push_device_gradients_to_two_servers(params: dict) -> None:
    """2 workers, 2 servers, cupy gradients compressed on the device: every pull equals the
    reference computed from the host compressors (the CUDA kernels are bit-identical to them)."""
    gpu()
    env = {"TEST_COMP": json.dumps(params), "MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}
    job = run_job(worker_script(DEVICE_BODY), 2, 2, env)
    assert_clean(job)
    for w in job.workers:
        res = w.results()
        bounds = [tuple(b) for b in res[0]["bounds"]]
        assert len(bounds) == 2
        want = reference(params, 2, bounds, 3000)
        for step in range(STEPS):
            np.testing.assert_array_equal(np.array(res[step]["out"], np.float32), want[step])


def _torch_jobs():  # imported only where torch is there
    from tests.trainer_core import test_torch_jobs

    return test_torch_jobs


@pytest.mark.parametrize("servers", [0, 1], ids=["allreduce", "ps"])
def test_torch_on_cuda_trains_like_one_process(servers: int) -> None:
    torch = torch_cuda()
    jobs = _torch_jobs()
    results = jobs.launch("optimizer", "--device", "cuda", servers=servers)
    assert [r["comm"] for r in results] == (["allreduce"] * 2 if servers == 0 else ["ps"] * 2)
    got = jobs.same_everywhere(results)
    torch.testing.assert_close(got, jobs.reference(2), rtol=1e-4, atol=1e-5)


def test_torch_on_cuda_with_onebit_gradients_trains() -> None:
    torch_cuda()
    jobs = _torch_jobs()
    results = jobs.launch(
        "optimizer", "--device", "cuda", "--compression", "1bit", "--steps", "20", "--fixed"
    )
    jobs.same_everywhere(results)
    losses = results[0]["losses"]
    assert losses[-1] < 0.7 * losses[0], losses
