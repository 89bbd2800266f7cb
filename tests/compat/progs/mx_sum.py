"""A dist_sync job with the real MXNet: every worker pushes (rank + 1) * ones; the pulled sum
must be exact. Prints one JSON line per worker."""

import json
import os

import mxnet as mx

kv = mx.kv.create("dist_sync")
shapes = {3: (2, 3), 7: (1000,), 9: (300, 400)}  # the last one is above no bound: one server
for key, shape in shapes.items():
    kv.init(key, mx.nd.zeros(shape))
results = {}
for rnd in range(3):
    for key, shape in shapes.items():
        kv.push(key, mx.nd.ones(shape) * (kv.rank + 1) * (rnd + 1))
    for key, shape in shapes.items():
        out = mx.nd.zeros(shape)
        kv.pull(key, out=out)
        results[f"{key}/{rnd}"] = sorted(set(out.asnumpy().ravel().tolist()))
print(
    json.dumps(
        {
            "rank": kv.rank,
            "num_workers": kv.num_workers,
            "results": results,
            "launchkit_rank": os.environ.get("LAUNCHKIT_ROLE_RANK"),
        }
    ),
    flush=True,
)
