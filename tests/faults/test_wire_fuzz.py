"""Hostile input against a live server: property-based fuzzing of the wire protocol (hypothesis).

One real job runs for the whole module: a scheduler and a server as subprocesses, and this test
process as its only worker (a ``DistKVStore``, ``dist_sync``, reaching the server on its TCP data
channel). Each example attacks one of the server's channels (the TCP data channel, its ZeroMQ
ROUTER, its same-host unix channel; the scheduler's ROUTER for raw bytes and foreign keys) with
random or truncated frames, wrong sizes and dtypes, huge declared lengths, replays, and valid
frames authenticated with another job's secret. After every example:

* no crash: the scheduler and the server processes are alive;
* bounded memory: the server's resident set stays within ``RSS_SLACK`` of what it was at start;
* the stored values are unchanged: the worker's pull returns exactly what it pushed last;
* the job goes on: a new push and pull by the worker work.

Where the protocol refuses something, the refusal is observed, never inferred from silence: the
server closes a stream (EOF or reset), a ZeroMQ handshake fails on the socket's monitor, or an
``error`` reply names the refused request's ``seq``; messages that are dropped by design (a
replayed ``seq``, a header that does not decode) are followed by a ping whose answer must come
first. At the end the worker closes the store and the job must end normally (exit code 0 everywhere).

Reproducible in CI: ``derandomize=True``, no example database, a bounded number of examples.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dmlc_env import JobEnv, TaskEnv, build_env
from tests.trainer_core.probes import WITHIN, closed_by_peer, handshake_fails, send_until_closed
from trainer_core.config import NodeConfig
from trainer_core.errors import KVError
from trainer_core.kv.dist import DistKVStore
from trainer_core.ps import protocol as wire
from trainer_core.ps.protocol import SCHEMA
from trainer_core.transport.auth import channel_key, channel_proof, derive_keys
from trainer_core.transport.channel import Channel, Received, Trace
from trainer_core.transport.stream import MAX_FRAME_BYTES, MAX_FRAMES
from trainer_core.transport.tcp import STALL_S, TcpChannel
from trainer_core.transport.unix import UnixChannel

REPO = Path(__file__).resolve().parents[2]
SECRET = "fuzz-job-secret"
N = 16  # elements of the key "w" (float32)
RSS_SLACK = 256 << 20
TRACE = Trace(logging.getLogger("test_wire_fuzz"), schema=SCHEMA)
FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    # one live job for every example: a failure may leave it broken, so shrinking against it
    # would mislead (and wait on a dead server); the failing example is reported as generated
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_PREFIX = struct.Struct("<II")
_U64 = struct.Struct("<Q")


# -- the live job --------------------------------------------------------------------------------


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@dataclass
class LiveJob:
    kv: DistKVStore
    procs: dict[str, subprocess.Popen[bytes]]
    logs: dict[str, Path]
    rss0: int
    value: np.ndarray = field(default_factory=lambda: np.zeros(N, np.float32))
    rounds: int = 0

    @property
    def server(self) -> Any:
        return self.kv.client.book.servers[0]

    @property
    def scheduler_port(self) -> int:
        return int(self.kv.cfg.env.root_port)

    def fresh_seq(self) -> int:
        """A sequence number the server has not seen from worker 0 and the worker will not use: taken
        from the worker's own counter, so attackers' messages reach the request checks (the worker's
        later requests stay fresh)."""
        return next(self.kv.client._seq)

    def output(self) -> str:
        return "\n".join(
            f"--- {name}\n{path.read_text(errors='replace')[-4000:]}" for name, path in self.logs.items()
        )

    def check(self) -> None:
        """The four properties: alive, bounded memory, the value unchanged, the job goes on."""
        for name, p in self.procs.items():
            assert p.poll() is None, f"the {name} died (rc {p.returncode})\n{self.output()}"
        rss = _rss(self.procs["server"].pid)
        assert rss < self.rss0 + RSS_SLACK, f"server RSS {rss >> 20} MiB, {self.rss0 >> 20} MiB at start"
        out = np.empty(N, np.float32)
        self.kv.pull("w", out=out)
        assert out.tobytes() == self.value.tobytes(), (out, self.value)
        self.rounds += 1
        new = np.arange(N, dtype=np.float32) * np.float32(self.rounds % 7) - np.float32(self.rounds)
        self.kv.push("w", new)
        self.kv.pull("w", out=out)
        assert out.tobytes() == new.tobytes(), (out, new)
        self.value = new


def _free_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


@pytest.fixture(scope="module")
def live() -> Iterator[LiveJob]:
    reserved = _free_port()
    port = reserved.getsockname()[1]
    job_id = f"fuzz{uuid.uuid4().hex[:8]}"
    jenv = JobEnv(
        job_id=job_id,
        secret=SECRET,
        cluster="local",
        root_uri="127.0.0.1",
        root_port=port,
        num_servers=1,
        num_workers=1,
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_", "PS_"))}
    base["PYTHONPATH"] = str(REPO) + os.pathsep + base.get("PYTHONPATH", "")
    base["PS_START_TIMEOUT"] = "60"
    tmp = Path(tempfile.mkdtemp(prefix="lk-fuzz-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    kv: DistKVStore | None = None
    try:
        for task_id, role in enumerate(("scheduler", "server")):
            env = dict(base)
            task = TaskEnv(role=role, role_rank=0, task_id=task_id, local_rank=0, node_host="127.0.0.1")
            env.update(build_env(jenv, task))
            logs[role] = tmp / f"{role}.log"
            with open(logs[role], "wb") as out:
                procs[role] = subprocess.Popen(
                    [sys.executable, "-c", "import trainer_core"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=str(REPO),
                )
        worker_env = dict(base)
        worker_env.update(
            build_env(
                jenv, TaskEnv(role="worker", role_rank=0, task_id=2, local_rank=0, node_host="127.0.0.1")
            )
        )
        worker_env["PS_SHM"] = "0"  # reach the server on its TCP data channel (fresh_seq is checked there)
        reserved.close()
        kv = DistKVStore("dist_sync", NodeConfig.from_environ(worker_env), exit_on_failure=False)
        assert kv.client.routes[0].framed.caps.direct, "the worker does not use the TCP data channel"
        kv.init("w", np.zeros(N, np.float32))
        job = LiveJob(kv, procs, logs, rss0=_rss(procs["server"].pid))
        PROCS.update(procs)
        job.check()
        yield job
        job.check()
        kv.close()
        kv = None
        for name, p in procs.items():
            assert p.wait(30) == 0, f"the {name} did not end normally\n{job.output()}"
    finally:
        PROCS.clear()
        if kv is not None:
            kv.abort("the fuzz fixture failed")
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        reserved.close()
        shutil.rmtree(tmp, ignore_errors=True)


# -- observing answers and closes ----------------------------------------------------------------


def raw_stream(kind: str, live: LiveJob) -> socket.socket:
    """A plain connection to the server's data (``tcp``) or same-host (``unix``) channel, its nonce read."""
    if kind == "tcp":
        host, port = live.server.data.removeprefix("tcp://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=WITHIN)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(WITHIN)
        sock.connect("\0" + live.server.local)
    nonce = b""
    while len(nonce) < 16:
        chunk = sock.recv(16 - len(nonce))
        assert chunk, "the server closed before sending its nonce"
        nonce += chunk
    return sock


def tagged(ch: TcpChannel, prefix_and_header: bytes) -> bytes:
    """The 16-byte tag ``ch`` would put after these bytes (its next message); advances its counter."""
    tag = ch._tag(ch._tag_out, ch._count_out, prefix_and_header)
    ch._count_out += 1
    return tag


#: the job's processes, while the module's job runs: a wait gives up at once when one died
PROCS: dict[str, subprocess.Popen[bytes]] = {}


def answers(
    receive: Callable[[float], list[Received]], until: Callable[[list[Received]], bool]
) -> list[Received]:
    """Messages received until ``until`` holds, or ``WITHIN`` passed (``AssertionError`` at once when
    the scheduler or the server died)."""
    got: list[Received] = []
    deadline = time.monotonic() + WITHIN
    while not until(got) and time.monotonic() < deadline:
        dead = [name for name, p in PROCS.items() if p.poll() is not None]
        assert not dead, f"the {', '.join(dead)} died"
        got.extend(receive(0.1))
    return got


def receiver(ch: Channel) -> Callable[[float], list[Received]]:
    def receive(timeout: float) -> list[Received]:
        got: list[Received] = []
        if not ch.closed and ch.wait(timeout):
            ch.receive(got.append)
        return got

    return receive


def zmq_receiver(sock: zmq.Socket[Any]) -> Callable[[float], list[Received]]:
    def receive(timeout: float) -> list[Received]:
        got = []
        if sock.poll(int(timeout * 1000)):
            parts = sock.recv_multipart()
            got.append(Received(wire.decode(parts[0]), parts[1:], None))  # type: ignore[arg-type]
        return got

    return receive


def zmq_dealer(ctx: zmq.Context[Any], secret: str) -> zmq.Socket[Any]:
    keys = derive_keys(secret)
    sock = ctx.socket(zmq.DEALER)
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.client_public
    sock.curve_secretkey = keys.client_secret
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def decodes(header: dict[str, Any]) -> bool:
    """Whether the server's ``wire.decode`` takes this header (else it drops it, logged, unanswered)."""
    try:
        wire.decode(json.dumps(header).encode())
    except wire.WireError:
        return False
    return True


def refused(
    receive: Callable[[float], list[Received]], header: dict[str, Any], closed: Callable[[], bool]
) -> None:
    """A request that decodes must be answered with an ``error`` naming its ``seq``, before anything
    else with that ``seq`` (one that does not decode is dropped: the ping after it checks that)."""
    if not decodes(header):
        return
    seq = header["seq"]
    got = answers(receive, lambda g: any(m.header.seq == seq for m in g) or closed())
    assert [m.header.op for m in got if m.header.seq == seq] == [wire.ERROR], (
        header,
        [m.header for m in got],
    )


# -- strategies ----------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
#: a header object that may or may not decode: random fields mixed with the real ones
random_headers = st.dictionaries(
    st.sampled_from(["v", "op", "seq", "src", "e", "b", "k", "n", "dt"]) | st.text(max_size=4),
    json_values,
    max_size=6,
)
dtypes = st.sampled_from([*sorted(wire.DTYPES), "<f16", "O", "<U4", "bogus", ""])
sizes = st.one_of(
    st.integers(0, 64),
    st.sampled_from([N, N - 1, N + 1, wire.MAX_ELEMENTS, wire.MAX_ELEMENTS + 1, 2**62, -1]),
)
metas = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["1bit", "2bit", "topk", "powersgd", "none", "nosuch"])},
        optional={
            "block_size": st.integers(-8, 1 << 20),
            "threshold": st.floats(allow_nan=True),
            "k": st.integers(-1, 1 << 40),
            "ratio": st.floats(allow_nan=True),
            "rank": st.integers(-1, 1 << 20),
            "rows": st.integers(-1, 1 << 40),
            "cols": st.integers(-1, 1 << 40),
            "raw": st.integers(0, 1),
        },
    ),
)


