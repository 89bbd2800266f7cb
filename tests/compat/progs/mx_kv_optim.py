"""MXNet 1.9.1's own ``local`` KV store with an optimizer set (``kv.set_optimizer``): reads JSON
cases from stdin, each ``{"optimizer", "kwargs", "weight", "pushes"}`` (every push a list of
values, one per device, summed by the store), pushes each and pulls the key; prints the pulled
values, as JSON (float32 values are exact in JSON)."""

import json
import sys

import mxnet as mx
import numpy as np

out = []
for case in json.load(sys.stdin):
    kv = mx.kv.create("local")
    kv.set_optimizer(mx.optimizer.create(case["optimizer"], **case["kwargs"]))
    kv.init(3, mx.nd.array(np.array(case["weight"], np.float32)))
    pulled = []
    for values in case["pushes"]:
        kv.push(3, [mx.nd.array(np.array(v, np.float32)) for v in values])
        res = mx.nd.zeros(len(case["weight"]))
        kv.pull(3, out=res)
        pulled.append(res.asnumpy().tolist())
    out.append(pulled)
print(json.dumps(out))
