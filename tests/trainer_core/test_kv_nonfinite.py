"""A non-finite gradient through every compressor of the KV store, in a real job (scheduler, one
server, two workers): worker 0 pushes NaN, +inf and -inf among finite values, worker 1 finite
values; both pull non-finite values at those elements (a divergence or AMP overflow check sees
them), and the next round of finite pushes pulls finite values again (no residual keeps them).
Before, 2-bit turned them into 0 and +-threshold. The kernels alone: test_compression_nonfinite.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trainer_core.cluster import KERNELS_LOADING, run_job, worker_script

BODY = """
params = json.loads(os.environ['TEST_COMP'])
n = 100
kv.init('g', np.zeros(n, np.float32))
kv.set_gradient_compression(params)
g = (np.random.default_rng(kv.rank).standard_normal(n) * 0.7).astype(np.float32)
if kv.rank == 0:
    g[3], g[40], g[77] = np.nan, np.inf, -np.inf
out = np.empty(n, np.float32)
kv.pushpull('g', g, out)
emit(step=0, out=out.tolist())
kv.pushpull('g', np.full(n, 0.25, np.float32), out)
emit(step=1, out=out.tolist())
"""

BAD = [3, 40, 77]

pytestmark = pytest.mark.timeout(150)  # (a compressor's numba kernels compile in each process)


@pytest.mark.parametrize(
    "params",
    [{"type": "2bit", "threshold": 0.5}, {"type": "1bit", "block_size": 16}, {"type": "topk", "ratio": 0.1}],
    ids=lambda p: p["type"],
)
def test_a_non_finite_push_is_pulled_non_finite_and_the_next_round_is_finite(params: dict) -> None:
    job = run_job(
        worker_script(BODY), 2, 1, {"TEST_COMP": json.dumps(params), **KERNELS_LOADING}, timeout=120
    )
    assert all(code == 0 for code in job.codes().values()), job.outputs()
    for w in job.workers:
        first, second = (np.array(r["out"], np.float32) for r in w.results())
        assert not np.isfinite(first[BAD]).any(), (params, first[BAD])
        assert np.isfinite(second).all(), (params, second)