@st.composite
def bad_requests(
    draw: st.DrawFn, shm_names: st.SearchStrategy[str | None] | None = None
) -> tuple[dict[str, Any], list[bytes]]:
    """A data request (header object and frames) the server must refuse: wrong dtype or size for
    the stored key ``w``, a key that does not exist, frames of the wrong size or missing, a
    compressed payload for no stored part like it. Never one the server may accept (it would
    change ``w`` legitimately)."""
    op = draw(st.sampled_from([wire.PUSH, wire.PUSHPULL, wire.PULL, wire.INIT]))
    key = draw(st.sampled_from(["w", "w", "nokey", 7, -1]))
    meta = draw(metas)
    # a compressed part is mostly of a float dtype (the codecs refuse others before reading the meta)
    n, dt = draw(sizes), draw(st.sampled_from(["<f4", "<f8", "<f2"]) if meta is not None else dtypes)
    shm = None if shm_names is None else draw(shm_names)
    entry: dict[str, Any] = {"k": key, "p": draw(st.sampled_from([0, 0, 1, -1])), "n": n, "dt": dt}
    if meta is not None:
        entry["c"] = meta
    if shm is not None:
        entry["shm"] = shm
    frame_len = draw(st.one_of(st.integers(0, 4 * N + 8), st.sampled_from([4 * N, 8 * N, 2 * N])))
    frames = [os.urandom(frame_len)] * draw(st.integers(0, 2))
    itemsize = np.dtype(dt).itemsize if dt in wire.DTYPES else 0
    matches_w = key == "w" and entry["p"] == 0 and n == N and dt == "<f4"
    carries = op in (wire.PUSH, wire.PUSHPULL, wire.INIT)
    valid_raw = meta is None and shm is None and frames and len(frames[0]) == n * itemsize and n >= 0
    if op == wire.INIT:
        # an init with a frame of its size (or a shared segment) would store a key: make it wrong
        if valid_raw or shm is not None:
            frames = [frames[0][:-1]] if frames and frames[0] else []
            entry.pop("shm", None)
            if n * itemsize == 0 or dt not in wire.DTYPES:
                entry["n"], entry["dt"] = N, "<f4"
                frames = [os.urandom(4 * N - 1)]
    elif matches_w and carries:
        entry["n"] = N + 1  # a push of exactly w's shape could be accepted
    elif matches_w:
        entry["dt"] = "<f8"
    body: dict[str, Any] = {"rank": 0, **({"ack": True} if op == wire.PUSH else {})}
    return {"v": 1, "op": op, "src": "worker 0", "e": [entry], "b": body}, frames


