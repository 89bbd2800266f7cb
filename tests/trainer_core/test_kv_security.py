"""Authentication: a peer without the job secret is refused; garbage on any port leaves nodes serving."""

from __future__ import annotations

import pytest

from tests.trainer_core.cluster import run_job, worker_script

INTRUDER = """
import socket, time, zmq
import logging
from trainer_core.errors import KVError
from trainer_core.transport import auth
from trainer_core.ps import protocol as wire
from trainer_core.transport.channel import Trace
from trainer_core.ps.protocol import SCHEMA
TRACE = Trace(logging.getLogger('intruder'), schema=SCHEMA)
from tests.trainer_core.probes import WITHIN, closed_by_peer, handshake_fails, send_until_closed

kv.init('w', np.zeros(16, np.float32))
ports = [int(s.endpoint.rsplit(':', 1)[1]) for s in kv.client.book.servers] + [int(os.environ['DMLC_PS_ROOT_PORT'])]
answered = []  # every probe that was not refused, or whose refusal was not observed


# a stream channel (same-host or data): garbage after the nonce makes the server close the
# connection without a byte of answer, and a client with another secret cannot connect
def refuses(connect, where, payloads, conn_class):
    for payload in payloads:
        c = connect()
        c.settimeout(WITHIN)
        assert len(c.recv(16)) == 16  # the nonce
        send_until_closed(c, payload)
        if closed_by_peer(c) != b'':
            answered.append((where, 'garbage', payload[:20].hex()))
        c.close()
    try:
        conn_class.connect(where, 'not-the-secret', TRACE)
        answered.append((where, 'wrong-secret'))
    except KVError as exc:
        assert 'secret' in str(exc) or 'closed' in str(exc), exc


# sending raw bytes on an authenticated data connection makes the server close it
def closed_on(conn, raw, where, what):
    send_until_closed(conn.sock, raw)
    if closed_by_peer(conn.sock) != b'':
        answered.append((where, what))
    conn.close()


def first_answer(receive_one):
    # the first message received within WITHIN (None: none came)
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline:
        msg = receive_one()
        if msg is not None:
            return msg
    return None


stalled = []  # data connections that never finish the handshake, open until the end
if kv.rank == 0:
    ctx = zmq.Context()
    wrong = auth.derive_keys('not-the-secret')
    for port in ports:
        for mode in ('wrong-secret', 'plain'):
            s = ctx.socket(zmq.DEALER)
            if mode == 'wrong-secret':
                s.curve_serverkey, s.curve_publickey, s.curve_secretkey = wrong.server_public, wrong.client_public, wrong.client_secret
            reg = wire.Header(op=wire.REGISTER, body={'role': 'worker', 'rank': 0, 'host': 'x', 'endpoint': '', 'host_key': 'x', 'pid': 1})
            pull = wire.Header(op=wire.PULL, seq=1, src='worker 0', entries=(wire.Entry('w', 0, 16, '<f4'),), body={'rank': 0})
            if not handshake_fails(s, f'tcp://127.0.0.1:{port}', [[wire.encode(reg)], [wire.encode(pull)]]) or s.poll(0):
                answered.append((port, mode))
            s.close(linger=0)
    ctx.term()
    # random bytes, a broken ZMTP greeting, HTTP, zeros on every ZeroMQ port: libzmq closes the connection
    for port in ports:
        for payload in (os.urandom(4096), b'\\xff' + bytes(8) + b'\\x7f' + os.urandom(200), b'GET / HTTP/1.0\\r\\n\\r\\n', b'\\x00' * 64):
            c = socket.create_connection(('127.0.0.1', port))
            send_until_closed(c, payload)
            if closed_by_peer(c) is None:
                answered.append((port, 'zmtp-garbage', payload[:20].hex()))
            c.close()
    # the servers' same-host channels: garbage, a wrong handshake, a wrong-secret client
    from trainer_core.transport.unix import UnixChannel
    for s in kv.client.book.servers:
        if not s.local:
            continue
        def unix(name=s.local):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect('\\0' + name)
            return c

        refuses(unix, s.local, (os.urandom(40), bytes(32) + b'{"v":1,"op":"pull"}', b'\\xff' * 100000), UnixChannel)
    # the TCP data channels: garbage, a wrong-secret client, a client that never finishes the
    # handshake (kept open to the end: the server serves everyone else meanwhile), and a client holding
    # the secret that sends a malformed header, a bad rank and a replayed sequence number (dropped:
    # the first answer on that connection is the one to a later ping) and a broken framing (closed)
    import struct
    from trainer_core.transport.tcp import TcpChannel
    pull = wire.encode(wire.Header(op=wire.PULL, seq=1, src='worker 0', entries=(wire.Entry('w', 0, 16, '<f4'),), body={'rank': 0}))
    for s in kv.client.book.servers:
        if not s.data:
            continue
        host, port = s.data.removeprefix('tcp://').rsplit(':', 1)
        refuses(lambda: socket.create_connection((host, int(port))), s.data,
                (os.urandom(5000), bytes(32) + pull, b'GET / HTTP/1.1\\r\\nHost: example.com\\r\\n\\r\\n'), TcpChannel)
        stalled.append(socket.create_connection((host, int(port))))
        good = TcpChannel.connect(s.data, os.environ['LAUNCHKIT_JOB_SECRET'], TRACE)
        good.write(b'{not json')
        good.write(b'{"v":1,"op":"pull","seq":5,"src":"worker 0","b":{"rank":99}}')
        if os.environ['PS_SHM'] == '0':  # the worker used this channel: seq 1 is a replay
            good.write(pull)
        # the ping takes a sequence number from this worker's own counter, so it is fresh and the
        # worker's later requests stay fresh too
        ping = next(kv.client._seq)
        good.write(wire.encode(wire.Header(op=wire.PULL, seq=ping, src='worker 0', body={'rank': 0})))
        def one(good=good):
            got = []
            if good.wait(0.1):
                good.receive(got.append)
            return got[0] if got else None
        first = first_answer(one)
        if first is None or first.header.op != wire.REPLY or first.header.seq != ping:
            answered.append((s.data, 'data', None if first is None else first.header.op))
        closed_on(good, struct.pack('<II', 1 << 30, 0), s.data, 'framing')  # a header length out of bounds
        # a well-formed, correctly tagged push that declares a 256 GiB frame for a 16-element key:
        # closed before anything is allocated
        huge = TcpChannel.connect(s.data, os.environ['LAUNCHKIT_JOB_SECRET'], TRACE)
        hdr = wire.encode(wire.Header(op=wire.PUSH, seq=10**6, src='worker 0', entries=(wire.Entry('w', 0, 16, '<f4'),), body={'rank': 0}))
        head = struct.pack('<II', len(hdr), 1) + struct.pack('<Q', 1 << 38) + hdr
        closed_on(huge, head + huge._tag(huge._tag_out, 0, head), s.data, 'huge')
    # a peer holding the secret, sending malformed frames to every server and to the scheduler; each
    # then still answers a sentinel (a server an empty pull, the started scheduler a registration)
    ctx = zmq.Context()
    right = auth.derive_keys(os.environ['LAUNCHKIT_JOB_SECRET'])
    for port in ports:
        srv = ctx.socket(zmq.DEALER)
        srv.curve_serverkey, srv.curve_publickey, srv.curve_secretkey = right.server_public, right.client_public, right.client_secret
        srv.connect(f'tcp://127.0.0.1:{port}')
        srv.send_multipart([b'{not json'])
        srv.send_multipart([b'{"v":1,"op":"push","seq":9,"src":"worker 0","b":{"rank":99}}'])
        srv.send_multipart([b'{"v":1,"op":"register","b":{"role":"worker","rank":"x"}}'])
        srv.send_multipart([wire.encode(wire.Header(op=wire.PUSH, seq=10, src='w', entries=(wire.Entry('w', 0, 16, '<f4'),), body={'rank': 0}))])
        srv.send_multipart([wire.encode(wire.Header(op=wire.PUSH, seq=11, src='w', entries=(wire.Entry('w', 0, 16, '<f4', 'launchkit-other-job-1'),), body={'rank': 0}))])
        srv.send_multipart([wire.encode(wire.Header(op=wire.PULL, seq=12, src='w', entries=(wire.Entry('w', 0, 1 << 30, '<f4'),), body={'rank': 0}))])
        scheduler = port == int(os.environ['DMLC_PS_ROOT_PORT'])
        if scheduler:
            sentinel = wire.Header(op=wire.REGISTER, seq=13, body={'role': 'worker', 'rank': -1, 'host': 'x', 'endpoint': '', 'host_key': 'x', 'pid': 1})
        else:
            sentinel = wire.Header(op=wire.PULL, seq=13, src='w', body={'rank': 0})
        srv.send_multipart([wire.encode(sentinel)])
        seen = []
        deadline = time.monotonic() + WITHIN
        while time.monotonic() < deadline and not (len(seen) >= 2 if scheduler else any(h.seq == 13 for h in seen)):
            if srv.poll(100):
                seen.append(wire.decode(srv.recv_multipart()[0]))
        ops = [(h.op, h.seq) for h in seen]
        # the scheduler refuses both registrations ('unexpected registration': the job runs)
        if (ops.count((wire.ERROR, 0)) < 2) if scheduler else ((wire.REPLY, 13) not in ops):
            answered.append((port, 'no sentinel', ops))
        srv.close(linger=0)
    ctx.term()
kv.barrier()
out = np.empty(16, np.float32)
for step in range(3):
    kv.pushpull('w', np.full(16, kv.rank + 1, np.float32), out)
emit(answered=answered, v=out.tolist())
for c in stalled:
    c.close()
"""


