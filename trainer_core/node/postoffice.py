"""One node's place in its job (ps-lite's Postoffice): the book, the scheduler, liveness, the end.

``Postoffice.join`` registers with the scheduler (with what this node listens on: a worker's
same-host and TCP data listeners, so that other workers can reach it), waits for the book of all
nodes and starts the heartbeats. Then: ``barrier`` and ``finish`` (bounded by liveness, never by
a wall clock), ``abort`` (ends the job for every node, naming the culprit), ``check``/``failure``
(the job's failure as this node knows it), ``peer_lost``/``peer_broke`` (the failure policy when
a channel to another node closes or breaks its protocol: wait ``grace_s`` for the scheduler to
name the cause, else blame that node), the books of an elastic job's epochs (``subscribe``: each
customer, e.g. the collective links, is told of a new book; ``wait_book``, ``changed_since``:
the ``MembershipChanged`` an operation begun in an earlier epoch fails with), an exit watchdog (a failure the user's code does not meet
in a call soon ends the process), and ``requests`` (``node.inflight``: numbering and tracking
requests). What runs above it (``ps``, ``collective``) adds its own channels and messages.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from dmlc_env.ending import say_peer_failed, say_waited
from trainer_core.config import NodeConfig
from trainer_core.errors import KVError, MembershipChanged, NodeFailure
from trainer_core.node import protocol
from trainer_core.node.agree import canonical
from trainer_core.node.book import ALL, Book, join, scheduler_endpoint
from trainer_core.node.inflight import Requests
from trainer_core.node.listen import listen
from trainer_core.node.liveness import Health, Liveness
from trainer_core.node.rootserver import RootServer, root_name, serves_root
from trainer_core.transport import wire
from trainer_core.transport.channel import Channel, Listener, Received
from trainer_core.transport.control import Router, Transport
from trainer_core.transport.host import bind_and_publish_hosts


class Postoffice:
    """A joined node: ``book`` (every node, where each listens), ``sched`` (its channel to the
    scheduler), ``live`` (the job's health, from heartbeats), ``listeners`` (where the other
    nodes reach it), ``requests``."""

    def __init__(
        self, book: Book, sched: Channel, health: Health, log: logging.Logger, grace_s: float = 1.0
    ) -> None:
        self.book = book
        self._first = book  # the book it joined with
        self.sched = sched
        self.live = health
        self.log = log
        self.grace_s = grace_s
        self.requests = Requests()
        self.transport: Transport | None = None
        self.listeners: list[Listener] = []
        self.local_failure: NodeFailure | None = None
        self.closed = False
        self.raised = threading.Event()  # the failure reached the user (or the node closed)
        self._said_waited = False  # this node said which node it waited for (``_waiting_in``)
        self.before_exit: Callable[[], None] | None = None  # e.g. unlink shared-memory names
        self._watchdog: threading.Thread | None = None
        self.root: RootServer | None = None  # the job's scheduler, when this node serves it
        self.router: Router | None = None  # a server's ROUTER (``join(router=True)``)
        # the channel to the scheduler serves one thread at a time (``abort`` may come from any)
        self._sched_lock = threading.RLock()
        # an elastic job's books: the current one under ``_books``; who left or joined, by epoch
        self._books = threading.Condition()
        self._changes: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._later: list[Book] = []  # every book after the first, in order (``subscribe(replay=)``)
        self._customers: list[Callable[[Book, Book], None]] = []
        health.on_book = self.new_book

    @classmethod
    def join(
        cls,
        cfg: NodeConfig,
        log: logging.Logger,
        schema: wire.Schema = protocol.SCHEMA,
        needs: str = ALL,
        router: bool = False,
    ) -> Postoffice:
        """Join the job of ``cfg``: listen, register, wait for the book (the part it ``needs``:
        ``book.ALL`` or ``book.SERVERS``), start the heartbeats. ``router`` (a server): first bind a
        ROUTER on ``DMLC_INTERFACE``'s address (else ``DMLC_NODE_HOST``) on a free port, kept as
        ``router`` and registered as this node's endpoint. Everything opened is closed again if
        one of them fails."""
        transport = Transport(cfg.secret, log, cfg.verbose, schema)
        listeners: list[Listener] = []
        live: Liveness | None = None
        root: RootServer | None = None
        sock: Router | None = None
        host, endpoint = cfg.env.node_host or "", None
        try:
            if serves_root(cfg):  # a job without a scheduler process: worker 0 serves the root
                root = RootServer(cfg, log, schema)
            if router:
                bind_host, host = bind_and_publish_hosts(cfg.env.interface, cfg.env.node_host)
                sock, bound = transport.bind_router(bind_host)
                endpoint = f"tcp://{host}:{bound.rsplit(':', 1)[1]}"
            local, data = listen(cfg, transport.trace, listeners)
            sched, book = join(transport, cfg, host, endpoint, log, local=local, data=data, needs=needs)
            live = Liveness(
                transport,
                scheduler_endpoint(cfg),
                book.name,
                cfg.heartbeat_interval,
                cfg.heartbeat_timeout,
                log,
                root=root_name(cfg),
            )
            grace = cfg.heartbeat_timeout + cfg.heartbeat_interval if cfg.liveness_on else 1.0
            node = cls(book, sched, live, log, grace_s=grace)  # takes the books before the first beat
            node.transport = transport
            node.listeners = listeners
            node.root = root
            node.router = sock
            live.start()
        except BaseException:
            if live is not None:
                live.stop()
            if root is not None:
                root.stop()
            for listener in listeners:
                listener.close()
            transport.close()
            raise
        return node

    @property
    def rank(self) -> int:
        return self.book.rank

    @property
    def joined_late(self) -> bool:
        """Whether this node joined an elastic job after its start (the book it joined with is the
        one that admitted it): the job-wide settings and keys exist; it takes them, it does not
        agree on them."""
        first = self._first
        return first.epoch > 0 and first.name in first.joined

    @property
    def name(self) -> str:
        return self.book.name

    # -- an elastic job's epochs --------------------------------------------------------------

    def subscribe(self, customer: Callable[[Book, Book], None], replay: bool = False) -> None:
        """Call ``customer(old, new)`` at each new book (from the heartbeat thread: it must not block).
        ``replay``: first call it, here, with each book that came since the one this node joined with."""
        with self._books:
            self._customers.append(customer)
            if replay:
                old = self._first
                for book in self._later:
                    customer(old, book)
                    old = book

    def unsubscribe(self, customer: Callable[[Book, Book], None]) -> None:
        with self._books:
            if customer in self._customers:
                self._customers.remove(customer)

    def new_book(self, book: Book) -> None:
        """The scheduler's book of a later epoch (thread-safe; an older or the same epoch is moot)."""
        with self._books:
            old = self.book
            if book.epoch <= old.epoch:
                return
            self.book = book
            self._changes[book.epoch] = (book.left, book.joined)
            self._later.append(book)
            customers = list(self._customers)
            self._books.notify_all()
        if self.log.isEnabledFor(logging.INFO):
            self.log.info("trainer_core %s: epoch %d, %d workers", book.name, book.epoch, book.num_workers)
        for customer in customers:
            try:
                customer(old, book)
            except Exception:  # one customer's bug must not keep the others from hearing it
                self.log.exception("trainer_core %s: a customer failed on the new book", book.name)

    def wait_book(self, after: int, timeout: float) -> Book | None:
        """The book of an epoch later than ``after``, waited for at most ``timeout`` s (None: none
        came); the job's failure, when it fails meanwhile."""
        deadline = time.monotonic() + timeout
        with self._books:
            while self.book.epoch <= after:
                self.raise_failure()
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._books.wait(min(0.1, left))
            return self.book

    def changed_since(self, epoch: int) -> MembershipChanged | None:
        """The error of an operation begun in ``epoch`` when the membership has changed since."""
        with self._books:
            now = self.book.epoch
            if now <= epoch:
                return None
            changes = [self._changes.get(e, ((), ())) for e in range(epoch + 1, now + 1)]
        left = tuple(n for lost, _ in changes for n in lost)
        joined = tuple(n for _, came in changes for n in came)
        said = [f"{', '.join(left)} left"] if left else []
        said += [f"{', '.join(joined)} joined"] if joined else []
        return MembershipChanged(
            f"the job's workers changed ({'; '.join(said) or 'a new book'}; epoch {now}, "
            f"{self.book.num_workers} workers): the operation begun in epoch {epoch} failed on every "
            "worker; form the group again at the new epoch",
            now,
            left,
            joined,
        )

    # -- failures ------------------------------------------------------------------------------

    @property
    def failure(self) -> NodeFailure | None:
        """The failure that ended the job for this node, if any."""
        return self.live.failure or self.local_failure

    def raise_failure(self) -> None:
        """Raise the job's failure, if any (it then reached the user: the watchdog stands down)."""
        failure = self.failure
        if failure is not None:
            self.raised.set()
            raise failure

    def peer_broke(self, name: str, reason: str) -> NoReturn:
        """Node ``name`` broke the protocol on its channel: end the job, naming it and ``reason``."""
        if self.failure is None:
            self.local_failure = NodeFailure(f"{name}: {reason}", node=name)
            self.abort(str(self.local_failure), node=name)
        self.raise_failure()
        raise AssertionError("unreachable")

    def peer_lost(self, name: str) -> NoReturn:
        """Node ``name`` closed its channel: it died or is leaving because the job ends. Give the
        heartbeat thread ``grace_s`` to learn the cause from the scheduler, else blame that node."""
        self.live.failed.wait(self.grace_s)
        if self.live.failure is None:
            self.local_failure = NodeFailure(f"{name} closed its connection: it died", node=name)
            self.abort(str(self.local_failure), node=name)
        self.raise_failure()
        raise AssertionError("unreachable")

    def exit_on_failure(self) -> None:
        """From now on a failure of the job that the user's code does not meet in a call soon (a
        long computation) ends the process, as the rest of the job is ending."""
        self.live.on_failure = self._exit_soon
        if self.live.failure is not None:  # failed before the hook was in place
            self._exit_soon(self.live.failure)

    def _exit_soon(self, failure: NodeFailure) -> None:
        """From the heartbeat thread: start the exit watchdog."""

        def watchdog() -> None:
            if not self.raised.wait(max(self.grace_s, 2.0)) and not self.closed:
                self.log.error("trainer_core %s: exiting: %s", self.book.name, failure)
                if self.before_exit is not None:
                    self.before_exit()
                os._exit(1)

        self._watchdog = threading.Thread(target=watchdog, name="trainer_core-exit-watchdog", daemon=True)
        self._watchdog.start()

    # -- the scheduler -------------------------------------------------------------------------

    def barrier(self, check: Callable[[], None] | None = None, at: str = "barrier()") -> None:
        """Until every worker has called ``barrier`` (bounded by heartbeats). ``at`` names the call
        of the API it is part of: when the workers are in different calls, every one of them gets a
        ``KVError`` saying who is where (``node/agree.py``)."""
        with self._waiting_in(at):
            self.scheduler_call(protocol.BARRIER, protocol.BARRIER_DONE, check, {"at": at})

    def agree(self, at: str, value: Any, check: Callable[[], None] | None = None) -> Any:
        """Agree with every other worker on a job-wide setting of call ``at``: ``value`` (plain
        data, sent as canonical JSON; ``None``: this worker gives none and takes the others') is
        compared with every other worker's; returns the value agreed. ``KVError`` on every worker,
        naming each value and its ranks, when they differ, or who is where when a worker is in
        another call (``node/agree.py``)."""
        body: dict[str, Any] = {"at": at}
        if value is not None:
            body["value"] = canonical(value)
        with self._waiting_in(at):
            reply = self.scheduler_call(protocol.AGREE, protocol.AGREED, check, body)
        text = reply.get("value")
        return json.loads(text) if isinstance(text, str) else None

    @contextlib.contextmanager
    def _waiting_in(self, at: str) -> Iterator[None]:
        """A wait of every worker in call ``at``: when it ends in the failure of another node (one
        that finished early, died), this node first says, once, that it waited for that node in
        ``at`` (``dmlc_env.ending.say_waited``: the launcher tells what that node did)."""
        try:
            yield
        except NodeFailure as exc:
            if not self._said_waited and isinstance(exc.node, str) and exc.node != self.book.name:
                self._said_waited = True
                say_waited(exc.node, at)
            raise

    def finish(self, check: Callable[[], None] | None = None) -> None:
        """Until every worker has said it is done (MXNet's finalize)."""
        self.scheduler_call(protocol.FINISH, protocol.FINISHED, check)

    def abort(self, reason: str, node: str | None = None) -> None:
        """Ask the scheduler to end the job now (``node`` failed, by default this one); does not wait.
        From any thread. In an elastic job, a worker named so is dropped and the job goes on."""
        if node is not None:  # another node failed (a server): for the launcher, not this one
            say_peer_failed(node)
        if self.live.failure is None:
            body = {"reason": reason, "node": node or self.book.name}
            with self._sched_lock:
                self.sched.send(wire.Header(op=protocol.ABORT, src=self.book.name, body=body))

    def scheduler_call(
        self,
        op: str,
        reply_op: str,
        check: Callable[[], None] | None = None,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Send ``op`` to the scheduler and wait for its ``reply_op``, calling ``check`` (default:
        ``raise_failure``) between 0.1 s waits; returns the reply's body (``KVError`` when it holds
        an ``error``)."""
        check = check or self.raise_failure
        check()
        seq = self.requests.next()
        with self._sched_lock:
            self.sched.send(wire.Header(op=op, seq=seq, src=self.book.name, body=body or {}))
        done: list[Received] = []

        def take(msg: Received) -> None:
            if msg.header.op == reply_op and msg.header.seq == seq:
                done.append(msg)

        while not done:
            check()
            with self._sched_lock:
                if self.sched.wait(0.1):
                    self.sched.receive(take)
        reply = done[0].header.body
        error = reply.get("error")
        if error is not None:
            raise KVError(str(error))
        return reply

    # -- the end -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the heartbeat thread and the exit watchdog and join them: nothing of this node's runs
        on after it (its channels can then be closed)."""
        self.closed = True
        self.raised.set()  # the watchdog has nothing left to do
        self.live.stop()
        watchdog = self._watchdog
        if watchdog is not None and watchdog is not threading.current_thread():
            watchdog.join()
        if self.root is not None:  # after finish it has ended by itself; else it ends now
            self.root.stop()

    def close_transport(self, linger_ms: int | None = None) -> None:
        """Close the listeners and the transport (after ``stop`` and the channels above), letting
        queued messages go out for ``linger_ms`` (default: 1000, 0 when the job failed)."""
        for listener in self.listeners:
            listener.close()
        self.listeners = []
        if self.transport is not None:
            if linger_ms is None:
                linger_ms = 0 if self.live.failure else 1000
            self.transport.close(linger_ms=linger_ms)
            self.transport = None