# -- unauthenticated bytes on every port -----------------------------------------------------------


@FUZZ
@given(
    target=st.sampled_from(["tcp", "unix", "zmq-server", "zmq-scheduler"]),
    payload=st.one_of(
        st.binary(max_size=2048),
        st.builds(
            lambda n, tail: struct.pack("<I", n) + tail, st.integers(0, 2**32 - 1), st.binary(max_size=64)
        ),
        st.builds(
            lambda h, c, tail: _PREFIX.pack(h, c) + tail,
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**32 - 1),
            st.binary(max_size=64),
        ),
        # a ZMTP 3 greeting, then a frame declaring 2^62 bytes
        st.just(
            b"\xff"
            + bytes(8)
            + b"\x7f\x03\x00CURVE"
            + bytes(15)
            + b"\x00"
            + bytes(31)
            + b"\x06"
            + (1 << 62).to_bytes(8, "big")
        ),
    ),
    wait_for_close=st.booleans(),
)
def test_bytes_without_the_secret_are_refused_and_change_nothing(
    live: LiveJob, target: str, payload: bytes, wait_for_close: bool
) -> None:
    if target in ("tcp", "unix"):
        sock = raw_stream(target, live)
    else:
        port = (
            live.scheduler_port if target == "zmq-scheduler" else int(live.server.endpoint.rsplit(":", 1)[1])
        )
        sock = socket.create_connection(("127.0.0.1", port), timeout=WITHIN)
    with sock:
        send_until_closed(sock, payload)
        if wait_for_close and target in ("tcp", "unix") and len(payload) >= 32:
            # a wrong proof: the server closes without a byte of answer
            assert closed_by_peer(sock) == b"", f"{target}: not closed on {payload[:40].hex()}"
        elif wait_for_close and target.startswith("zmq") and payload[:1] not in (b"", b"\xff"):
            # not a ZMTP 3 greeting: libzmq closes (it may have sent its own greeting first)
            assert closed_by_peer(sock) is not None, f"{target}: not closed on {payload[:40].hex()}"
    live.check()


