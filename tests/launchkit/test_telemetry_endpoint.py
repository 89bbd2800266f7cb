"""The launcher's metrics endpoint: a real local job's processes fill its model; what is not
signed with the job's secret, for this job, and fresh, is dropped."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dmlc_env import telemetry as wire
from launchkit import launching
from launchkit.backends.local import LocalBackend
from launchkit.console import Ui
from launchkit.core.spec import LaunchSpec
from launchkit.telemetry.endpoint import Telemetry, serve

JOB = Path(__file__).with_name("metricsjob.py")
SECRET = "e" * 64


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_local_job_reports_every_nodes_bytes_and_the_scripts_loss(served_endpoints) -> None:
    served = served_endpoints
    spec = LaunchSpec(num_workers=2, num_servers=1, command=(sys.executable, str(JOB)), env=(("STEPS", "5"),))
    assert launching.run_job(spec, LocalBackend(), Ui()).exit_code == 0
    t = served[0]
    assert t is not None and t.dropped == 0
    nodes = {k: s.latest for k, s in t.model.nodes.items()}
    assert set(nodes) == {("worker", 0), ("worker", 1), ("server", 0)}
    for rank in (0, 1):
        w = nodes[("worker", rank)]
        assert w["bytes_pushed"] == w["bytes_pulled"] == 5 * 4000  # 5 exchanges of 1000 float32
        assert w["loss"] == pytest.approx(0.2) and w["step"] == 4 and w["samples_total"] == 50
        assert w["compression_ratio"] == 1.0 and w["registered"] == 1
        assert w["pull_ms"] > 0 and w["heartbeat_age_s"] >= 0
    server = nodes[("server", 0)]
    assert server["registered"] == 1
    assert server["requests"] > 10 and server["bytes_received"] >= 2 * 5 * 4000  # its last report
    assert t._sock.fileno() == -1  # closed with the job


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_one_endpoint_serves_every_attempt_and_a_restart_is_no_replay(served_endpoints) -> None:
    served = served_endpoints
    job = JOB.with_name("restartjob.py")
    spec = LaunchSpec(
        num_workers=1, num_servers=1, command=(sys.executable, str(job)), max_restarts=1, restart_backoff=0.1
    )
    result = launching.run_job(spec, LocalBackend(), Ui())
    assert result.exit_code == 0 and result.attempt == 1
    assert len(served) == 1 and served[0] is not None
    t = served[0]
    attempts = {f.get("attempt") for _, f in t.model.nodes[("worker", 0)].points}
    assert attempts >= {0.0, 1.0} and t.dropped == 0


def datagram(key: bytes = wire.metrics_key(SECRET), job: str = "j1", seq: int = 1) -> bytes:
    return wire.encode(key, wire.Report(job, "worker", 0, seq, time.time(), {"loss": 1.0}))


def send(t: Telemetry, data: bytes) -> None:
    host, _, port = t.address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(data, (host, int(port)))


def wait_for(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_only_fresh_reports_of_this_job_signed_with_its_secret_count() -> None:
    t = Telemetry("j1", SECRET, "127.0.0.1")
    try:
        send(t, datagram(key=wire.metrics_key("another secret")))
        send(t, datagram(job="j2"))
        send(t, b"\x00" * 100)
        send(t, datagram(seq=5))
        send(t, datagram(seq=5))  # replayed
        send(t, datagram(seq=4))  # older
        wait_for(lambda: t.received + t.dropped == 6)
        assert (t.received, t.dropped) == (1, 5)
        assert list(t.model.nodes) == [("worker", 0)] and len(t.model.nodes[("worker", 0)].points) == 1
    finally:
        t.close()


def test_serve_needs_an_address_it_can_bind() -> None:
    assert serve("j", SECRET, "", object()) is None  # a batch job finds its own address
    assert serve("j", SECRET, "192.0.2.1", object()) is None  # not this machine's (TEST-NET-1)
    sinks = []

    class Backend:
        def set_host_sink(self, sink) -> None:
            sinks.append(sink)

    t = serve("j", SECRET, "127.0.0.1", Backend())
    assert t is not None and sinks == [t.host_report]
    t.close()


def test_the_local_sampler_finds_the_jobs_processes_by_their_job_id() -> None:
    env = {"PATH": "/usr/bin:/bin", "LAUNCHKIT_JOB_ID": "jsample"}
    mine = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    other = subprocess.Popen(
        ["sleep", "30"], env={**env, "LAUNCHKIT_JOB_ID": "jother"}, start_new_session=True
    )
    t = Telemetry("jsample", SECRET, "127.0.0.1")
    try:
        t.watch_local("here")
        wait_for(lambda: ("here", mine.pid) in t.model.procs)
        assert ("here", other.pid) not in t.model.procs
        assert t.model.hosts["here"].latest["mem_total"] > 0
    finally:
        t.close()
        for p in (mine, other):
            p.kill()
            p.wait()


def test_the_plan_gives_every_process_the_address_when_there_is_one() -> None:
    from tests.launchkit.plans import make_plan

    spec = LaunchSpec(
        num_workers=2, num_servers=1, command=("python", "t.py"), env=(("LAUNCHKIT_METRICS_ADDR", "x:1"),)
    )
    plan = make_plan(
        spec, job_id="j", secret="s", root_uri="127.0.0.1", root_port=1, metrics_addr="127.0.0.1:5"
    )
    assert {t.env["LAUNCHKIT_METRICS_ADDR"] for t in plan.tasks} == {"127.0.0.1:5"}
    plain = LaunchSpec(num_workers=2, num_servers=1, command=("python", "t.py"))
    plan = make_plan(plain, job_id="j", secret="s", root_uri="127.0.0.1", root_port=1)
    assert not any("LAUNCHKIT_METRICS_ADDR" in t.env for t in plan.tasks)
