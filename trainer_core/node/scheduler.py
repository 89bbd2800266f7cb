"""The scheduler: registers nodes, assigns ranks, hands out the book (servers and workers, with
what each listens on; the servers only to a node that asked for no more), runs barriers, watches heartbeats and tells every node when
the job ends (normally or by an abort). It knows nothing of what the nodes compute: a
parameter-server job runs it with its protocol's ``schema`` (``ps/scheduler.py``, ``python -m
trainer_core.ps.scheduler``, or importing trainer_core with ``DMLC_ROLE=scheduler``); a job
without servers runs the same, as a thread of worker 0's process (``rootserver.py``). It binds ``DMLC_PS_ROOT_PORT`` with a plain ZeroMQ tcp bind (on
``DMLC_INTERFACE``'s address when given). Exit code 0 when every worker finished, 1 on abort.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from dmlc_env.ending import say_peer_failed
from trainer_core.config import NodeConfig
from trainer_core.errors import WireError
from trainer_core.log import get_logger
from trainer_core.node import book, protocol
from trainer_core.node.agree import MAX_VALUE, Meeting, Waiter, out_of_step
from trainer_core.transport import wire
from trainer_core.transport.channel import Peer, Received, Source
from trainer_core.transport.control import Transport
from trainer_core.transport.host import interface_address


@dataclass
class NodeRecord:
    """One registered node, as the scheduler sees it."""

    role: str
    rank_hint: int
    host: str
    endpoint: str
    host_key: str
    pid: int
    local: str
    data: str
    peer: Peer  # where the registration came from (answered with the book)
    needs: str = book.ALL  # the part of the book it asked for (``book.NEEDS``)
    name: str = ""
    rank: int = -1
    ctl: Peer | None = None  # the node's heartbeat channel (aborts and terminate go there)
    last_seen: float = 0.0
    finished: bool = False

    def describe(self) -> str:
        return f"{self.name} (host {self.host}, pid {self.pid})"

    def listens(self) -> dict[str, str]:
        """Its entry in the book: where the other nodes reach it."""
        return {"endpoint": self.endpoint, "host_key": self.host_key, "local": self.local, "data": self.data}


class Scheduler:
    """One job's scheduler; ``run()`` returns the exit code. Every message goes to ``handle``, which
    answers on its ``reply``; ``router`` replaces the bound ROUTER (in-process tests). ``schema``: the
    protocols the job's nodes speak (the scheduler answers its own kinds and ignores the rest)."""

    def __init__(
        self,
        cfg: NodeConfig,
        log: logging.Logger | None = None,
        router: Source | None = None,
        schema: wire.Schema = protocol.SCHEMA,
    ) -> None:
        self.cfg = cfg
        self.log = log or get_logger(cfg.verbose)
        self.transport: Transport | None = None
        self.endpoint = ""
        if router is None:
            self.transport = Transport(cfg.secret, self.log, cfg.verbose, schema)
            try:
                host = interface_address(cfg.env.interface) if cfg.env.interface else "*"
                router, self.endpoint = self.transport.bind_router(host, cfg.env.root_port)
            except BaseException:  # e.g. the port is taken: no context (and its threads) left behind
                self.transport.close()
                self.transport = None
                raise
        self.router = router
        self.expected = {"server": cfg.env.num_servers, "worker": cfg.env.num_workers}
        self.pending: list[NodeRecord] = []
        self.registered = dict.fromkeys(self.expected, 0)  # per role (not a scan of pending each time)
        self.nodes: dict[str, NodeRecord] = {}
        self.meeting = Meeting(cfg.env.num_workers)  # the workers in a barrier or an agreement
        self.finish_waiters: list[tuple[Peer, int]] = []
        self.exit_code: int | None = None
        #: set from another thread (worker 0's, ``rootserver.RootServer``): ``run`` returns soon
        self.stopping = threading.Event()

    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self.transport is not None:
                self.transport.close(linger_ms=1000)

    def _run(self) -> int:
        cfg = self.cfg
        started = time.monotonic()
        check_every = min(0.2, cfg.heartbeat_interval) if cfg.liveness_on else 0.2
        next_check = 0.0  # the heartbeat scan (every node) runs at most every check_every
        while not self.stopping.is_set():
            if self.router.wait(check_every):
                self.router.receive(self.handle)
                if self.exit_code is not None:
                    return self.exit_code
            now = time.monotonic()
            if not self.nodes and now - started > cfg.start_timeout:
                missing = missing_nodes(self.pending, self.expected)
                return self._abort(
                    f"only {len(self.pending)} of {sum(self.expected.values())} nodes registered within "
                    f"{cfg.start_timeout:g} s (PS_START_TIMEOUT); missing: " + ", ".join(missing),
                    missing[0] if len(missing) == 1 else None,  # the one node at fault, when it is one
                    [r.peer for r in self.pending],
                )
            if self.nodes and cfg.liveness_on and now >= next_check:
                next_check = now + check_every
                for rec in self.nodes.values():
                    if now - rec.last_seen > cfg.heartbeat_timeout:
                        return self._abort(
                            f"{rec.describe()} sent no heartbeat for {cfg.heartbeat_timeout:g} s: "
                            "it died or stopped",
                            rec.name,
                        )
        return self.exit_code if self.exit_code is not None else 0

    def handle(self, msg: Received) -> None:
        """Serve one message; sets ``exit_code`` when it ends the job."""
        if self.exit_code is not None:
            return  # the job is over: what else was waiting is moot
        try:
            self.exit_code = self._handle(msg)
        except (WireError, TypeError, ValueError) as exc:
            self.log.warning("dropped a bad %s message: %s", msg.header.op, exc)

    def _handle(self, msg: Received) -> int | None:
        h, peer = msg.header, msg.reply
        if h.op == protocol.REGISTER:
            return self._register(h, peer)
        rec = self.nodes.get(h.src)
        if rec is None:
            return None  # not a registered node's message; ignore
        rec.last_seen = time.monotonic()
        if h.op == protocol.HEARTBEAT:
            rec.ctl = peer
            peer.send(wire.Header(op=protocol.HEARTBEAT_ACK))
        elif h.op == protocol.ABORT:
            reason = h.body.get("reason")
            culprit = self.nodes.get(str(h.body.get("node")), rec)
            text = reason if isinstance(reason, str) else "?"
            if culprit is rec:
                return self._abort(f"{rec.describe()} failed: {text}", rec.name)
            return self._abort(f"{culprit.describe()}: {text} (seen by {rec.name})", culprit.name)
        elif h.op in (protocol.BARRIER, protocol.AGREE) and rec.role == "worker":
            self._meet(rec, h, peer)
        elif h.op == protocol.FINISH and rec.role == "worker" and not rec.finished:
            rec.finished = True
            self.finish_waiters.append((peer, h.seq))
            if len(self.finish_waiters) == self.expected["worker"]:
                return self._finish()
        waiting = self.meeting.waiting
        if waiting and len(waiting) + len(self.finish_waiters) == self.expected["worker"]:
            done = sorted(r.name for r in self.nodes.values() if r.finished)
            finished = sorted(r.rank for r in self.nodes.values() if r.finished and r.role == "worker")
            return self._abort(
                f"{', '.join(done)} finished while the other workers wait in a barrier or an agreement: "
                + out_of_step(list(waiting.values()), finished),
                done[0],
            )
        return None

    def _meet(self, rec: NodeRecord, h: wire.Header, peer: Peer) -> None:
        """A worker enters a barrier or an agreement (``node/agree.py``); when every worker is in
        one, answer them all: the agreed value, or an error naming what differs or who is where."""
        label = h.body.get("at", "barrier()")
        if not isinstance(label, str) or not 0 < len(label) <= 64:
            raise WireError("at must be a short string")
        value = h.body.get("value")
        if h.op == protocol.BARRIER or value is None:
            value = None
        elif not isinstance(value, str) or len(value) > MAX_VALUE:
            raise WireError(f"value must be a JSON text of at most {MAX_VALUE} bytes")
        self.meeting.add(Waiter(rec.rank, label, h.op, value, peer, h.seq))
        if len(self.meeting.waiting) < self.expected["worker"]:
            return
        body, waiters = self.meeting.outcome()
        if "error" in body:
            self.log.error("trainer_core scheduler: %s", body["error"])
        for w in waiters:
            op = protocol.BARRIER_DONE if w.op == protocol.BARRIER else protocol.AGREED
            w.peer.send(wire.Header(op=op, seq=w.seq, body=body))

    def _register(self, h: wire.Header, peer: Peer) -> int | None:
        role = wire.body_str(h, "role")
        if role not in self.expected or self.nodes:
            peer.send(wire.Header(op=protocol.ERROR, body={"reason": "unexpected registration"}))
            return None
        rec = NodeRecord(
            role=role,
            rank_hint=wire.body_int(h, "rank"),
            host=wire.body_str(h, "host"),
            endpoint=wire.body_str(h, "endpoint"),
            host_key=wire.body_str(h, "host_key"),
            pid=wire.body_int(h, "pid"),
            local=wire.body_str(h, "local", ""),
            data=wire.body_str(h, "data", ""),
            peer=peer,
            needs=wire.body_str(h, "book", book.ALL),
        )
        if rec.needs not in book.NEEDS:
            reason = f"book must be one of {', '.join(book.NEEDS)}, not {rec.needs!r}"
            peer.send(wire.Header(op=protocol.ERROR, body={"reason": reason}))
            return None
        if self.registered[role] >= self.expected[role]:
            peer.send(
                wire.Header(op=protocol.ERROR, body={"reason": f"more than {self.expected[role]} {role}s"})
            )
            return None
        self.pending.append(rec)
        self.registered[role] += 1
        if self.cfg.verbose:
            self.log.info("registered a %s on %s (pid %d)", role, rec.host, rec.pid)
        if len(self.pending) == sum(self.expected.values()):
            return self._start()
        return None

    def _start(self) -> int | None:
        for role, count in self.expected.items():
            recs = [r for r in self.pending if r.role == role]
            error = assign_ranks(recs, count)
            if error:
                return self._abort(
                    f"cannot assign {role} ranks: {error}", None, [r.peer for r in self.pending]
                )
            for r in recs:
                r.name = f"{role} {r.rank}"
        now = time.monotonic()
        servers = sorted((r for r in self.pending if r.role == "server"), key=lambda r: r.rank)
        workers = sorted((r for r in self.pending if r.role == "worker"), key=lambda r: r.rank)
        counts = {"num_workers": self.expected["worker"], "num_servers": self.expected["server"]}
        # each part of the book once, as its frame: the same bytes for every node that asked for it
        # (in the header, each node's copy was encoded again, O(n^2) in all, and past ~6000 nodes
        # over MAX_HEADER_BYTES); the workers' list only to the nodes that reach workers
        parts: dict[str, bytes] = {}
        for r in self.pending:
            r.last_seen = now
            self.nodes[r.name] = r
            listed = parts.get(r.needs)
            if listed is None:
                lists = {"servers": [x.listens() for x in servers]}
                if r.needs == book.ALL:
                    lists["workers"] = [x.listens() for x in workers]
                listed = parts[r.needs] = json.dumps(lists, separators=(",", ":")).encode()
            body = {**counts, "role": r.role, "rank": r.rank, "name": r.name}
            r.peer.send(wire.Header(op=protocol.BOOK, body=body), [listed])
        if self.cfg.verbose:
            self.log.info("job started: %d servers, %d workers", len(servers), self.expected["worker"])
        return None

    def _finish(self) -> int:
        for rec in self.nodes.values():
            if rec.role == "server" and rec.ctl is not None:
                rec.ctl.send(wire.Header(op=protocol.TERMINATE))
        for who, seq in self.finish_waiters:
            who.send(wire.Header(op=protocol.FINISHED, seq=seq))
        if self.cfg.verbose:
            self.log.info("every worker finished: job done")
        return 0

    def _abort(self, reason: str, node: str | None, extra: list[Peer] | None = None) -> int:
        self.log.error("trainer_core scheduler: aborting the job: %s", reason)
        say_peer_failed(node)  # for the launcher: the scheduler ends because of ``node``
        body = {"reason": reason, "node": node}
        targets = [r.ctl for r in self.nodes.values() if r.ctl is not None and r.name != node]
        for peer in targets + (extra or []):
            peer.send(wire.Header(op=protocol.ABORT, body=body))
        return 1


