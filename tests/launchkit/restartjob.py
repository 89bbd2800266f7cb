"""A trainer_core job for the metrics tests whose worker reports its attempt and fails in the
first one (``LAUNCHKIT_RESTART_COUNT`` 0), then trains a step and ends in the next."""

import os
import sys

import numpy as np

from trainer_core import kv, metrics

attempt = int(os.environ.get("LAUNCHKIT_RESTART_COUNT", "0"))
store = kv.create("dist_sync")
metrics.report(attempt=attempt)
if attempt == 0:
    metrics.send_now()
    sys.exit(3)
store.init(0, np.zeros(10, np.float32))
store.push(0, np.ones(10, np.float32))
store.close()
