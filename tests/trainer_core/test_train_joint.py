"""A worker of a job with servers that uses the KV store and the collectives in one process, over
one registration (``train.joint``): real processes (scheduler, server, workers)."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest

import trainer_core.kv as kv
from tests.trainer_core.cluster import run_job
from trainer_core.config import NodeConfig
from trainer_core.errors import ConfigError
from trainer_core.ps import protocol as ps_protocol
from trainer_core.ps.client import WorkerClient
from trainer_core.train.joint import SCHEMA, Joint

ENV = {
    "DMLC_ROLE": "worker",
    "DMLC_NUM_SERVER": "0",
    "DMLC_NUM_WORKER": "2",
    "DMLC_PS_ROOT_URI": "127.0.0.1",
    "DMLC_PS_ROOT_PORT": "9",
    "LAUNCHKIT_JOB_SECRET": "s",
}

BOTH = """
import json
import numpy as np
from trainer_core.train.joint import Joint

both = Joint.join()
rank = both.group.rank
both.kv.init(3, np.zeros(6, np.float32))
out = np.zeros(6, np.float32)
both.kv.pushpull(3, np.full(6, rank + 1.0, np.float32), out)
total = both.group.allreduce(np.arange(5, dtype=np.float64) * (rank + 1))
out2 = np.zeros(6, np.float32)
both.kv.pushpull(3, out.copy(), out2)  # after a collective: the store goes on
try:  # lengths that differ across the ranks: an error on each, never a silent sum
    both.group.allreduce(np.ones(4 + rank, np.float32))
    mismatch = ""
except Exception as exc:
    mismatch = f"{type(exc).__name__}: {exc}"
after = both.group.allreduce(np.ones(3, np.float32)).tolist()
both.group.barrier()
both.kv.barrier()  # the scheduler's barrier: each worker counted once
book = both.node.book
print("RESULT " + json.dumps({
    "rank": rank, "size": both.group.size, "kv_workers": both.kv.num_workers,
    "pushpull": out.tolist(), "again": out2.tolist(), "allreduce": total.tolist(),
    "servers": book.num_servers, "workers": len(book.workers), "mismatch": mismatch, "after": after,
}), flush=True)
both.close()
"""


def test_workers_pushpull_and_allreduce_over_one_registration() -> None:
    job = run_job(BOTH, num_workers=2, num_servers=1, extra_env={"PS_VERBOSE": "1"})
    assert job.codes() == {"scheduler 0": 0, "server 0": 0, "worker 0": 0, "worker 1": 0}, job.outputs()
    results = sorted((r for p in job.workers for r in p.results()), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["size"] == 2 and r["kv_workers"] == 2 and r["workers"] == 2 and r["servers"] == 1
        assert r["pushpull"] == [3.0] * 6  # 1 + 2 (sync round of both workers)
        assert r["again"] == [6.0] * 6
        assert r["allreduce"] == [0.0, 3.0, 6.0, 9.0, 12.0]  # the workers only: the server is no member
        assert r["mismatch"].startswith("CollectiveMismatch"), r  # on every rank
        assert r["after"] == [2.0] * 3  # and the group goes on
    sched = job.of("scheduler")[0].text or ""
    pids = sorted(int(p) for p in re.findall(r"registered a worker on \S+ \(pid (\d+)\)", sched))
    assert pids == sorted(p.popen.pid for p in job.workers), sched  # one registration per worker
    assert "every worker finished: job done" in sched


def test_a_job_without_servers_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs parameter servers: launch with -s 1"):
        Joint.join(ENV)


def _node(kinds: frozenset[str] | None, num_servers: int = 1) -> SimpleNamespace:
    """What the customers read of a joined node: its transport's kinds and its book."""
    schema = SimpleNamespace(kinds=kinds)
    transport = SimpleNamespace(trace=SimpleNamespace(headers=SimpleNamespace(schema=schema)))
    return SimpleNamespace(transport=transport, book=SimpleNamespace(num_servers=num_servers), log=None)


def test_the_parameter_server_client_refuses_a_node_without_its_kinds() -> None:
    from trainer_core.collective.job import SCHEMA as COLLECTIVE_ONLY

    cfg = NodeConfig.from_environ({**ENV, "DMLC_NUM_SERVER": "1"}, role="worker")
    with pytest.raises(ValueError, match="without the parameter server's message kinds"):
        WorkerClient.on(_node(COLLECTIVE_ONLY.kinds), cfg, logging.getLogger("t"))  # type: ignore[arg-type]
    closed = _node(ps_protocol.OPS)
    closed.transport = None
    with pytest.raises(ValueError, match="needs a joined node"):
        WorkerClient.on(closed, cfg, logging.getLogger("t"))  # type: ignore[arg-type]


def test_a_store_on_a_node_of_a_job_without_servers_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs at least one parameter server"):
        kv.create("dist_sync", ENV, node=_node(SCHEMA.kinds, num_servers=0))  # type: ignore[arg-type]
