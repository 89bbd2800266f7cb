"""What the tests of jobs without servers (``-s 0``) share, on every backend: the program they
launch (``noserverprog.py``) and the check of what every process got."""

from __future__ import annotations

from pathlib import Path

PROG = str(Path(__file__).with_name("noserverprog.py"))


def check_workers_only(outs: dict, workers: int, cluster: str) -> None:
    """Every process is a worker (a scheduler would have run the command too), with the contract's
    and torch's variables: ranks over the workers, worker 0's host, two distinct ports there."""
    assert sorted(outs) == [("worker", i) for i in range(workers)]
    roots = {
        (o["DMLC_PS_ROOT_URI"], o["DMLC_PS_ROOT_PORT"], o["MASTER_ADDR"], o["MASTER_PORT"])
        for o in outs.values()
    }
    assert len(roots) == 1, roots
    uri, port, addr, master = roots.pop()
    assert uri == addr and uri and port != master and int(port) > 0 and int(master) > 0
    for (_, rank), o in outs.items():
        assert o["DMLC_ROLE"] == "worker" and o["DMLC_NUM_SERVER"] == "0" and o["DMLC_JOB_CLUSTER"] == cluster
        assert o["LAUNCHKIT_ROOT_SERVER"] == "worker 0"
        assert (o["RANK"], o["WORLD_SIZE"]) == (str(rank), str(workers))
        assert o["LOCAL_RANK"] == o["LAUNCHKIT_LOCAL_RANK"] and o["GROUP_RANK"] == o["NODE_RANK"]
        # torchrun's others: one role, the attempt, the job as its run id
        assert (o["ROLE_RANK"], o["ROLE_WORLD_SIZE"], o["ROLE_NAME"]) == (str(rank), str(workers), "default")
        assert int(o["GROUP_WORLD_SIZE"]) > int(o["GROUP_RANK"])
        assert o["TORCHELASTIC_RESTART_COUNT"] == o["LAUNCHKIT_RESTART_COUNT"]
        assert o["TORCHELASTIC_RUN_ID"] == o["LAUNCHKIT_JOB_ID"]
