"""A small Gluon training run over dist_sync with the optimizer on the kvstore
(update_on_kvstore: workers push gradients, servers apply SGD, workers pull weights) and
2-bit gradient compression. Prints the first and last epoch's loss (JSON) on every worker.

MXNet 1.9.1's ``gluon.Trainer`` cannot combine a dist kvstore with compression (its
``pushpull`` refuses compressed stores: "Compression not supported with PushPull"), so the
push/pull is done here the way ``Module`` does it.
"""

import json

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

kv = mx.kv.create("dist_sync")
kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.2, rescale_grad=1.0 / kv.num_workers))
rng = np.random.default_rng(kv.rank)
true_w = np.arange(1, 11, dtype=np.float32) / 10
x = rng.standard_normal((512, 10)).astype(np.float32)
y = x @ true_w + 0.01 * rng.standard_normal(512).astype(np.float32)
net = gluon.nn.Dense(1, in_units=10)
net.initialize(mx.init.Zero())
params = list(net.collect_params().values())
for i, p in enumerate(params):
    kv.init(i, p.data())
loss_fn = gluon.loss.L2Loss()
data = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=32)
losses = []
for _epoch in range(6):
    total = 0.0
    for xb, yb in data:
        with autograd.record():
            loss = loss_fn(net(xb), yb).mean()
        loss.backward()
        for i, p in enumerate(params):
            kv.push(i, p.grad())
            kv.pull(i, out=p.data())
        total += float(loss.asscalar())
    losses.append(total / len(data))
print(json.dumps({"rank": kv.rank, "first": losses[0], "last": losses[-1]}), flush=True)
# Finish every pending engine operation and free the store while the engine still runs: left to
# interpreter exit, MXNet's atexit hook (MXNotifyShutdown: engine WaitForAll) sometimes waits for
# ever while the other worker sits in the store's finalize barrier (about 1 run in 8 here).
mx.nd.waitall()
del kv
