"""Start-up failures release everything and raise a clear ``KVError``.

Each role is started in this process against a peer that fails it on purpose (nothing at the
scheduler's address, a scheduler that refuses, a server whose data port is closed or that does
not hold the secret, a malformed address, a port that is taken), with tiny ``PS_START_TIMEOUT``
and heartbeat settings. After the error, the process must hold what it held before: the same
file descriptors (listeners, sockets, ZeroMQ's eventfds), the same OS threads (ZeroMQ's I/O
threads, heartbeat threads) and no ``/dev/shm`` segment of the job. Descriptors a peer in this
process (the real scheduler) closes on its own after a disconnect are awaited, with a generous bound.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from trainer_core.config import NodeConfig
from trainer_core.errors import ConfigError, KVError, NodeFailure, StartupTimeout
from trainer_core.kv.dist import DistKVStore
from trainer_core.node import listen as listening
from trainer_core.node import postoffice
from trainer_core.node.liveness import Liveness
from trainer_core.ps import protocol as wire
from trainer_core.ps.client import WorkerClient
from trainer_core.ps.scheduler import Scheduler
from trainer_core.ps.server import Server
from trainer_core.transport.control import Transport

LOG = logging.getLogger("test_startup_failures")
SECRET = "startup-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(role: str, port: int, job: str, **extra: str) -> NodeConfig:
    env = {
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NODE_HOST": "127.0.0.1",
        "DMLC_NUM_SERVER": "1",
        "DMLC_NUM_WORKER": "1",
        "LAUNCHKIT_JOB_SECRET": SECRET,
        "LAUNCHKIT_JOB_ID": job,
        "PS_HEARTBEAT_INTERVAL": "0.1",
        "PS_HEARTBEAT_TIMEOUT": "5",
        "PS_START_TIMEOUT": "5",
        **extra,
    }
    return NodeConfig.from_environ(env)


@dataclass(frozen=True)
class Held:
    """What this process holds: open descriptors (with what they are), OS threads, Python threads."""

    fds: frozenset[tuple[int, str]]
    tasks: int
    threads: frozenset[str]

    @classmethod
    def now(cls) -> Held:
        fds = set()
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, gone already
                fds.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
        return cls(
            frozenset(fds),
            len(os.listdir("/proc/self/task")),
            frozenset(t.name for t in threading.enumerate()),
        )


def released(before: Held, job: str, within_s: float = 10.0) -> None:
    """Everything held since ``before`` is released (waiting at most ``within_s`` for what a peer
    in this process closes on its own after a disconnect)."""
    deadline = time.monotonic() + within_s
    while True:
        after = Held.now()
        extra_fds = after.fds - before.fds
        ok = not extra_fds and after.tasks <= before.tasks and after.threads <= before.threads
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra_fds, f"descriptors left open: {sorted(extra_fds)}"
    assert after.threads <= before.threads, f"threads left running: {sorted(after.threads - before.threads)}"
    assert after.tasks <= before.tasks, f"OS threads left: {after.tasks} now, {before.tasks} before"
    assert glob.glob(f"/dev/shm/launchkit-{job}-*") == []


@pytest.fixture
def job() -> str:
    return f"startup-{uuid.uuid4().hex[:8]}"


class FakeScheduler:
    """A real ``Scheduler`` in a thread, plus one fake server registration naming ``endpoint`` and
    ``data`` (nothing needs to serve there): the worker under test gets a book with that server."""

    def __init__(self, job: str, endpoint: str, data: str) -> None:
        self.port = free_port()
        self.scheduler = Scheduler(config("scheduler", self.port, job, PS_HEARTBEAT_TIMEOUT="30"), LOG)
        self.thread = threading.Thread(target=self.scheduler.run, name="test-scheduler")
        self.thread.start()
        self.transport = Transport(SECRET, LOG)
        reg = self.transport.connect(f"tcp://127.0.0.1:{self.port}")
        body = {
            "role": "server",
            "rank": -1,
            "host": "127.0.0.1",
            "endpoint": endpoint,
            "local": "",
            "data": data,
            "host_key": "another-host",
            "pid": 1,
        }
        reg.send(wire.Header(op=wire.REGISTER, body=body))
        self.reg = reg
        deadline = time.monotonic() + 10  # registered: the connection is up on both sides
        while not self.scheduler.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.scheduler.pending

    def close(self) -> None:
        # end the job: the fake server aborts it, so the scheduler's thread returns
        self.reg.send(wire.Header(op=wire.HEARTBEAT, src="server 0"))
        self.reg.send(wire.Header(op=wire.ABORT, src="server 0", body={"reason": "test over"}))
        self.thread.join(30)
        self.transport.close()
        assert not self.thread.is_alive()


@pytest.fixture
def fake_scheduler(job: str) -> Iterator[Callable[[str, str], FakeScheduler]]:
    made: list[FakeScheduler] = []

    def make(endpoint: str, data: str) -> FakeScheduler:
        made.append(FakeScheduler(job, endpoint, data))
        return made[-1]

    yield make
    for s in made:
        s.close()


def impostor_server() -> tuple[socket.socket, threading.Thread]:
    """A data port that runs the challenge without the secret: it sends a nonce, reads the proof and
    answers a proof of its own that cannot be right."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)

    def serve() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.sendall(os.urandom(16))
            conn.recv(32)
            conn.sendall(os.urandom(32))
            conn.recv(1)  # until the worker hangs up

    t = threading.Thread(target=serve, name="test-impostor")
    t.start()
    return lsock, t


