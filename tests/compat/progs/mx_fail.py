"""An MXNet dist_sync job whose worker with LAUNCHKIT_ROLE_RANK=1 crashes after startup.

The crash is ``os._exit``: a worker that raises or calls ``sys.exit`` after creating a dist
kvstore blocks in ps-lite's finalize barrier at exit until the others finish (an MXNet
behaviour, not a launcher one), so it would not end by itself."""

import os
import sys
import time

import mxnet as mx

kv = mx.kv.create("dist_sync")
kv.init(0, mx.nd.zeros((4,)))
print("ready", flush=True)
if os.environ["LAUNCHKIT_ROLE_RANK"] == "1":
    print("worker crashed on purpose", file=sys.stderr, flush=True)
    os._exit(3)
time.sleep(60)