def missing_nodes(pending: list[NodeRecord], expected: dict[str, int]) -> list[str]:
    """The nodes that have not registered: by role and rank where every registered node of that
    role named its rank (launchkit's ``LAUNCHKIT_ROLE_RANK``), else as a count (``1 of 2 workers``)."""
    missing: list[str] = []
    for role, count in expected.items():
        recs = [r for r in pending if r.role == role]
        if len(recs) >= count:
            continue
        hints = {r.rank_hint for r in recs}
        if all(0 <= h < count for h in hints) and len(hints) == len(recs):
            missing += [f"{role} {i}" for i in range(count) if i not in hints]
        else:
            missing.append(f"{count - len(recs)} of {count} {role}s")
    return missing


def assign_ranks(recs: list[NodeRecord], count: int) -> str | None:
    """Give each record a rank in ``0..count-1``: its hint when set (the launcher's rank), else the
    lowest free rank in registration order. Returns an error message for bad or duplicate hints."""
    taken: set[int] = set()
    for r in recs:
        if r.rank_hint >= 0:
            if r.rank_hint >= count or r.rank_hint in taken:
                return f"rank {r.rank_hint} of pid {r.pid} on {r.host} is out of range or taken twice"
            r.rank = r.rank_hint
            taken.add(r.rank)
    free = (i for i in range(count) if i not in taken)
    for r in recs:
        if r.rank_hint < 0:
            r.rank = next(free)
    return None
