"""The worker role's connection to the servers: routes, requests to them, their shared buffers.

``WorkerClient`` sends requests to servers on their ``routes.Route`` channels and waits for
replies; the node it runs on (``node.postoffice.Postoffice``: the book, the scheduler, liveness,
barriers, aborts, the exit watchdog, request numbering and tracking) is ``node``. It never asks
which transport a channel is: it picks the route's ``fast`` channel for requests without frames
and ``framed`` otherwise, and reads the rest from ``caps``. Every wait polls the channels in
short slices and checks the job's ``Health`` between them, so it is bounded by the peers'
liveness, never by a wall-clock timeout; a reply that is long in coming (a sync round waits for
every worker's push: a slow worker keeps it open) is warned about after ``stall.check_s`` and
again every ``check_s``, and given up on only after ``stall.shutdown_s`` (opt-in; ``wait``). ``WorkerClient.join`` connects a real worker; tests
build one on ``transport.memory`` channels. ``kv.DistKVStore`` builds the KV API on top of it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

import numpy as np

import trainer_core.metrics as metrics
from dmlc_env.ending import say_waited
from trainer_core.config import NodeConfig, StallPolicy
from trainer_core.errors import KVError, NodeFailure, WireError
from trainer_core.node.book import SERVERS, Book
from trainer_core.node.liveness import Health
from trainer_core.node.membership import worker_id
from trainer_core.node.postoffice import Postoffice
from trainer_core.ps import protocol
from trainer_core.ps.handler import SHARED_PREFIX
from trainer_core.ps.routes import Route, open_routes
from trainer_core.transport.channel import Channel, ChannelClosed, Poller, Received, Source
from trainer_core.transport.control import Transport
from trainer_core.transport.devshm import MemBuffer


class WorkerClient:
    """One worker's channels to the servers and its requests to them.

    ``routes[i]`` reaches server ``i``; ``node`` is the worker's place in the job (``sched``, the
    channel to the scheduler; ``live``, whether the job failed); when a server's channel closes the
    client waits ``grace_s`` for the scheduler to name the cause before blaming that server.
    """

    def __init__(
        self,
        book: Book,
        routes: list[Route],
        sched: Channel,
        health: Health,
        log: logging.Logger,
        grace_s: float = 1.0,
        node: Postoffice | None = None,
        stall: StallPolicy | None = None,
    ) -> None:
        self.node = node or Postoffice(book, sched, health, log, grace_s)
        self.routes = routes
        self.log = log
        self.stall = stall or StallPolicy()  # waits for a reply that is long in coming (``wait``)
        self._asked: dict[int, tuple[int, str]] = {}  # seq -> (server, op) of a request awaited
        self.requests = self.node.requests
        self._poller = Poller()
        self._server_of: dict[int, tuple[int, Channel]] = {}  # id(channel) -> (server, channel)
        for i, route in enumerate(routes):
            for ch in route.channels():
                ch.alive = self._job_alive
                ch.place = self._place
                self._poller.add(ch)
                self._server_of[id(ch)] = (i, ch)
        n = len(routes)
        self.same_host = [r.shares_memory for r in routes]
        self._last_reply = [0] * n
        self._places: dict[int, list[memoryview]] = {}  # seq -> where the reply's frames go (direct)
        self._last_push = [0] * n
        self._async_error: KVError | None = None
        self._buffers: dict[tuple[int, int], MemBuffer] = {}  # (server, id): servers' shared key storage
        self._views: dict[tuple[int, str, np.dtype, int], np.ndarray] = {}  # views of them, made once
        self._closed = False
        self.collectives = 0  # collective calls announced to the servers (``away``)
        #: who this worker is to the servers: the number of its name, stable for its life (an elastic
        #: job renumbers the ranks at each epoch); its rank in a fixed job
        try:
            self.worker_id = worker_id(self.book.name)
        except ValueError:  # (a node not named as a worker: in-process tests)
            self.worker_id = self.book.rank

    @classmethod
    def join(cls, cfg: NodeConfig, log: logging.Logger, exit_on_failure: bool = True) -> WorkerClient:
        """Join the job described by ``cfg`` (``Postoffice.join``), then connect to every server."""
        node = Postoffice.join(cfg, log, protocol.SCHEMA, needs=SERVERS)  # it reaches the servers only
        try:
            metrics.report(registered=1)  # the first report says this worker registered
            client = cls.on(node, cfg, log)
        except BaseException:
            node.stop()
            node.close_transport()
            raise
        if exit_on_failure:
            node.exit_on_failure()
        return client

    @classmethod
    def on(cls, node: Postoffice, cfg: NodeConfig, log: logging.Logger) -> WorkerClient:
        """The client of a worker already joined (``node``, whose transport reads the parameter
        server's kinds, ``protocol.SCHEMA``): connect to every server. The client's ``close``
        stops the node; the caller closes the node if this fails."""
        if node.transport is None:
            raise ValueError("the parameter server's client needs a joined node (its transport is closed)")
        kinds = node.transport.trace.headers.schema.kinds
        if kinds is not None and protocol.OPS is not None and not kinds.issuperset(protocol.OPS):
            raise ValueError(
                "the node was joined without the parameter server's message kinds (protocol.SCHEMA)"
            )
        routes = open_routes(cfg, node.book, node.transport, log)
        return cls(node.book, routes, node.sched, node.live, log, node.grace_s, node=node, stall=cfg.stall)

    # what the node holds, as this client's own (the KV store and the tests read them here)

    @property
    def book(self) -> Book:
        return self.node.book

    @property
    def sched(self) -> Channel:
        return self.node.sched

    @property
    def live(self) -> Health:
        return self.node.live

    @property
    def grace_s(self) -> float:
        return self.node.grace_s

    @property
    def transport(self) -> Transport | None:
        return self.node.transport

    @property
    def local_failure(self) -> NodeFailure | None:
        return self.node.local_failure

    @property
    def before_exit(self) -> Callable[[], None] | None:
        return self.node.before_exit

    @before_exit.setter
    def before_exit(self, hook: Callable[[], None] | None) -> None:
        self.node.before_exit = hook

    @property
    def outstanding(self) -> set[int]:
        return self.requests.outstanding

    @property
    def unclaimed(self) -> set[int]:
        """Requests whose replies nobody waits for any more (``forget``)."""
        return self.requests.unclaimed

    @property
    def _seq(self) -> Any:  # the node's request numbers (tests take one with ``next``)
        return self.requests.seq

    @property
    def rank(self) -> int:
        return self.book.rank

    @property
    def tcp(self) -> list[Channel | None]:
        """Per server: its channel when it is reached on a ``caps.direct`` stream (the TCP data
        channel), else ``None``."""
        return [r.framed if r.framed.caps.direct else None for r in self.routes]

    # -- requests ------------------------------------------------------------------------------

    def send(
        self,
        server: int,
        op: str,
        entries: Sequence[protocol.Entry] = (),
        frames: Sequence[Any] = (),
        body: dict[str, Any] | None = None,
        keep: bool = True,
        local: bool = True,
        into: list[memoryview] | None = None,
    ) -> int:
        """Send one request to ``server``. With ``keep`` its reply is awaited with ``wait``; without, the
        request is a push that gets no reply (unless refused): ``confirm`` tells when it was handled.
        ``local=False`` keeps a request off a channel that carries no frames (its reply does).
        ``into``: where the reply's frames go, one byte view per frame, on a ``direct`` channel
        (read there directly, see ``sends_directly``)."""
        self.check()
        seq = self.requests.next()
        fields = {"rank": self.worker_id}
        if body:
            fields.update(body)
        header = protocol.Header(op, seq, self.book.name, tuple(entries), fields)
        route = self.routes[server]
        ch = route.fast if local and not frames else route.framed
        if into is not None and ch.caps.direct:
            self._places[seq] = into
        try:
            ch.send(header, frames)
        except ChannelClosed:
            self._lost(server, ch)
        if keep:
            self.requests.expect(seq)
            self._asked[seq] = (server, op)
        else:
            self._last_push[server] = seq
        return seq

    def sends_directly(self, server: int) -> bool:
        """Whether requests with frames to ``server`` leave from the caller's arrays before ``send``
        returns (``caps.direct``): then a push needs no private copy and replies can be read in place."""
        return self.routes[server].framed.caps.direct

    def forget(self, sent: dict[int, int]) -> None:
        """Wait for none of the replies of ``sent`` (seq -> server): each is dropped when it comes (an
        error reply is raised by a later call, as for a push), and ``drain`` only makes sure that its
        request was handled."""
        for seq, server in sent.items():
            self._asked.pop(seq, None)
            self._last_push[server] = max(self._last_push[server], seq)
            msg = self.requests.forget(seq)
            if msg is not None:
                self._dropped(msg)

    def confirm(self, server: int, seq: int) -> None:
        """Until ``server`` has handled request ``seq``: a server handles one connection's messages in
        order, so any answered later request proves it; else ask with an empty request."""
        if self._last_reply[server] > seq:
            return
        self.wait([self.send(server, protocol.PULL)])

    def wait(self, seqs: Iterable[int]) -> dict[int, Received]:
        """The replies of ``seqs`` (raises ``KVError`` for an error reply, ``NodeFailure`` when the job
        dies, ``KVError`` after ``stall.shutdown_s`` when set; stall warnings meanwhile). Where one
        is an error and an earlier push's error reply came before it, the push's error is raised:
        the earliest error first (a pull refused because the push before it was)."""
        want = list(seqs)
        start, warned = time.monotonic(), 0

        def pump() -> None:
            nonlocal warned
            self._pump()
            waited = time.monotonic() - start
            due = self.stall.warnings_due(waited)
            if due > warned or self.stall.gives_up(waited):
                warned = due
                self._late(want, waited)

        asked: dict[int, tuple[int, str]] = {}
        try:
            out = self.requests.wait(want, pump)
        finally:
            for s in want:
                if (was := self._asked.pop(s, None)) is not None:
                    asked[s] = was
        for seq, msg in out.items():
            if msg.header.op == protocol.ERROR:
                reason = msg.header.body.get("reason")
                if msg.header.body.get("stuck") is True:
                    # it waited for a worker that is in a collective call: no worker can go on
                    self.abort(str(reason))
                    raise KVError(str(reason))
                gone = msg.header.body.get("finished")
                if isinstance(gone, int) and not isinstance(gone, bool) and seq in asked:
                    self._finished_early(gone, asked[seq])
                if self._async_error is not None:  # an earlier push's, come first: the cause
                    err, self._async_error = self._async_error, None
                    raise err
                raise KVError(f"server refused the request: {reason}")
        return out

    def _finished_early(self, rank: int, asked: tuple[int, str]) -> None:
        """Worker ``rank`` finished while this worker's request ``asked`` (server, op) waited for its
        push in a sync round: say so for the launcher (``dmlc_env.ending.say_waited``: it names
        that worker and what it did, exited 0 early, rather than this one, whose error ends the job)."""
        server, op = asked
        say_waited(f"worker {rank}", f"a sync round ({op} request to server {server})")

    def _late(self, seqs: list[int], waited: float) -> None:
        """A wait for the replies of ``seqs`` is long: warn, naming the servers and the requests
        not answered yet; or, past ``stall.shutdown_s``, give up."""
        late = sorted({self._asked[s] for s in seqs if s not in self.requests.replies and s in self._asked})
        servers = sorted({server for server, _ in late})
        what = (
            f"server{'s' if len(servers) > 1 else ''} {', '.join(map(str, servers))} to answer its "
            f"{', '.join(sorted({op for _, op in late}))} request{'s' if len(late) > 1 else ''}"
        )
        me = self.book.name
        if self.stall.gives_up(waited):
            raise KVError(
                f"{me} waited {self.stall.shutdown_s:g} s for {what}, which are alive (their heartbeats "
                "arrive): it gave up (TRAINER_CORE_STALL_SHUTDOWN_SECONDS)"
            )
        self.log.warning(
            "parameter server stall: %s has waited %.1f s for %s; every node is alive (heartbeats "
            "arrive), so the wait goes on: a sync round waits for every worker's push, and a worker "
            "is slow (computing, saving) or pushes other keys (said every TRAINER_CORE_STALL_CHECK_SECONDS; "
            "TRAINER_CORE_STALL_SHUTDOWN_SECONDS ends such a wait)",
            me,
            waited,
            what,
        )

    def handled(self, server: int, seq: int) -> bool:
        """Whether ``server`` is known to have handled request ``seq`` (without waiting)."""
        return self._last_reply[server] >= seq and seq not in self.outstanding

    def drain(self) -> None:
        """Until every request has been answered and every push handled."""
        self.requests.drain(self._pump)
        for server, seq in enumerate(self._last_push):
            if seq:
                self.confirm(server, seq)
        self.check()

    # -- replies -------------------------------------------------------------------------------

    def _pump(self) -> None:
        self.check()
        self._poller.serve(self._deliver, 0.1, self._closed_source)

    def _closed_source(self, source: Source) -> None:
        server, ch = self._server_of[id(source)]
        self._lost(server, ch)

    def _place(self, header: protocol.Header, lens: list[int]) -> list[memoryview]:
        into = self._places.pop(header.seq, None)
        return into if into is not None and header.op == protocol.REPLY else []

    def _deliver(self, msg: Received) -> None:
        server, ch = self._server_of[id(msg.reply)]
        announced = msg.header.body.get("fds")
        if announced:
            try:
                self._map_buffers(server, ch, announced)
            except (WireError, KVError, ValueError, TypeError, OSError) as exc:
                # dropping it would leave its request waiting for ever: the channel is unusable
                ch.close()
                reason = f"a reply announced shared buffers that could not be mapped ({exc})"
                self.node.peer_broke(f"server {server}", reason)
        self._last_reply[server] = max(self._last_reply[server], msg.header.seq)
        if not self.requests.arrived(msg):
            self._dropped(msg)

    def _dropped(self, msg: Received) -> None:
        """A reply nobody waits for (a push's, or a forgotten one): only an error is kept, for later."""
        body = msg.header.body
        if msg.header.op == protocol.ERROR and self._async_error is None and body.get("stuck") is not True:
            # (a stuck one: nobody waited for it, so nothing hung: its push joins the next round)
            self._async_error = KVError(f"server refused a push: {msg.header.body.get('reason')}")

    def _map_buffers(self, server: int, ch: Channel, announced: Any) -> None:
        """Map the shared buffers whose descriptors came with a reply (``[[id, nbytes], ...]``)."""
        if not isinstance(announced, list):
            raise WireError("fds must be a list")
        fds = ch.take_fds(len(announced))
        for item, fd in zip(announced, fds, strict=True):
            if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) for x in item)):
                os.close(fd)
                raise WireError("bad shared buffer announcement")
            self._buffers[(server, item[0])] = MemBuffer(item[1], fd=fd, ident=item[0])
            for cached in [k for k in self._views if k[0] == server and k[1] == f"{SHARED_PREFIX}{item[0]}"]:
                del self._views[cached]  # a view of a buffer this announcement replaced

    def shared_view(self, server: int, name: str, dtype: np.dtype, n: int) -> np.ndarray:
        """A view of ``n`` elements of server buffer ``launchkit-mem-<id>`` (mapped on an earlier reply)."""
        view = self._views.get((server, name, dtype, n))
        if view is not None:
            return view
        try:
            buf = self._buffers[(server, int(name.removeprefix(SHARED_PREFIX)))]
        except (KeyError, ValueError):
            raise KVError(f"server {server} named an unknown shared buffer {name}") from None
        if n * dtype.itemsize > buf.nbytes:
            raise KVError(f"server {server}: shared buffer {name} is too small")
        view = self._views[(server, name, dtype, n)] = buf.view(dtype, n)
        return view

    # -- failures ------------------------------------------------------------------------------

    def _job_alive(self) -> None:
        """Between the slices of a transfer: raise only if the job failed (an error reply to an earlier
        push is reported between messages, by ``check``, never in the middle of one)."""
        self.node.raise_failure()

    def _lost(self, server: int, ch: Channel) -> NoReturn:
        """A channel to ``server`` closed: this side cut a message off (an interrupt), or the peer left."""
        if ch.interrupted:
            self.check()
            raise KVError(f"server {server}: {ch.interrupted}; this KV store cannot be used any more")
        self.node.peer_lost(f"server {server}")

    def check(self) -> None:
        """Raise a failure of the job, or an error reply to an earlier push."""
        node = self.node
        if self._async_error is None and node.live.failure is None and node.local_failure is None:
            return  # (called several times per store call: the common case costs one test)
        node.raise_failure()
        if self._async_error is not None:
            err, self._async_error = self._async_error, None
            raise err

    @property
    def failure(self) -> NodeFailure | None:
        """The failure that ended the job for this worker, if any."""
        return self.node.failure

    def abort(self, reason: str, node: str | None = None) -> None:
        """Ask the scheduler to end the job now (``node`` failed, by default this worker); does not wait."""
        self.node.abort(reason, node)

    # -- the scheduler -------------------------------------------------------------------------

    def barrier(self, at: str = "barrier()") -> None:
        """Until every worker has called ``barrier`` (bounded by heartbeats); ``at``: the API call
        it is part of (named when the workers are in different calls)."""
        self.node.barrier(self.check, at)

    def agree(self, at: str, value: Any) -> Any:
        """The value of a job-wide setting agreed by every worker (``Postoffice.agree``)."""
        return self.node.agree(at, value, self.check)

    def away(self, at: str) -> None:
        """Tell every server that this worker enters collective call ``at`` at the scheduler (after
        ``drain``): a request of another worker waiting for this one's push then fails at once,
        naming both, instead of waiting for ever (``Store.enter``)."""
        self.collectives += 1
        body = {"at": at, "n": self.collectives}
        self.wait([self.send(s, protocol.AWAY, body=body) for s in range(len(self.routes))])

    def finish(self) -> None:
        """Tell the servers and the scheduler this worker is done; wait until every worker is (MXNet's finalize)."""
        self.wait([self.send(s, protocol.FINISH) for s in range(len(self.routes))])
        self.node.finish(self.check)

    def close(self) -> None:
        """Release everything: the heartbeat thread and the exit watchdog are stopped and joined
        before the channels and the transport they could still use are closed."""
        if self._closed:
            return
        self._closed = True
        self.node.stop()
        for route in self.routes:
            for ch in route.channels():
                ch.close()
        self._poller.close()
        self._views.clear()  # before the mappings under them
        for buf in self._buffers.values():
            buf.close()
        self.node.close_transport()
