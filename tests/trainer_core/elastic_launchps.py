"""A worker program for an elastic job through the parameter server (``launchkit launch -n
MIN:MAX -s 1``): the server holds the parameters ``w`` (a server-side SGD); each round every
worker pushes its gradient to ``w`` and pulls it, and pushes 1 to ``n`` (the step down of its
pulled value over the learning rate: how many workers' pushes the round summed). It appends one JSON line per round to
``$OUT/steps-INDEX`` (``INDEX``: its ``LAUNCHKIT_ROLE_RANK``), after writing its pid to
``$OUT/pid-INDEX``. A worker that sees ``$OUT/stop`` pushes 1 to ``stop``: every worker ends after
the round that moved ``stop`` (the same round for all). Each round is one ``pushpull`` of the three keys. In the scheduler and server roles
importing trainer_core serves them. With ``TEST_NO_REPORTS`` set a worker sends the launcher no
metrics report (so no word that it handles a change in its process: the job is in restart mode)."""

import json
import os
import time
from pathlib import Path

import numpy as np

if os.environ.get("TEST_NO_REPORTS"):
    os.environ.pop("LAUNCHKIT_METRICS_ADDR", None)

from trainer_core import kv as kvstore  # (after the variable above is gone)

out = Path(os.environ["OUT"])
me = os.environ["LAUNCHKIT_ROLE_RANK"]
LR = 0.5  # (the counts below are exact in float32)
(out / f"pid-{me}").write_text(str(os.getpid()))
kv = kvstore.create("dist_sync")
if not kv.late:  # (a worker that joins later takes the job's settings as they are)
    kv.set_optimizer({"type": "sgd", "learning_rate": LR})
w = np.zeros(4, np.float32)
kv.init("w", w)  # a late worker: the current values
for key in ("n", "stop"):
    kv.init(key, np.zeros(1, np.float32))
log = (out / f"steps-{me}").open("a")
target = np.arange(4, dtype=np.float32)
rounds, n, stop = 0, np.zeros(1, np.float32), np.zeros(1, np.float32)
kv.pull("n", n)  # (a late worker: where the others got to)
while stop[0] == 0:
    before = float(n[0])
    # (one call for the step's keys: a worker that joins later enters the rounds of all of them
    # at the same step; docs/elastic.md)
    asks = np.ones(1, np.float32), w - target, np.full(1, float((out / "stop").exists()), np.float32)
    kv.pushpull(["n", "w", "stop"], list(asks), [n, w, stop])
    rounds += 1
    line = {"round": rounds, "n": round((before - float(n[0])) / LR), "t": time.time()}
    log.write(json.dumps(line) + "\n")
    log.flush()
print("RESULT " + json.dumps({"me": me, "pid": os.getpid(), "rounds": rounds, "w": w.tolist()}), flush=True)
kv.close()