# -- another job's secret --------------------------------------------------------------------------


@FUZZ
@given(
    other=st.text(min_size=1, max_size=40).filter(lambda s: s != SECRET),
    data=st.binary(min_size=4 * N, max_size=4 * N),
)
def test_valid_frames_with_another_jobs_secret_are_refused_everywhere(
    live: LiveJob, other: str, data: bytes
) -> None:
    push = {
        "v": 1,
        "op": wire.PUSH,
        "seq": live.fresh_seq(),
        "src": "worker 0",
        "e": [{"k": "w", "p": 0, "n": N, "dt": "<f4"}],
        "b": {"rank": 0, "ack": True},
    }
    header = json.dumps(push).encode()
    # the channels' own clients: the handshake fails (the server closes on the wrong proof)
    with pytest.raises(KVError, match=r"secret|closed"):
        TcpChannel.connect(live.server.data, other, TRACE)
    with pytest.raises(KVError, match=r"secret|closed"):
        UnixChannel.connect(live.server.local, other, TRACE)
    # by hand: the other job's proof, then the push tagged with that job's session key
    for kind, label in (("tcp", b"launchkit-kv-tcp-v1"), ("unix", b"launchkit-kv-unix-v1")):
        sock = raw_stream(kind, live)
        with sock:
            key = channel_key(other, label)
            proof = channel_proof(key, b"client", b"\0" * 16)  # the nonce is unknown to a replayer too
            session = channel_proof(key, b"session to server", b"\0" * 16)
            head = _PREFIX.pack(len(header), 1) + _U64.pack(len(data)) + header
            tag = hmac.new(session, _U64.pack(0) + head, hashlib.sha256).digest()[:16]
            body = head + tag + data if kind == "tcp" else struct.pack("<I", len(header)) + header
            send_until_closed(sock, proof + body)
            assert closed_by_peer(sock) == b"", f"{kind}: a foreign proof was not refused"
    # ZeroMQ: the CURVE handshake with the other job's keys fails; the queued push never arrives
    ctx = zmq.Context()
    try:
        for port in (int(live.server.endpoint.rsplit(":", 1)[1]), live.scheduler_port):
            sock = zmq_dealer(ctx, other)
            assert handshake_fails(sock, f"tcp://127.0.0.1:{port}", [[header, data]]), port
            assert not sock.poll(0)
            sock.close(linger=0)
    finally:
        ctx.term()
    live.check()


