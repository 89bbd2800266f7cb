"""The program the tests of jobs without servers (``-s 0``) launch on every backend.

noserverprog.py env                  print the contract and torch's variables as JSON
noserverprog.py allreduce [RANK]     join trainer_core's collective group, allreduce, print the
                                     sum as JSON; worker RANK then SIGKILLs itself while the
                                     others wait in a barrier (the job must fail naming it);
                                     ``allreduce RANK once``: on the first attempt only;
                                     ``allreduce RANK stop``: SIGSTOP instead (it hangs)
noserverprog.py early RANK [HOW]     join, allreduce once; worker RANK then ends while the others
                                     wait in a second allreduce, named 'grad.3': HOW ``exit``
                                     (the default) exits 0 without leaving the group, ``shutdown``
                                     calls ``collective.shutdown()`` and exits 0, ``raise`` raises
                                     a ValueError (exit 1)
noserverprog.py torch                a plain torch.distributed script (gloo, env://): it never
                                     imports trainer_core; prints the all_reduce's sum as JSON
"""

from __future__ import annotations

import json
import os
import signal
import sys

NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "OMP_NUM_THREADS",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)


def env() -> dict[str, str]:
    keys = [k for k in os.environ if k.startswith(("DMLC_", "LAUNCHKIT_")) or k in NAMES]
    return {k: os.environ[k] for k in sorted(keys)}


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "env":
        print(json.dumps(env()), flush=True)
        return 0
    if mode == "allreduce":
        import numpy as np

        from trainer_core import collective

        group = collective.group()
        total = collective.allreduce(np.full(7, group.rank + 1, dtype=np.int64))
        print(
            json.dumps(
                {"rank": group.rank, "size": group.size, "sum": total.tolist(), "pid": os.getpid(), **env()}
            ),
            flush=True,
        )
        first = os.environ.get("LAUNCHKIT_RESTART_COUNT", "0") == "0"
        if len(argv) > 1 and group.rank == int(argv[1]) and (first or argv[2:] != ["once"]):
            os.kill(os.getpid(), signal.SIGSTOP if argv[2:] == ["stop"] else signal.SIGKILL)
        collective.barrier()
        collective.shutdown()
        return 0
    if mode == "early":
        import numpy as np

        from trainer_core import collective

        group = collective.group()
        collective.allreduce(np.ones(3))
        how = argv[2] if len(argv) > 2 else "exit"
        if group.rank == int(argv[1]):
            print(json.dumps({"rank": group.rank, "ends": how}), flush=True)
            if how == "shutdown":
                collective.shutdown()  # it leaves the group: the others' wait fails at once
            elif how == "raise":
                raise ValueError(f"boom from worker {group.rank}")
            return 0  # (``exit``: early, without ``shutdown``: the others still wait for it)
        collective.allreduce(np.ones(3), name="grad.3")
        collective.shutdown()
        return 0
    if mode == "torch":
        import torch
        import torch.distributed as dist

        dist.init_process_group(backend="gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
        t = torch.full((3,), float(dist.get_rank() + 1))
        dist.all_reduce(t)
        print(
            json.dumps({"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": t.tolist()}),
            flush=True,
        )
        dist.destroy_process_group()
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
