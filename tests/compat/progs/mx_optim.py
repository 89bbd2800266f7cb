"""MXNet 1.9.1's own optimizers on given inputs. Reads JSON cases from stdin, each
``{"optimizer", "kwargs", "dtype", "weight", "grads"}``, applies ``optimizer.update`` once per
gradient (index 0, the state from ``create_state``) and prints, per case, the weight after every
step and the final state arrays, as JSON (float32 values are exact in JSON)."""

import json
import sys

import mxnet as mx
import numpy as np


def flat(state):
    if state is None:
        return []
    if isinstance(state, (tuple, list)):
        return [a for s in state for a in flat(s)]
    return [state.asnumpy().tolist()]


out = []
for case in json.load(sys.stdin):
    dtype = np.dtype(case["dtype"])
    opt = mx.optimizer.create(case["optimizer"], **case["kwargs"])
    weight = mx.nd.array(np.array(case["weight"], dtype), dtype=dtype)
    state = opt.create_state(0, weight)
    steps = []
    for g in case["grads"]:
        opt.update(0, weight, mx.nd.array(np.array(g, dtype), dtype=dtype), state)
        steps.append(weight.asnumpy().tolist())
    out.append({"steps": steps, "state": flat(state)})
print(json.dumps(out))