# -- a peer holding the secret: the TCP data channel ----------------------------------------------


@st.composite
def data_channel_attacks(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(
        st.sampled_from(
            [
                "bad-request",
                "garbage-header",
                "random-header",
                "replay",
                "bad-rank",
                "huge",
                "truncated",
                "raw-replay",
            ]
        )
    )
    if kind == "bad-request":
        return kind, draw(bad_requests())
    if kind == "garbage-header":
        return kind, (draw(st.binary(max_size=512)), draw(st.lists(st.binary(max_size=256), max_size=3)))
    if kind == "random-header":
        return kind, (
            json.dumps(draw(random_headers)).encode(),
            draw(st.lists(st.binary(max_size=256), max_size=3)),
        )
    if kind in ("replay", "truncated", "raw-replay"):
        return kind, (
            draw(st.integers(0, 2)),
            draw(st.binary(min_size=4 * N, max_size=4 * N)),
            draw(st.floats(0, 1)),
        )
    if kind == "bad-rank":
        return kind, draw(st.sampled_from([1, -1, 2**63, "0", True, None, 0.0]))
    # huge: one of the bounds in the prefix, or frames beyond what the entries hold
    return kind, (draw(st.sampled_from(["header", "count", "frame", "entries"])), draw(st.integers(1, 2**20)))


def push_header(seq: int, rank: Any = 0, n: int = N) -> bytes:
    return json.dumps(
        {
            "v": 1,
            "op": wire.PUSH,
            "seq": seq,
            "src": "worker 0",
            "e": [{"k": "w", "p": 0, "n": n, "dt": "<f4"}],
            "b": {"rank": rank, "ack": True},
        }
    ).encode()


@FUZZ
@given(attacks=st.lists(data_channel_attacks(), min_size=1, max_size=4))
def test_a_data_channel_peer_with_the_secret_cannot_break_the_server(
    live: LiveJob, attacks: list[tuple[str, Any]]
) -> None:
    ch = TcpChannel.connect(live.server.data, SECRET, TRACE)
    receive = receiver(ch)
    try:
        for kind, arg in attacks:
            if ch.closed:
                ch = TcpChannel.connect(live.server.data, SECRET, TRACE)
                receive = receiver(ch)
            if kind == "bad-request":
                header, frames = arg
                header["seq"] = live.fresh_seq()
                ch.write(json.dumps(header).encode(), frames)
                refused(receive, header, lambda c=ch: c.closed)
            elif kind in ("garbage-header", "random-header", "replay", "bad-rank"):
                if kind == "replay":  # a stale seq (the worker used 1 and 2 at its start): dropped
                    ch.write(push_header(arg[0]), [arg[1]])
                elif kind == "bad-rank":  # dropped, whatever the seq
                    ch.write(push_header(live.fresh_seq(), rank=arg), [os.urandom(4 * N)])
                else:
                    header, frames = arg
                    ch.write(header, frames)
                if ch.closed:
                    continue
                # whatever was dropped, the first answer is the one to this ping
                ping = live.fresh_seq()
                ch.write(
                    json.dumps(
                        {"v": 1, "op": wire.PULL, "seq": ping, "src": "worker 0", "b": {"rank": 0}}
                    ).encode()
                )
                got = answers(receive, lambda g, s=ping, c=ch: any(m.header.seq == s for m in g) or c.closed)
                if kind in ("replay", "bad-rank"):
                    assert [(m.header.op, m.header.seq) for m in got] == [(wire.REPLY, ping)], kind
                else:  # a random header may decode into a request that is refused: only errors come first
                    assert (got and got[-1].header.seq == ping) or ch.closed, [m.header for m in got]
                    assert all(m.header.op == wire.ERROR for m in got[:-1]), [m.header for m in got]
            elif kind == "huge":
                which, extra = arg
                header = push_header(live.fresh_seq())
                lens = [4 * N]
                hlen, count = len(header), 1
                if which == "header":
                    hlen = wire.MAX_HEADER_BYTES + extra
                elif which == "count":
                    count = MAX_FRAMES + extra
                elif which == "frame":
                    lens = [MAX_FRAME_BYTES + extra]
                else:  # more than twice what the entries hold plus 1 MiB
                    lens = [2 * 4 * N + (1 << 20) + extra]
                raw = _PREFIX.pack(hlen, count) + b"".join(_U64.pack(n) for n in lens[:count]) + header
                raw += tagged(ch, raw)
                send_until_closed(ch.sock, raw)
                assert closed_by_peer(ch.sock) == b"", f"not closed on a {which} out of bounds"
                ch.close()
            else:
                seq, data, cut = arg
                header = push_header(seq)  # a stale seq: even whole, it would be dropped
                raw = _PREFIX.pack(len(header), 1) + _U64.pack(len(data)) + header
                raw += tagged(ch, raw) + data
                if kind == "truncated":
                    send_until_closed(ch.sock, raw[: int(cut * (len(raw) - 1))])
                    ch.close()  # the server sees the message end half-way
                else:  # the same bytes twice: the second fails its tag (the counter moved on)
                    send_until_closed(ch.sock, raw + raw)
                    assert closed_by_peer(ch.sock) == b"", "a replayed message was not refused"
                    ch.close()
                    # and on a new connection (other session keys)
                    fresh = TcpChannel.connect(live.server.data, SECRET, TRACE)
                    send_until_closed(fresh.sock, raw)
                    assert closed_by_peer(fresh.sock) == b"", (
                        "a message from another connection was not refused"
                    )
                    fresh.close()
    finally:
        ch.close()
    live.check()


# -- a peer holding the secret: the ZeroMQ ROUTER and the same-host channel -----------------------


@FUZZ
@given(
    requests=st.lists(
        st.one_of(
            bad_requests().map(lambda r: ("request", r)),
            st.lists(st.binary(max_size=300), min_size=1, max_size=3).map(lambda f: ("frames", f)),
            random_headers.map(lambda h: ("frames", [json.dumps(h).encode()])),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_a_zeromq_peer_with_the_secret_cannot_break_the_server(
    live: LiveJob, requests: list[tuple[str, Any]]
) -> None:
    ctx = zmq.Context()
    sock = zmq_dealer(ctx, SECRET)
    sock.connect(live.server.endpoint)
    receive = zmq_receiver(sock)
    try:
        for kind, arg in requests:
            if kind == "request":
                header, frames = arg
                header["seq"] = live.fresh_seq()
                sock.send_multipart([json.dumps(header).encode(), *frames])
                refused(receive, header, lambda: False)
            else:
                sock.send_multipart(arg)
        ping = live.fresh_seq()
        sock.send_multipart(
            [json.dumps({"v": 1, "op": wire.PULL, "seq": ping, "src": "w", "b": {"rank": 0}}).encode()]
        )
        got = answers(receive, lambda g: any(m.header.seq == ping for m in g))
        assert any(m.header.seq == ping and m.header.op == wire.REPLY for m in got), [m.header for m in got]
    finally:
        sock.close(linger=0)
        ctx.term()
    live.check()


def _shm_names(job_id: str) -> st.SearchStrategy[str | None]:
    return st.sampled_from(
        [
            None,
            f"launchkit-{job_id}-w0-999-0",
            "launchkit-another-job-w0-1-0",
            f"launchkit-{job_id}-" + "x" * 190,
            "/etc/passwd",
        ]
    )


@FUZZ
@given(data=st.data())
def test_a_same_host_peer_with_the_secret_cannot_break_the_server(live: LiveJob, data: st.DataObject) -> None:
    ch = UnixChannel.connect(live.server.local, SECRET, TRACE)
    try:
        for _ in range(data.draw(st.integers(1, 3))):
            kind = data.draw(st.sampled_from(["request", "huge", "truncated", "garbage"]))
            if kind == "request":
                header, _frames = data.draw(bad_requests(_shm_names(live.kv.cfg.job_id)))
                header["seq"] = live.fresh_seq()
                raw = json.dumps(header).encode()
                ch.sock.sendall(struct.pack("<I", len(raw)) + raw)
                refused(receiver(ch), header, lambda c=ch: c.closed)
            elif kind == "huge":
                send_until_closed(
                    ch.sock, struct.pack("<I", data.draw(st.integers(wire.MAX_HEADER_BYTES + 1, 2**32 - 1)))
                )
                assert closed_by_peer(ch.sock) == b"", "a header length out of bounds was not refused"
                break
            elif kind == "truncated":
                raw = json.dumps({"v": 1, "op": wire.PULL, "seq": 1, "src": "w", "b": {"rank": 0}}).encode()
                send_until_closed(
                    ch.sock, (struct.pack("<I", len(raw)) + raw)[: data.draw(st.integers(1, len(raw)))]
                )
                break
            else:
                raw = data.draw(st.binary(max_size=400))
                send_until_closed(ch.sock, struct.pack("<I", len(raw)) + raw)
    finally:
        ch.close()
    live.check()


@pytest.mark.slow
def test_a_peer_with_the_secret_that_stops_mid_message_stalls_the_server_for_a_bounded_time(
    live: LiveJob,
) -> None:
    """Found by this suite: the server reads a data message whole before serving anything else, and
    waited for the rest of one that stopped half-way until the job ended; every worker's requests
    waited with it. Now a started message that gets no byte for ``tcp.STALL_S`` (10 s) closes
    that connection, and the others are served."""
    ch = TcpChannel.connect(live.server.data, SECRET, TRACE)
    header = push_header(0)
    raw = _PREFIX.pack(len(header), 1) + _U64.pack(4 * N) + header
    ch.sock.sendall(raw + tagged(ch, raw) + bytes(10))  # 10 bytes of the frame's 64, then nothing
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            live.check()
        except BaseException as exc:
            failures.append(exc)

    t = threading.Thread(target=worker, name="fuzz-worker")
    t.start()
    t.join(STALL_S + 20)
    stalled = t.is_alive()
    if stalled:
        ch.sock.close()  # let the server go on, so the job can end
        t.join(30)
    assert not stalled, "the server was still stalled by the half-sent message"
    assert not failures, failures
    assert closed_by_peer(ch.sock) == b"", "the stalled connection was not closed"
    ch.close()


# -- a peer holding the secret: the scheduler -------------------------------------------------------

NODES = ("worker 0", "server 0")  # a message in a registered node's name is that node's (trusted)


@FUZZ
@given(
    messages=st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "v": st.just(1),
                    "op": st.sampled_from(sorted(wire.OPS)),
                    "seq": st.integers(0, 2**31),
                    "src": st.text(max_size=10).filter(lambda s: s not in NODES),
                    "b": st.dictionaries(
                        st.sampled_from(
                            ["role", "rank", "host", "endpoint", "host_key", "pid", "node", "reason"]
                        ),
                        json_values,
                        max_size=8,
                    ),
                }
            ).map(lambda h: [json.dumps(h).encode()]),
            random_headers.map(lambda h: [json.dumps(h).encode()]),
            st.lists(st.binary(max_size=200), min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_a_zeromq_peer_with_the_secret_cannot_break_the_scheduler(
    live: LiveJob, messages: list[list[bytes]]
) -> None:
    """Anything not in a registered node's name: the scheduler drops it or refuses it (a late
    registration gets an ``error``), and a registration sent after it is refused in turn."""
    ctx = zmq.Context()
    sock = zmq_dealer(ctx, SECRET)
    sock.connect(f"tcp://127.0.0.1:{live.scheduler_port}")
    try:
        for m in messages:
            sock.send_multipart(m)
        reg = {
            "v": 1,
            "op": wire.REGISTER,
            "seq": 7,
            "src": "",
            "b": {"role": "worker", "rank": -1, "host": "x", "endpoint": "", "host_key": "x", "pid": 1},
        }
        sock.send_multipart([json.dumps(reg).encode()])
        receive = zmq_receiver(sock)
        got = answers(
            receive, lambda g: any(m.header.body.get("reason") == "unexpected registration" for m in g[-1:])
        )
        assert got and got[-1].header.op == wire.ERROR, [m.header for m in got]
        # what came before it: only refusals of registrations
        assert all(m.header.op == wire.ERROR for m in got), [m.header for m in got]
    finally:
        sock.close(linger=0)
        ctx.term()
    live.check()
