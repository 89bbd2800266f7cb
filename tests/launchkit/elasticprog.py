"""A worker program for the elastic-job tests (no trainer_core): every process writes its
contract to ``$OUT/start-ROLE-INDEX-PID`` when it starts, then waits until ``$OUT/stop`` exists and
exits 0. A worker whose ``LAUNCHKIT_ROLE_RANK`` is in ``$FAIL`` (comma-separated) exits 3 at
once; with ``IN_PROCESS=1`` every worker reports ``dmlc_env.ELASTIC_IN_PROCESS_FIGURE`` = 1 to the
launcher's metrics endpoint (as trainer_core's elastic API does) before anything else."""

import json
import os
import socket
import sys
import time
from pathlib import Path

import dmlc_env
from dmlc_env import telemetry

e = os.environ
out = Path(e["OUT"])
role, index = e["DMLC_ROLE"], int(e["LAUNCHKIT_ROLE_RANK"])
names = (
    "RANK",
    "WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "DMLC_NUM_WORKER",
    "LAUNCHKIT_ELASTIC",
    "DMLC_TASK_ID",
)
seen = {k: e.get(k) for k in names}


def report(seq: int) -> None:
    host, _, port = e[dmlc_env.LAUNCHKIT_METRICS_ADDR].rpartition(":")
    key = telemetry.metrics_key(e[dmlc_env.LAUNCHKIT_JOB_SECRET])
    rep = telemetry.Report(
        e[dmlc_env.LAUNCHKIT_JOB_ID],
        role,
        index,
        seq,
        time.time(),
        {dmlc_env.ELASTIC_IN_PROCESS_FIGURE: 1},
        os.getpid(),
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(telemetry.encode(key, rep), (host.strip("[]"), int(port)))


if role == "worker" and e.get("IN_PROCESS") == "1":
    report(1)
    # (the figure reaches the launcher before this worker says it started)
    time.sleep(0.3)
(out / f"start-{role}-{index}-{os.getpid()}").write_text(json.dumps(seen))
if role == "worker" and str(index) in e.get("FAIL", "").split(","):
    print(f"worker {index} fails", file=sys.stderr, flush=True)
    sys.exit(3)
seq = 2
while not (out / "stop").exists():
    time.sleep(0.05)
    if role == "worker" and e.get("IN_PROCESS") == "1" and seq < 40:
        report(seq)
        seq += 1
