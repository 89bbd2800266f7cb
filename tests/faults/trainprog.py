"""A small trainer_core job the fault-injection tests launch as every role.

    trainprog.py [--steps N] [--delay S] [--checkpoint PATH] [--resume] [--size N] [--chatter BYTES]

Scheduler and server roles run on ``import trainer_core`` and exit when the job ends. Each
worker pushes and pulls one array per step, ``--delay`` seconds apart, and prints
``step K`` (flushed) after every step; rank 0 writes ``--checkpoint`` (trainer_core's atomic
format) after every step, and ``--resume`` starts from it when it exists. At the end each worker prints ``done RANK SUM``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import trainer_core  # noqa: F401  (runs the scheduler / server roles)
from trainer_core import kv as kvstore
from trainer_core.train import checkpoint


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--delay", type=float, default=0.1)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--chatter", type=int, default=0, help="print a line of this many bytes per step too")
    ap.add_argument("--hold", default="", help="before the end, wait until this file exists (60 s at most)")
    args = ap.parse_args()
    kv = kvstore.create("dist_sync")
    params = {"w": np.zeros(args.size, np.float32)}
    first = 0
    if args.resume and args.checkpoint and os.path.exists(args.checkpoint):
        ck = checkpoint.load(args.checkpoint)
        checkpoint.restore_params(params, ck)
        first = ck.step
    kv.init("w", params["w"])
    out = np.empty(args.size, np.float32)
    for step in range(first, args.steps):
        kv.pushpull("w", np.ones(args.size, np.float32), out)
        params["w"] += out
        if kv.rank == 0 and args.checkpoint:
            checkpoint.save(args.checkpoint, params=params, step=step + 1)
        if args.chatter:
            print("x" * args.chatter, flush=True)
        print(f"step {step + 1}", flush=True)
        time.sleep(args.delay)
    deadline = time.monotonic() + 60
    while args.hold and not os.path.exists(args.hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"done {kv.rank} {float(params['w'][0])}", flush=True)
    kv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
