"""trainer_core.metrics in one process, on real UDP sockets: what a report carries, the rate
bound, and that a slow or gone endpoint costs training nothing and raises nothing."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from dmlc_env import telemetry as wire
from trainer_core import metrics
from trainer_core.transport.datagram import DatagramPeer, parse_address

SECRET = "k" * 64
KEY = wire.metrics_key(SECRET)


@pytest.fixture
def endpoint() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(2.0)
    yield s
    s.close()


def address(s: socket.socket) -> str:
    host, port = s.getsockname()
    return f"{host}:{port}"


def reporter(addr: str, interval: float = 0.2) -> metrics.Reporter:
    return metrics.Reporter(lambda: DatagramPeer(addr, SECRET, "job1"), "worker", 2, interval=interval)


def receive(s: socket.socket) -> wire.Report:
    report = wire.decode(KEY, "job1", s.recv(wire.MAX_DATAGRAM + 1))
    assert report is not None
    return report


def drain(s: socket.socket, seconds: float) -> list[wire.Report]:
    got = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            got.append(receive(s))
        except TimeoutError:
            break
    return got


def test_a_report_carries_the_latest_figures_and_the_sources(endpoint: socket.socket) -> None:
    r = reporter(address(endpoint))
    calls = [0]

    def source() -> dict[str, float]:
        calls[0] += 1
        return {"bytes_pushed": 1000 * calls[0]}

    r.add_source(source)
    r.report(step=1, loss=np.float32(0.5), samples=32)
    r.report(step=2, loss=0.25, samples=32, accuracy=None, note="text", flag=True, bad=float("nan"))
    r.close()
    reports = drain(endpoint, 1.0)
    last = reports[-1]
    assert (last.role, last.rank, last.job) == ("worker", 2, "job1")
    assert last.figures["step"] == 2 and last.figures["loss"] == 0.25
    assert last.figures["samples_total"] == 64  # accumulated
    assert last.figures["bytes_pushed"] == 1000 * calls[0]  # read when the report went out
    assert not {"accuracy", "note", "flag", "bad"} & set(last.figures)
    assert [x.seq for x in reports] == sorted({x.seq for x in reports})  # increasing: none a replay


def test_too_many_figures_still_leave_a_report_that_fits(endpoint: socket.socket) -> None:
    r = reporter(address(endpoint))
    r.add_source(lambda: {f"source_figure_{i:02d}": 1e300 for i in range(12)})
    r.report(**{f"a_long_figure_name_of_the_script_{i:03d}_{'x' * 20}": -1.5e-300 for i in range(100)})
    r.close()
    last = drain(endpoint, 1.0)[-1]
    assert len(last.figures) == metrics.MAX_OWN + 12


def test_a_removed_source_leaves_its_last_figures(endpoint: socket.socket) -> None:
    r = reporter(address(endpoint))
    r.add_source(lambda: {"pushes": 7})
    r.remove_source(r._sources[0])
    assert r.snapshot() == {"pushes": 7}
    r.add_source(lambda: 1 / 0)  # type: ignore[arg-type,return-value]  # a broken source breaks nothing
    assert r.snapshot() == {"pushes": 7}
    r.close()


def test_at_most_one_report_per_interval(endpoint: socket.socket) -> None:
    r = reporter(address(endpoint), interval=0.25)
    start = time.monotonic()
    while time.monotonic() < start + 1.0:
        r.report(loss=1.0, samples=1)
        r.soon()
        time.sleep(0.001)
    took = time.monotonic() - start  # 1 s, or more on a busy machine
    got = drain(endpoint, 0.3)
    r.close()
    assert 3 <= len(got) <= (took + 0.3) / 0.25 + 1


def test_a_gone_endpoint_costs_nothing_and_raises_nothing() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    gone = address(s)
    s.close()  # nothing listens there: the kernel answers ECONNREFUSED
    peer = DatagramPeer(gone, SECRET, "job1")
    r = metrics.Reporter(lambda: peer, "worker", 0, interval=0.05)
    t = time.perf_counter()
    for i in range(10_000):
        r.report(step=i, samples=1)
    spent = time.perf_counter() - t
    deadline = time.monotonic() + 10  # the thread's reports, however slowly it is scheduled
    while peer.sent + peer.dropped < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    r.close()
    assert peer.sent + peer.dropped >= 3 and peer.dropped >= 1
    assert spent < 5.0  # report only stores numbers (measured: a few microseconds a call)


def test_an_unresolvable_endpoint_only_means_no_reports() -> None:
    r = metrics.Reporter(lambda: DatagramPeer("no-such-host.invalid:9", SECRET, "j"), "worker", 0)
    r.report(loss=1.0)
    r.close()


def test_without_the_address_every_call_is_a_no_op() -> None:
    env = {"LAUNCHKIT_JOB_SECRET": SECRET, "LAUNCHKIT_JOB_ID": "j", "DMLC_ROLE": "worker"}
    assert metrics.from_environ(env) is None
    assert (
        metrics.from_environ({**env, "LAUNCHKIT_METRICS_ADDR": "127.0.0.1:9", "LAUNCHKIT_JOB_SECRET": ""})
        is None
    )
    r = metrics.from_environ({**env, "LAUNCHKIT_METRICS_ADDR": "127.0.0.1:9", "LAUNCHKIT_ROLE_RANK": "3"})
    assert r is not None and (r.role, r.rank) == ("worker", 3)


def test_addresses() -> None:
    assert parse_address("10.0.0.1:9000") == ("10.0.0.1", 9000)
    assert parse_address("[::1]:9000") == ("::1", 9000)
    for bad in ("10.0.0.1", ":9", "h:0", "h:99999", "h:x"):
        with pytest.raises(ValueError):
            parse_address(bad)