# -- the worker ------------------------------------------------------------------------------------


def test_worker_whose_scheduler_is_unreachable_times_out_and_releases_everything(job: str) -> None:
    before = Held.now()
    with pytest.raises(StartupTimeout, match="PS_START_TIMEOUT"):
        WorkerClient.join(config("worker", free_port(), job, PS_START_TIMEOUT="0.5"), LOG)
    released(before, job)


def test_worker_with_a_malformed_scheduler_address_raises_a_kv_error(job: str) -> None:
    """A ZeroMQ error on connect is a ``KVError`` naming the address, with the transport closed
    (before: a bare ``zmq.ZMQError``)."""
    before = Held.now()
    with pytest.raises(KVError, match="cannot connect to tcp://bad host"):
        WorkerClient.join(config("worker", 1, job, DMLC_PS_ROOT_URI="bad host"), LOG)
    released(before, job)


@pytest.mark.parametrize("how", ["data port closed", "zmq address malformed", "server without the secret"])
def test_worker_that_cannot_reach_a_server_stops_its_heartbeats_and_releases_everything(
    fake_scheduler: Callable[[str, str], FakeScheduler], job: str, how: str
) -> None:
    impostor = None
    if how == "data port closed":
        dead = f"tcp://127.0.0.1:{free_port()}"
        sched = fake_scheduler(dead, dead)
        expect = "data channel .*refused"
    elif how == "zmq address malformed":
        sched = fake_scheduler("tcp://no-port", "")
        expect = "cannot connect to tcp://no-port"
    else:
        impostor = impostor_server()
        addr = f"tcp://127.0.0.1:{impostor[0].getsockname()[1]}"
        sched = fake_scheduler(addr, addr)
        expect = "does not hold the job secret"
    before = Held.now()
    try:
        with pytest.raises(KVError, match=expect):
            WorkerClient.join(config("worker", sched.port, job), LOG)
        assert not any(t.name.startswith("trainer_core-heartbeat") for t in threading.enumerate())
        if impostor is not None:
            impostor[1].join(10)
            impostor[0].close()
        released(before, job)
    finally:
        if impostor is not None:
            impostor[0].close()


def test_kv_store_whose_first_request_fails_releases_everything(
    fake_scheduler: Callable[[str, str], FakeScheduler], job: str
) -> None:
    """``DistKVStore`` joins, then its first request (``set_mode``) waits on a server that is not
    there (its ZeroMQ address, nothing listening) until the job is aborted: the store raises the
    ``NodeFailure`` with its heartbeat thread joined and its channels and context closed."""
    sched = fake_scheduler(f"tcp://127.0.0.1:{free_port()}", "")
    abort = wire.Header(
        op=wire.ABORT, src="server 0", body={"reason": "server 0 is not there", "node": "server 0"}
    )

    def abort_once_the_worker_hears() -> None:  # the scheduler sends aborts on heartbeat channels
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rec = sched.scheduler.nodes.get("worker 0")
            if rec is not None and rec.ctl is not None:
                break
            time.sleep(0.01)
        time.sleep(0.2)  # its first request is waiting by now
        sched.reg.send(abort)

    aborter = threading.Thread(target=abort_once_the_worker_hears)
    aborter.start()
    before = Held.now()
    with pytest.raises(NodeFailure, match="server 0 is not there"):
        DistKVStore("dist_sync", config("worker", sched.port, job, PS_ENCRYPT="1"), exit_on_failure=False)
    aborter.join(10)
    sched.thread.join(10)  # the scheduler ended the job
    released(before, job)


