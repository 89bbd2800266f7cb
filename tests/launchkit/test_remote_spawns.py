"""A host's processes start from one message: the ssh backend sends each host's queued processes
in one ``spawns`` instruction (the environment they share once), and the watchdog starts each
as if it had come alone (issue 28: 1024 spawn messages at 128 hosts x 8)."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

from launchkit.backends.ssh.agent import HostAgent, RemoteProcess, spawns_message
from launchkit.backends.ssh.backend import SshBackend
from launchkit.core.hostfile import host_key
from launchkit.core.spec import Host, LaunchSpec, Task
from launchkit.hostside import watchdog
from tests.launchkit.plans import make_plan
from tests.launchkit.test_remote import Dog, _PipeConnection

SAY = 'echo "$LAUNCHKIT_ROLE_RANK $SHARED ${OWN:-none}"'


def _plan(tmp_path: Any, hosts: tuple[Host, ...], per_host: int) -> tuple[LaunchSpec, list[Task]]:
    spec = LaunchSpec(
        num_workers=per_host * len(hosts),
        num_servers=0,
        command=("sh", "-c", SAY),
        cwd=str(tmp_path),
        hosts=hosts,
        backend="ssh",
        env=(("SHARED", "all of them"),),
    )
    plan = make_plan(spec, job_id="job-spawns", secret="s", root_uri="127.0.0.1", root_port=1)
    return spec, [t for t in plan.tasks if t.role != "scheduler"]


def test_each_host_gets_its_processes_in_one_message(tmp_path) -> None:
    hosts = (Host("h1"), Host("h2"))
    spec, tasks = _plan(tmp_path, hosts, 3)
    backend = SshBackend()
    backend.spec = spec
    sent: dict[str, list[str]] = {}
    for h in hosts:
        conn = _PipeConnection()
        agent = HostAgent(h, conn, "job-spawns", hb_interval=5.0, hb_timeout=30.0, grace=1.0, interface=None)
        agent.start(10.0)
        backend.agents[host_key(h)] = agent
        ops = sent.setdefault(h.name, [])
        chan_send = conn.chan.sendall

        def record(data: bytes, ops: list[str] = ops, chan_send: Any = chan_send) -> None:
            ops.extend(json.loads(line)["op"] for line in data.splitlines())
            chan_send(data)

        conn.chan.sendall = record  # type: ignore[method-assign]
    try:
        procs = [backend.start(t) for t in tasks]
        backend.send_starts()
        backend.await_started()
        assert all(isinstance(p, RemoteProcess) and p.pid for p in procs)
        for h in hosts:  # one message a host, not one a process
            assert [op for op in sent[h.name] if op in ("spawn", "spawns")] == ["spawns"], sent[h.name]
        out = {p.task.rank: p.stdout.read().decode() for p in procs if isinstance(p, RemoteProcess)}
        assert out == {t.rank: f"{t.rank} all of them none\n" for t in tasks}
        assert [p.wait() for p in procs if isinstance(p, RemoteProcess)] == [0] * len(tasks)
    finally:
        backend.close()
        for agent in backend.agents.values():
            agent.chan.close()


def test_the_message_sends_the_shared_environment_once() -> None:
    base = Task("worker", 0, 0, Host("h1"), 0, ("prog",), {"A": "1", "B": "2"}, "/")
    other = Task("worker", 1, 1, Host("h1"), 0, ("prog", "x"), {"A": "1", "B": "3", "C": "4"}, "/w")
    msg = spawns_message([base, other], [7, 8])
    assert msg["op"] == "spawns" and msg["env"] == {"A": "1"}
    assert msg["procs"] == [
        {"id": 7, "argv": ["prog"], "env": {"B": "2"}, "cwd": "/", "node_host": True},
        {"id": 8, "argv": ["prog", "x"], "env": {"B": "3", "C": "4"}, "cwd": "/w", "node_host": True},
    ]


def test_the_watchdog_starts_a_batch_each_with_its_own_environment() -> None:
    dog = Dog("wd-spawns")
    try:
        dog.until("ready")
        code = "import os; print(os.environ['SHARED'], os.environ.get('OWN'))"
        procs = [
            {"id": i, "argv": [sys.executable, "-c", code], "env": {"OWN": str(i)}, "cwd": "/"}
            for i in (1, 2)
        ]
        procs.append({"id": 3, "argv": ["/no/such/program"], "env": {}, "cwd": "/"})
        dog.send({"op": "spawns", "env": {"SHARED": "s", "LAUNCHKIT_JOB_ID": "wd-spawns"}, "procs": procs})
        for i in (1, 2):
            assert dog.until("started", id=i)["pid"] > 0
            assert dog.until("exit", id=i)["rc"] == 0
            dog.until("eof", id=i, s="o")
            assert dog.output(i) == f"s {i}\n".encode()
        assert dog.until("error", id=3)["code"] == 127  # the others start all the same
        dog.send({"op": "spawns", "procs": "not a list"})
        assert "procs" in dog.until("bad")["msg"]
        dog.send({"op": "shutdown"})
        dog.until("bye")
    finally:
        dog.p.kill()


def test_a_batch_that_arrives_while_the_watchdog_ends_starts_nothing() -> None:
    out = io.BytesIO()
    dog = watchdog.Watchdog(out)
    dog.stopping.set()
    dog.spawns({"procs": [{"id": 1, "argv": ["sleep", "60"]}, {"id": 2, "argv": ["sleep", "60"]}]})
    assert dog.children == {}
    msgs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(m["ev"], m["id"], m["code"]) for m in msgs] == [("error", 1, 126), ("error", 2, 126)]
