"""What the yarn tests run in every container. YARN does not stream output, so it reports in files.

yarnprog.py env OUTDIR [ARGS...]      write OUTDIR/ROLE-RANK.json: the environment, argv, cwd, files
yarnprog.py fail ROLE RANK CODE       that process exits CODE after a moment; the others wait
yarnprog.py wait OUTDIR [SECONDS]     write OUTDIR/ROLE-RANK.pid, then sleep
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROLE = os.environ.get("DMLC_ROLE", "")
RANK = os.environ.get("LAUNCHKIT_ROLE_RANK", "")


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "env":
        out = Path(argv[1])
        data = {
            "env": dict(os.environ),
            "argv": argv[2:],
            "cwd": os.getcwd(),
            "files": sorted(os.listdir(".")),
            "shipped": {n: Path(n).read_text() for n in os.listdir(".") if n.endswith(".txt")},
            "launchkit": getattr(importlib.util.find_spec("launchkit"), "origin", None),  # the node's
        }
        tmp = out / f".{ROLE}-{RANK}.tmp"
        tmp.write_text(json.dumps(data))
        tmp.rename(out / f"{ROLE}-{RANK}.json")
        print(f"{ROLE} {RANK} done", flush=True)
        return 0
    if mode == "fail":
        role, rank, code = argv[1], argv[2], int(argv[3])
        if (role, rank) == (ROLE, RANK):
            time.sleep(0.3)
            print(f"{role} {rank} is failing", file=sys.stderr, flush=True)
            return code
        time.sleep(60)
        return 0
    if mode == "wait":
        (Path(argv[1]) / f"{ROLE}-{RANK}.pid").write_text(str(os.getpid()))
        time.sleep(float(argv[2]) if len(argv) > 2 else 60)
        return 0
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
