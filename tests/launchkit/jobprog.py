"""A small program the end-to-end tests launch as every role of a job.

jobprog.py env                       print the contract variables as JSON (stdout), a line on stderr
jobprog.py fail ROLE RANK CODE       that process exits CODE after a moment; the others wait
jobprog.py selfkill ROLE RANK SIG    that process kills itself with signal SIG; the others wait
jobprog.py wait [SECONDS]            print "ready" and sleep
jobprog.py grandchild [SECONDS]      start a `setsid` grandchild (a new session) and sleep
jobprog.py stray                     start a `setsid` grandchild and exit 0 at once
jobprog.py zmqbind                   the scheduler binds DMLC_PS_ROOT_PORT with ZeroMQ
jobprog.py argv ARGS...              print sys.argv[2:] as JSON
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROLE = os.environ.get("DMLC_ROLE", "")
RANK = os.environ.get("LAUNCHKIT_ROLE_RANK", "")


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "env":
        keys = sorted(
            k for k in os.environ if k.startswith(("DMLC_", "LAUNCHKIT_", "PYTHONUNBUFFERED", "CUDA_", "X_"))
        )
        env = {k: os.environ[k] for k in keys}
        env["cwd"] = os.getcwd()
        env["stdin_is_devnull"] = str(os.path.samestat(os.fstat(0), os.stat(os.devnull)))
        print(json.dumps(env), flush=True)
        print(f"stderr of {ROLE} {RANK}", file=sys.stderr, flush=True)
        return 0
    if mode in ("fail", "selfkill"):
        role, rank, value = argv[1], argv[2], int(argv[3])
        print("ready", flush=True)
        if (role, rank) == (ROLE, RANK):
            time.sleep(0.5)
            print(f"{role} {rank} is failing", file=sys.stderr, flush=True)
            if mode == "selfkill":
                os.kill(os.getpid(), value)
            return value
        time.sleep(60)
        return 0
    if mode == "wait":
        print("ready", flush=True)
        time.sleep(float(argv[1]) if len(argv) > 1 else 60)
        return 0
    if mode in ("grandchild", "stray"):
        subprocess.Popen(
            ["setsid", sys.executable, "-c", "import time; time.sleep(60)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print("ready", flush=True)
        if mode == "grandchild":
            time.sleep(float(argv[1]) if len(argv) > 1 else 60)
        return 0
    if mode == "zmqbind":
        if ROLE == "scheduler":
            import zmq

            sock = zmq.Context().socket(zmq.ROUTER)
            sock.bind(f"tcp://{os.environ['DMLC_PS_ROOT_URI']}:{os.environ['DMLC_PS_ROOT_PORT']}")
            print("bound", flush=True)
            sock.close(0)
        return 0
    if mode == "argv":
        print(json.dumps(argv[1:]), flush=True)
        return 0
    signal.raise_signal(signal.SIGABRT)
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
