"""The scheduler: registers nodes, assigns ranks, hands out the book (servers and workers, with
what each listens on; the servers only to a node that asked for no more), runs barriers, watches heartbeats and tells every node when
the job ends (normally or by an abort). In an elastic job (``LAUNCHKIT_ELASTIC=MIN:MAX``) it also
admits a worker that registers after the start (up to MAX) and drops one whose heartbeats stop or
that another node reports gone (down to MIN; below, the job aborts naming it): each change is the
next epoch's book (``node/membership.py``), sent to every node, and barriers and finish count the
members of the epoch. It knows nothing of what the nodes compute: a
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

from dmlc_env.ending import say_peer_failed
from trainer_core.config import NodeConfig
from trainer_core.errors import WireError
from trainer_core.log import get_logger
from trainer_core.node import book, protocol
from trainer_core.node.agree import MAX_VALUE, Meeting, Waiter, out_of_step
from trainer_core.node.membership import Lobby, Roster, below_min, describe, newcomer_name
from trainer_core.node.records import NodeRecord, assign_ranks, epoch_book, missing_nodes, record_of
from trainer_core.transport import wire
from trainer_core.transport.channel import Peer, Received, Source
from trainer_core.transport.control import Transport
from trainer_core.transport.host import interface_address


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
        self.finish_waiters: list[tuple[Peer, int, str]] = []  # (reply to, seq, worker's name)
        #: (MIN, MAX) workers of an elastic job, None for a fixed one; its workers by epoch
        self.elastic = cfg.env.elastic
        self.roster = Roster(0, ())
        self.dropped: dict[str, str] = {}  # the workers an elastic job dropped, with why
        #: workers that registered at MAX, each waiting for a member to leave for ``_lobby_s`` at
        #: most (a dead member is dropped within the heartbeat bound)
        self.lobby: Lobby[NodeRecord] = Lobby()
        self._lobby_s = cfg.heartbeat_timeout + 2 * cfg.heartbeat_interval
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
            # (an elastic job's workers may never join: a torch.distributed script's do not, and
            # launchkit ends this process once they have all ended; docs/elastic.md)
            waits = self.elastic is not None and not self.pending
            if not self.nodes and not waits and now - started > cfg.start_timeout:
                missing = missing_nodes(self.pending, self.expected)
                return self._abort(
                    f"only {len(self.pending)} of {sum(self.expected.values())} nodes registered within "
                    f"{cfg.start_timeout:g} s (PS_START_TIMEOUT); missing: " + ", ".join(missing),
                    missing[0] if len(missing) == 1 else None,  # the one node at fault, when it is one
                    [r.peer for r in self.pending],
                )
            if self.nodes and cfg.liveness_on and now >= next_check:
                next_check = now + check_every
                self.exit_code = self.scan(now)
                if self.exit_code is not None:
                    return self.exit_code
                if self.lobby:
                    self._lobby_moves(now)
        return self.exit_code if self.exit_code is not None else 0

    def scan(self, now: float) -> int | None:
        """The heartbeat scan: a node silent for longer than the timeout ends the job (an elastic
        job's worker is dropped instead); returns the exit code when the job ends."""
        timeout = self.cfg.heartbeat_timeout
        for rec in list(self.nodes.values()):
            if now - rec.last_seen > timeout:
                why = f"sent no heartbeat for {timeout:g} s: it died or stopped"
                if not self._elastic_worker(rec):
                    return self._abort(f"{rec.describe()} {why}", rec.name)
                code = self._drop(rec, why)
                if code is not None:
                    return code
        return None

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
            if h.src in self.dropped and h.op == protocol.HEARTBEAT:  # alive after all: it must end
                body = {"reason": f"dropped from the elastic job: {self.dropped[h.src]}", "node": h.src}
                peer.send(wire.Header(op=protocol.ABORT, body=body))
            return None  # not a registered node's message; ignore
        rec.last_seen = time.monotonic()
        if h.op == protocol.HEARTBEAT:
            rec.ctl = peer
            peer.send(wire.Header(op=protocol.HEARTBEAT_ACK))
            if rec.epoch < self.roster.epoch:  # a book it has not had (its channel was not known yet)
                self._send_book(rec, peer)
        elif h.op == protocol.ABORT:
            reason = h.body.get("reason")
            named = str(h.body.get("node"))
            if named in self.dropped:
                return None  # an elastic job's worker that another node reported gone first
            culprit = self.nodes.get(named, rec)
            text = reason if isinstance(reason, str) else "?"
            if self._elastic_worker(culprit):  # a worker left an elastic job: the others go on
                seen = "" if culprit is rec else f" (seen by {rec.name})"
                return self._drop(culprit, f"{text}{seen}")
            if culprit is rec:
                return self._abort(f"{rec.describe()} failed: {text}", rec.name)
            return self._abort(f"{culprit.describe()}: {text} (seen by {rec.name})", culprit.name)
        elif h.op in (protocol.BARRIER, protocol.AGREE) and rec.role == "worker":
            self._meet(rec, h, peer)
        elif h.op == protocol.FINISH and rec.role == "worker" and not rec.finished:
            rec.finished = True
            self.finish_waiters.append((peer, h.seq, rec.name))
        return self._settle()

    def _settle(self) -> int | None:
        """Whether every worker has finished (the job ends), or some finished while the others wait
        in a barrier (it never completes: the job aborts)."""
        if self.finish_waiters and len(self.finish_waiters) == self._workers():
            return self._finish()
        waiting = self.meeting.waiting
        if waiting and len(waiting) + len(self.finish_waiters) == self._workers():
            done = sorted(r.name for r in self.nodes.values() if r.finished)
            finished = sorted(r.rank for r in self.nodes.values() if r.finished and r.role == "worker")
            # the workers that finished did their part: their finish is answered (they end with 0),
            # and the launcher names the first, as the others' lines say they waited for it
            for who, seq, _ in self.finish_waiters:
                who.send(wire.Header(op=protocol.FINISHED, seq=seq))
            self.finish_waiters = []
            return self._abort(
                f"{', '.join(done)} finished while the other workers wait in a barrier or an agreement: "
                + out_of_step(list(waiting.values()), finished),
                done[0],
                spare=set(done),
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
        self._answer_meeting()

    def _answer_meeting(self) -> None:
        """Answer the meeting when every worker is in it."""
        if not self.meeting.waiting or len(self.meeting.waiting) < self._workers():
            return
        body, waiters = self.meeting.outcome()
        if self.elastic is not None:  # the epoch it completed in: a worker waits for that book
            body["epoch"] = self.roster.epoch
        if "error" in body:
            self.log.error("trainer_core scheduler: %s", body["error"])
        for w in waiters:
            op = protocol.BARRIER_DONE if w.op == protocol.BARRIER else protocol.AGREED
            w.peer.send(wire.Header(op=op, seq=w.seq, body=body))

    def _register(self, h: wire.Header, peer: Peer) -> int | None:
        role = wire.body_str(h, "role")
        if self.nodes and self.elastic is not None and role == "worker":
            return self._admit(h, peer)
        if role not in self.expected or self.nodes:
            peer.send(wire.Header(op=protocol.ERROR, body={"reason": "unexpected registration"}))
            return None
        rec = record_of(h, peer)
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
        self.roster = Roster(0, tuple(r.name for r in workers))
        for r in self.pending:
            r.last_seen = now
            r.epoch = 0
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

    # -- an elastic job ------------------------------------------------------------------------

    def _workers(self) -> int:
        """The workers that barriers and finish wait for: the members of the current epoch."""
        return self.roster.size if self.elastic is not None else self.expected["worker"]

    def _elastic_worker(self, rec: NodeRecord) -> bool:
        return self.elastic is not None and rec.role == "worker" and rec.name in self.roster.workers

    def _admit(self, h: wire.Header, peer: Peer) -> int | None:
        """A worker registers after the start of an elastic job: the next epoch has it last. One of
        a later restart of the workers (launchkit's restart mode starts the whole group again once
        every old worker ended) first drops the members of the earlier ones. At MAX it waits in
        ``lobby`` for a member to leave (a dead one is dropped within the heartbeat bound)."""
        assert self.elastic is not None
        rec = record_of(h, peer)
        if rec.needs not in book.NEEDS:
            reason = f"book must be one of {', '.join(book.NEEDS)}, not {rec.needs!r}"
            peer.send(wire.Header(op=protocol.ERROR, body={"reason": reason}))
            return None
        for name in [n for n in self.roster.workers if self.nodes[n].restarts < rec.restarts]:
            why = f"was stopped for restart {rec.restarts} of the workers (a worker of it registered)"
            code = self._drop(self.nodes[name], why, restarted=True)
            if code is not None:
                return code
        if self.roster.size < self.elastic[1]:
            self._enter(rec)
        elif self.cfg.liveness_on:
            self.lobby.wait(rec, time.monotonic() + self._lobby_s)
        else:
            self._refuse_above_max(rec, "")
        return None

    def _enter(self, rec: NodeRecord) -> None:
        rec.name = newcomer_name(rec.rank_hint, set(self.nodes) | set(self.dropped))
        rec.last_seen = time.monotonic()
        self.nodes[rec.name] = rec
        self._change(self.roster.admit(rec.name))
        self._send_book(rec, rec.peer)  # its registration's answer; the others' go to their heartbeats

    def _refuse_above_max(self, rec: NodeRecord, waited: str) -> None:
        reason = f"the elastic job has its maximum of {self.roster.size} workers already{waited}"
        rec.peer.send(wire.Header(op=protocol.ERROR, body={"reason": reason}))

    def _lobby_moves(self, now: float) -> None:
        """Workers waiting at MAX: admitted while there is room, refused once their wait is over."""
        assert self.elastic is not None
        while self.lobby and self.roster.size < self.elastic[1]:
            self._enter(self.lobby.next())
        for rec in self.lobby.expired(now):
            self._refuse_above_max(rec, f" (and none left within {self._lobby_s:g} s)")

    def _drop(self, rec: NodeRecord, why: str, restarted: bool = False) -> int | None:
        """A worker of an elastic job died or left: the next epoch goes on without it, unless fewer
        than MIN workers would remain (the job aborts, naming it); ``restarted``: its whole group
        was stopped for a restart and the next one is coming (the launcher counted MIN)."""
        assert self.elastic is not None
        left = self.roster.size - 1
        if below_min(left, self.elastic) and not restarted:
            return self._abort(
                f"{rec.describe()} {why}; {left} workers remain, fewer than the elastic job's "
                f"minimum of {self.elastic[0]}",
                rec.name,
            )
        self.log.warning("trainer_core scheduler: %s %s: the job goes on without it", rec.describe(), why)
        self.dropped[rec.name] = why
        del self.nodes[rec.name]
        if rec.ctl is not None:  # if it is alive after all, it must end
            body = {"reason": f"dropped from the elastic job: {why}", "node": rec.name}
            rec.ctl.send(wire.Header(op=protocol.ABORT, body=body))
        self.finish_waiters = [w for w in self.finish_waiters if w[2] != rec.name]
        self._change(self.roster.drop(rec.name))
        self._answer_meeting()
        code = self._settle()
        if code is None and not restarted:
            self._lobby_moves(time.monotonic())
        return code

    def _change(self, roster: Roster) -> None:
        """Make ``roster`` the current epoch: dense ranks again, and its book to every node."""
        renumbered = roster.renumbered(self.roster)
        self.meeting.waiting = {renumbered[r]: w for r, w in self.meeting.waiting.items() if r in renumbered}
        for new, w in self.meeting.waiting.items():
            w.rank = new
        self.roster = roster
        for rank, name in enumerate(roster.workers):
            self.nodes[name].rank = rank
        self.log.info("trainer_core scheduler: %s", describe(roster))
        for rec in self.nodes.values():
            if rec.ctl is not None:
                self._send_book(rec, rec.ctl)

    def _send_book(self, rec: NodeRecord, to: Peer) -> None:
        """Rec's book of the current epoch, on ``to``."""
        servers = sorted((r for r in self.nodes.values() if r.role == "server"), key=lambda r: r.rank)
        workers = [self.nodes[n] for n in self.roster.workers]
        header, frame = epoch_book(rec, self.roster, servers, workers, self.expected["server"])
        rec.epoch = self.roster.epoch
        to.send(header, [frame])

    def _finish(self) -> int:
        for rec in self.nodes.values():
            if rec.role == "server" and rec.ctl is not None:
                rec.ctl.send(wire.Header(op=protocol.TERMINATE))
        for who, seq, _ in self.finish_waiters:
            who.send(wire.Header(op=protocol.FINISHED, seq=seq))
        if self.cfg.verbose:
            self.log.info("every worker finished: job done")
        return 0

    def _abort(
        self, reason: str, node: str | None, extra: list[Peer] | None = None, spare: set[str] | None = None
    ) -> int:
        """End the job for every node but ``node`` and those ``spare`` names (their finish was
        answered), naming ``node``; exit code 1."""
        self.log.error("trainer_core scheduler: aborting the job: %s", reason)
        say_peer_failed(node)  # for the launcher: the scheduler ends because of ``node``
        body = {"reason": reason, "node": node}
        skip = {node} | (spare or set())
        targets = [r.ctl for r in self.nodes.values() if r.ctl is not None and r.name not in skip]
        for peer in targets + (extra or []):
            peer.send(wire.Header(op=protocol.ABORT, body=body))
        return 1
