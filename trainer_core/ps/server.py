"""The server role: holds key parts and serves workers' init/push/pull/pushpull requests.

Run it with ``python -m trainer_core.ps.server`` or by importing trainer_core with
``DMLC_ROLE=server``. It binds a ROUTER on ``DMLC_INTERFACE``'s address (else ``DMLC_NODE_HOST``)
on a free port, listens for same-host channels (unless ``PS_SHM=0``) and TCP data channels (unless
``PS_ENCRYPT=1``), registers with the scheduler (all three through ``Postoffice.join``, as every
node joins), and serves until the scheduler ends the job (exit 0) or aborts it (exit 1). In an
elastic job the server is a customer of its ``Postoffice``: each new book goes to the loop, which
passes it on to the handler (the rounds count the new epoch's members); a newcomer's
request that comes before the book admitting it waits for that book. This module is the loop: it
polls every channel and hands each message to ``handler.RequestHandler``, which holds the logic and
never sees a transport.
"""

from __future__ import annotations

import logging
import queue
import sys
import time

import trainer_core.metrics as metrics
from trainer_core.config import NodeConfig
from trainer_core.log import get_logger
from trainer_core.node.book import SERVERS, Book
from trainer_core.node.liveness import Health
from trainer_core.node.membership import worker_id
from trainer_core.node.postoffice import Postoffice
from trainer_core.ps import protocol
from trainer_core.ps.handler import RequestHandler
from trainer_core.transport.channel import Channel, ChannelClosed, Poller, Received, Source
from trainer_core.transport.devshm import job_prefix

_PUSHING = frozenset({protocol.INIT, protocol.PUSH, protocol.PUSHPULL})


class Server:
    """One server node; ``run()`` returns the exit code."""

    def __init__(self, cfg: NodeConfig, log: logging.Logger | None = None) -> None:
        self.cfg = cfg
        self.log = log or get_logger(cfg.verbose)
        self.node: Postoffice | None = None
        self.handler: RequestHandler | None = None
        self.accepted: list[Channel] = []
        self.live: Health | None = None  # the node's (``node.live``); tests set a bare ``Health``
        self.books: queue.SimpleQueue[Book] = queue.SimpleQueue()  # an elastic job's new books
        self.requests = 0  # requests handled and data bytes received, for the metrics reports
        self.bytes_received = 0

    def run(self) -> int:
        """Serve until the job ends; a start-up failure (a listener that cannot bind, the scheduler
        unreachable or refusing, ``PS_START_TIMEOUT``) raises a ``KVError`` with every thread
        joined and every listener, channel, buffer and socket of this server closed."""
        try:
            return self._run()
        finally:
            node = self.node
            if node is not None:
                node.stop()
            if self.handler is not None:
                self.handler.close()
            if node is not None:  # (a failed join closed what it opened: no heartbeats to flush)
                node.close_transport(linger_ms=1000)

    def _run(self) -> int:
        cfg = self.cfg
        # a server reaches no other node: the counts are what it reads
        node = self.node = Postoffice.join(cfg, self.log, protocol.SCHEMA, needs=SERVERS, router=True)
        assert node.router is not None
        book = node.book
        self.handler = RequestHandler(
            book.num_workers,
            job_prefix(cfg.job_id),
            self.log,
            shared=cfg.use_shm,  # (``listen`` opened a same-host listener)
            name=book.name,
            elastic=cfg.env.elastic is not None,
        )
        live = self.live = node.live
        # (from the heartbeat thread: taken by the loop's thread; the books that came since the join first)
        node.subscribe(lambda _old, new: self.books.put(new), replay=True)
        metrics.add_source(self.figures)  # the first report says this server registered
        poller = Poller()
        poller.add(node.router)
        for listener in node.listeners:
            listener.on_accept = self._accepted
            poller.add(listener)
        try:
            while not live.failed.is_set() and not live.terminated.is_set():
                poller.serve(self._handle, 0.1, self._closed)
                self._take_books()
            return 1 if live.failed.is_set() else 0
        finally:
            poller.close()
            metrics.remove_source(self.figures)
            metrics.send_now()
            node.stop()
            self._shut(flush_s=0.0 if live.failed.is_set() else 1.0)

    def _take_books(self) -> None:
        """Pass an elastic job's new books on to the handler (between messages and after each poll)."""
        while not self.books.empty():
            self._apply(self.books.get())

    def _apply(self, new: Book) -> None:
        assert self.handler is not None
        left, joined = {worker_id(n) for n in new.left}, {worker_id(n) for n in new.joined}
        self.handler.workers_changed(new.num_workers, left, joined)

    def _await_book(self, rank: int) -> None:
        """A newcomer's request came before the book that admits it (the scheduler sent that book
        first, but on the heartbeat channel): wait for it, at most the heartbeat timeout (then the
        handler refuses the request, naming the rank)."""
        assert self.handler is not None
        deadline = time.monotonic() + self.cfg.heartbeat_timeout
        live = self.live
        while rank not in self.handler.known:
            if live is not None and (live.failed.is_set() or live.terminated.is_set()):
                return
            wait = deadline - time.monotonic()
            if wait <= 0:
                return
            try:
                self._apply(self.books.get(timeout=min(wait, 0.1)))
            except queue.Empty:
                continue

    def _handle(self, msg: Received) -> None:
        """Count the request (a few integer adds), then hand it to the handler."""
        assert self.handler is not None
        if not self.books.empty():
            self._take_books()
        newcomer = self.handler.newcomer(msg)
        if newcomer is not None:
            self._await_book(newcomer)
        self.requests += 1
        for f in msg.frames:
            self.bytes_received += f.buffer.nbytes
        if msg.header.op in _PUSHING:
            for e in msg.header.entries:
                if e.shm is not None:  # the part's bytes came through shared memory
                    self.bytes_received += e.size * int(e.dtype[2:])
        self.handler.handle(msg)

    def figures(self) -> dict[str, float]:
        """This server's metrics figures (docs/metrics.md)."""
        out = {"registered": 1.0, "requests": self.requests, "bytes_received": self.bytes_received}
        age = self.live.heartbeat_age() if self.live is not None else None
        if age is not None:
            out["heartbeat_age_s"] = age
        return out

    def _accepted(self, channel: Channel) -> None:
        """A new same-host or data channel: its frames land where the handler says; a wait inside one
        of its messages gives up when the job ends."""
        assert self.handler is not None
        channel.place = self.handler.place
        channel.alive = self._alive
        self.accepted = [c for c in self.accepted if not c.closed]
        self.accepted.append(channel)

    def _closed(self, source: Source) -> None:
        """A channel closed (its peer left): the handler forgets what it sent on it."""
        if self.handler is not None and isinstance(source, Channel):
            self.handler.channel_closed(source)

    def _alive(self) -> None:
        live = self.live
        if live is not None and (live.failed.is_set() or live.terminated.is_set()):
            raise ChannelClosed("the job is ending")

    def _shut(self, flush_s: float) -> None:
        """Close the accepted channels, letting queued replies go out in parallel for at most ``flush_s``."""
        for ch in self.accepted:
            ch.stop_sending()
        deadline = time.monotonic() + flush_s
        for ch in self.accepted:
            ch.close(flush_s=max(0.0, deadline - time.monotonic()))
        if self.node is not None:
            for listener in self.node.listeners:
                listener.close()


def main(environ: dict[str, str] | None = None) -> int:
    """Entry point of ``python -m trainer_core.ps.server``."""
    cfg = NodeConfig.from_environ(environ, role="server")
    return Server(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
