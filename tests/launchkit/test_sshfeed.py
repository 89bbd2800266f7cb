"""A host's remote output into the local pipes (``launchkit/backends/ssh/feed.py``), in one
process: one thread for every stream of a host, never held up by one pipe nobody reads."""

from __future__ import annotations

import threading
import time

from launchkit.backends.ssh import agent as agent_mod
from launchkit.backends.ssh.agent import HostAgent
from launchkit.core.spec import Host, LaunchSpec, Task
from tests.launchkit.plans import make_plan


def _agent(acks: list[tuple[int, str, int]], slow_s: float = 0.0) -> HostAgent:
    """A host whose acknowledgements land in ``acks`` (each send taking ``slow_s``: a busy channel)."""
    agent = HostAgent(Host("h1"), None, "job-f", hb_interval=1.0, hb_timeout=30.0, grace=1.0, interface=None)

    def send(msg: dict) -> None:
        time.sleep(slow_s)
        acks.extend((i, s, n) for i, s, n in msg["a"])

    agent.send = send  # type: ignore[method-assign]
    return agent


def _task(tmp_path) -> Task:
    spec = LaunchSpec(num_workers=2, num_servers=0, command=("true",), cwd=str(tmp_path))
    plan = make_plan(spec, job_id="job-f", secret="s", root_uri="127.0.0.1", root_port=1)
    return next(t for t in plan.tasks if t.role == "worker")


def test_one_thread_delivers_every_stream_of_a_host(tmp_path) -> None:
    """64 processes on a host, each with output on both streams: one delivering thread (two per
    process before: 2048 threads at 1024 processes), every byte delivered and acknowledged."""
    acks: list[tuple[int, str, int]] = []
    agent = _agent(acks)
    before = threading.active_count()
    procs = [agent_mod.RemoteProcess(agent, i, _task(tmp_path)) for i in range(64)]
    for p in procs:
        p.feed("o", f"out {p.index}\n".encode())
        p.feed("e", f"err {p.index}\n".encode())
    for p in procs:  # delivered while the streams are open
        out, err = f"out {p.index}\n".encode(), f"err {p.index}\n".encode()
        assert p.stdout.read(len(out)) == out and p.stderr.read(len(err)) == err
    assert threading.active_count() - before <= 1
    for p in procs:
        p.close_all()
        assert p.stdout.read() == p.stderr.read() == b""
    assert sorted(acks) == sorted(
        [(i, "o", len(f"out {i}\n")) for i in range(64)] + [(i, "e", len(f"err {i}\n")) for i in range(64)]
    )


def test_a_pipe_nobody_reads_holds_back_no_other_stream(tmp_path) -> None:
    """One process's stdout is not read (its pipe full, more waiting): another process's output
    on the same host still arrives, and what waits is delivered once that pipe is read; a reader
    that sees its end finds it acknowledged (CI read the end first once: the acks were sent after
    the round's closes; a slow channel here makes that order certain in the code before)."""
    acks: list[tuple[int, str, int]] = []
    agent = _agent(acks, slow_s=0.2)
    chatty, quiet = (agent_mod.RemoteProcess(agent, i, _task(tmp_path)) for i in (0, 1))
    flood = b"x" * (4 << 20)  # more than the widened pipe holds
    chatty.feed("o", flood)
    quiet.feed("o", b"still heard\n")
    quiet.close_all()
    assert quiet.stdout.read() == b"still heard\n"  # (blocked for good behind the flood otherwise)
    chatty.close_all()
    assert chatty.stdout.read() == flood
    assert (0, "o", len(flood)) in acks


def test_the_supervisor_learns_of_remote_ends_without_a_thread_per_process(tmp_path) -> None:
    """The ssh backend's ``watch``: a remote process's end reaches the caller from the thread that
    learnt it (``finish``), and at once for one already ended; no thread per process (the
    supervisor started one each, 1.4 ms apiece when the launch was busy: 1024 at 128 hosts x 8)."""
    from launchkit.backends.ssh.backend import SshBackend

    agent = _agent([])
    backend = SshBackend()
    ends: list[tuple[int, int]] = []
    before = threading.active_count()
    procs = [agent_mod.RemoteProcess(agent, i, _task(tmp_path)) for i in range(64)]
    procs[0].finish(7)  # ended before it is watched
    for p in procs:
        backend.watch(p, lambda rc, i=p.index: ends.append((i, rc)))
    assert threading.active_count() - before <= 1  # (the host's output feed)
    assert ends == [(0, 7)]
    for p in procs[1:]:
        p.finish(p.index)
        p.finish(99)  # a lost host after the exit: the first end counts, once
    assert sorted(ends) == [(0, 7)] + [(i, i) for i in range(1, 64)]
