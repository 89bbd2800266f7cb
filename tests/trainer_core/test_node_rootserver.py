"""The scheduler served by worker 0's process (a job without a scheduler process, ``-s 0``):
``Postoffice.join`` of worker 0 starts it in a thread; the other workers join it as a scheduler;
barrier and finish work; a silent root is named as worker 0; ``stop`` ends the thread."""

from __future__ import annotations

import socket
import threading

import pytest

from trainer_core.config import NodeConfig
from trainer_core.errors import NodeFailure
from trainer_core.log import get_logger
from trainer_core.node.postoffice import Postoffice

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(rank: int, port: int, workers: int = 2, **extra: str) -> dict[str, str]:
    return {
        "DMLC_ROLE": "worker",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": "0",
        "DMLC_NUM_WORKER": str(workers),
        "LAUNCHKIT_ROLE_RANK": str(rank),
        "LAUNCHKIT_JOB_SECRET": "s" * 64,
        "LAUNCHKIT_JOB_ID": "rootserver-test",
        "DMLC_NODE_HOST": "127.0.0.1",
        "LAUNCHKIT_ROOT_SERVER": "worker 0",
        "PS_START_TIMEOUT": "20",
        **extra,
    }


def join_all(envs: list[dict[str, str]]) -> list[Postoffice]:
    nodes: list[Postoffice | None] = [None] * len(envs)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            nodes[i] = Postoffice.join(NodeConfig.from_environ(envs[i]), get_logger(0))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(envs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [n for n in nodes if n is not None]


def close(nodes: list[Postoffice]) -> None:
    for n in nodes:
        n.stop()
        n.close_transport()


def test_worker_0_serves_the_root_and_the_job_ends_with_finish() -> None:
    port = free_port()
    nodes = join_all([env(r, port, 3) for r in range(3)])
    try:
        assert [n.name for n in nodes] == ["worker 0", "worker 1", "worker 2"]
        assert nodes[0].root is not None and all(n.root is None for n in nodes[1:])
        barrier = [threading.Thread(target=n.barrier) for n in nodes]
        for t in barrier:
            t.start()
        for t in barrier:
            t.join(10)
        assert not any(t.is_alive() for t in barrier)
        finish = [threading.Thread(target=n.finish) for n in nodes]
        for t in finish:
            t.start()
        for t in finish:
            t.join(10)
        assert not any(t.is_alive() for t in finish)
        root = nodes[0].root
        assert root is not None and root.wait(5)  # it ended by itself once every worker finished
        assert root.exit_code == 0
    finally:
        close(nodes)


def test_a_silent_root_is_worker_0s_failure() -> None:
    port = free_port()
    fast = {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "1"}
    nodes = join_all([env(r, port, **fast) for r in range(2)])
    try:
        nodes[0].stop()  # its heartbeats and the root's thread end: worker 0 as if it hung
        assert nodes[1].live.failed.wait(10)
        failure = nodes[1].live.failure
        assert isinstance(failure, NodeFailure) and failure.node == "worker 0"
        assert "in worker 0" in str(failure)
    finally:
        close(nodes)


def test_a_job_with_a_scheduler_process_starts_none_in_worker_0() -> None:
    cfg = NodeConfig.from_environ({**env(0, 1), "LAUNCHKIT_ROOT_SERVER": ""})
    assert not cfg.env.root_in_worker0
