"""In-process data parallelism on scikit-learn's digits: 4 simulated workers, each compressing its
gradient per key; the "server" decodes and averages. Compressed training must keep the accuracy
of uncompressed training (the distributed version over the KV store is tested elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.available import skip_without
from trainer_core.compression import get_compressor
from trainer_core.optim.local import get_learner
from trainer_core.train.data import SplitSampler
from trainer_core.train.nn import MLP

skip_without("sklearn")


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    perm = np.random.default_rng(0).permutation(len(d.target))
    return x, d.target, perm[:1400], perm[1400:]


def train(digits, params, workers=4, epochs=10, batch=16, lr=0.03, seed=0):
    x, y, train_idx, test_idx = digits
    net = MLP([64, 128, 10], seed=seed)
    opt = get_learner("momentum", net.params, lr=lr, momentum=0.9)
    compressors = [{k: get_compressor(params) for k in net.params} for _ in range(workers)]
    samplers = [SplitSampler(len(train_idx), workers, i, seed=seed) for i in range(workers)]
    sent = 0
    for epoch in range(epochs):
        batches = [s.batches(batch, epoch) for s in samplers]
        for step in range(min(len(b) for b in batches)):
            total = {k: np.zeros_like(v) for k, v in net.params.items()}
            for w in range(workers):
                idx = train_idx[batches[w][step]]
                _, grads = net.loss_and_grads(x[idx], y[idx])
                for k, g in grads.items():
                    payload, meta = compressors[w][k].encode(g)
                    sent += payload.nbytes
                    total[k] += compressors[w][k].decode(payload, meta, g.shape, g.dtype)
            opt.update({k: v / workers for k, v in total.items()})
    return net.accuracy(x[test_idx], y[test_idx]), sent


def test_compressed_training_keeps_the_accuracy(digits):
    base, raw_bytes = train(digits, None)
    assert base > 0.95
    for params, reduction in [
        ({"type": "1bit"}, 30),
        ({"type": "2bit", "threshold": 0.02}, 15),
        ({"type": "topk", "ratio": 0.05}, 9),
    ]:
        acc, sent = train(digits, params)
        assert acc > base - 0.03, (params, acc, base)
        assert raw_bytes / sent > reduction, (params, raw_bytes / sent)