def test_heartbeat_stop_waits_for_the_thread_before_its_transport_is_closed() -> None:
    """``Liveness.stop`` returns only once the heartbeat thread has ended (it closes its own socket),
    even when the thread is busy for longer than the old 5 s join bound (here: in its failure hook);
    closing the transport under a live thread would close a socket it still uses."""
    transport = Transport(SECRET, LOG)
    release = threading.Event()
    in_hook = threading.Event()

    def slow_hook(_failure: NodeFailure) -> None:
        in_hook.set()
        release.wait(30)

    live = Liveness(transport, f"tcp://127.0.0.1:{free_port()}", "worker 0", 0.05, 0.2, LOG, slow_hook)
    live.start()
    assert in_hook.wait(10), "the heartbeat thread never saw the scheduler's silence"
    timer = threading.Timer(6.0, release.set)
    timer.start()
    try:
        live.stop()
        assert not live._thread.is_alive(), "stop() returned while the heartbeat thread runs on"
    finally:
        release.set()
        timer.cancel()
        live._thread.join(10)
        transport.close()


# -- the server ------------------------------------------------------------------------------------


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list:
    """The listeners a node opens as it joins (``postoffice.listen``'s list), for a test to find
    after the join failed (the server then holds no node, and the Postoffice closed them)."""
    made: list = []
    real = postoffice.listen

    def spy(cfg: NodeConfig, trace: object, into: list) -> tuple[str, str]:
        made.append(into)
        return real(cfg, trace, into)  # type: ignore[arg-type]

    monkeypatch.setattr(postoffice, "listen", spy)
    return made


@pytest.mark.parametrize("encrypt", ["0", "1"])
def test_server_that_times_out_at_startup_closes_its_listeners(job: str, encrypt: str, opened: list) -> None:
    before = Held.now()
    srv = Server(config("server", free_port(), job, PS_START_TIMEOUT="0.5", PS_ENCRYPT=encrypt), LOG)
    with pytest.raises(StartupTimeout, match="PS_START_TIMEOUT"):
        srv.run()
    listeners = [listener for made in opened for listener in made]
    assert listeners, "the server made no listener: nothing was tested"
    for listener in listeners:
        assert listener.pollable() == -1, f"{type(listener).__name__} left open"  # type: ignore[attr-defined]
    released(before, job)


def test_server_refused_by_the_scheduler_closes_its_listeners(job: str, opened: list) -> None:
    """A scheduler that answers the registration with an error (e.g. one server too many)."""
    transport = Transport(SECRET, LOG)
    router, endpoint = transport.bind_router("127.0.0.1")
    port = int(endpoint.rsplit(":", 1)[1])
    stop = threading.Event()

    def refuse() -> None:
        def answer(msg: object) -> None:
            msg.reply.send(wire.Header(op=wire.ERROR, body={"reason": "more than 1 servers"}))  # type: ignore[attr-defined]

        while not stop.is_set():
            if router.wait(0.1):
                router.receive(answer)

    t = threading.Thread(target=refuse, name="test-refusing-scheduler")
    t.start()
    try:
        before = Held.now()
        srv = Server(config("server", port, job), LOG)
        with pytest.raises(NodeFailure, match="refused to start the job: more than 1 servers"):
            srv.run()
        listeners = [listener for made in opened for listener in made]
        assert listeners, "the server made no listener: nothing was tested"
        for listener in listeners:
            assert listener.pollable() == -1  # type: ignore[attr-defined]
        released(before, job)
    finally:
        stop.set()
        t.join(10)
        transport.close()


def test_server_whose_data_listener_cannot_bind_closes_the_same_host_one(
    job: str, monkeypatch: pytest.MonkeyPatch, opened: list
) -> None:
    def no_port(*_args: object) -> None:
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(listening, "TcpListener", no_port)  # (the node layer opens a node's listeners)
    before = Held.now()
    srv = Server(config("server", free_port(), job), LOG)
    with pytest.raises(KVError, match="cannot listen for the data channel"):
        srv.run()
    (listeners,) = opened
    assert len(listeners) == 1 and listeners[0].pollable() == -1  # type: ignore[attr-defined]
    released(before, job)


# -- the scheduler ---------------------------------------------------------------------------------


def test_scheduler_whose_port_is_taken_leaves_no_zmq_context_behind(job: str) -> None:
    """The error (kept, as a caller reporting it would) must not keep a live ZeroMQ context and its
    I/O threads reachable through the failed constructor's frame."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        before = Held.now()
        with pytest.raises(ConfigError, match="cannot bind") as err:
            Scheduler(config("scheduler", port, job), LOG)
        released(before, job)
        assert err.value is not None