@pytest.mark.parametrize("shm", ["1", "0"])
def test_intruders_are_refused_and_garbage_is_survived(shm: str) -> None:
    job = run_job(worker_script(INTRUDER), 2, 2, {"PS_SHM": shm})
    assert all(code == 0 for code in job.codes().values()), job.outputs()
    for w in job.workers:
        (res,) = w.results()
        assert res["answered"] == []
        assert res["v"] == [3.0] * 16
    servers = job.of("server")[0].output() + job.of("server")[1].output()
    assert "failed the handshake" in servers and "dropped a malformed message" in servers
    assert "declares 274877906944 bytes of frames for entries of 64" in servers
    if shm == "0":  # the worker's own data channels were in use: seq 1 was a replay
        assert "replayed" in servers


def test_wrong_secret_worker_cannot_join() -> None:
    """A node started with another secret never registers: the job does not start (start timeout)."""
    job = run_job(
        worker_script("emit(rank=kv.rank)"),
        1,
        1,
        {"PS_START_TIMEOUT": "3"},
        secret="right-secret",
        timeout=20,
        worker_secret="wrong-secret",
    )
    assert job.workers[0].results() == [], job.outputs()
    assert job.of("scheduler")[0].popen.returncode == 1, job.outputs()
    assert "registered within" in job.of("scheduler")[0].output(), job.outputs()
