"""An MXNet dist_sync job whose worker with LAUNCHKIT_ROLE_RANK=1 crashes after startup."""

import os
import time

import mxnet as mx

kv = mx.kv.create("dist_sync")
kv.init(0, mx.nd.zeros((4,)))
print("ready", flush=True)
if os.environ["LAUNCHKIT_ROLE_RANK"] == "1":
    raise SystemExit("worker crashed on purpose")
time.sleep(60)
