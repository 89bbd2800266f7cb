"""A small trainer_core job for the metrics tests: each worker pushes and pulls a few times and
reports its loss (``STEPS`` exchanges), then waits ``HOLD_S`` seconds (0 by default)."""

import os
import time

import numpy as np

from trainer_core import kv, metrics

store = kv.create("dist_sync")
store.init(0, np.zeros(1000, np.float32))
out = np.zeros(1000, np.float32)
for step in range(int(os.environ.get("STEPS", "5"))):
    store.push(0, np.ones(1000, np.float32))
    store.pull(0, out=out)
    metrics.report(step=step, loss=1.0 / (step + 1), samples=10)
time.sleep(float(os.environ.get("HOLD_S", "0")))  # e.g. for a few host samples
store.close()
