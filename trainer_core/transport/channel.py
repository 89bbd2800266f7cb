"""One interface for every way a node sends and receives messages (docs/wire.md, "Channels").

The layers above (``node``, ``ps``, ``collective``) talk through these types only and never ask
which transport is under them:

* a ``Peer`` is where a message can be sent: ``send(header, frames, fds)`` (returns once the
  caller's arrays are free again) or ``post`` (never waits for the peer). Its ``caps`` say what
  it carries: data frames or headers only, shared-memory references and descriptors, frames
  sent and received in place (no copy). Channels are symmetric: either end may send, post,
  receive and pass descriptors (where ``caps`` allow), whichever end connected.
* a ``Source`` is where messages arrive: ``receive(handle)`` hands each complete message waiting
  to ``handle`` as a ``Received``, whose ``reply`` is the ``Peer`` that answers its sender.
* a ``Channel`` is both: a connection to one peer (the reply goes back on it). A ZeroMQ ROUTER is
  a ``Source`` only: each message's reply is the sender's routing identity on it.
* a ``Listener`` accepts new channels (a node's same-host and TCP listeners: a server's, and a
  worker's, which the other workers' collectives connect to).
* ``Poller`` waits until sources or listeners are ready, whatever is under them, at a cost of
  the ready ones (epoll), not of all of them.

Implementations: ``control`` (ZeroMQ with CURVE), ``unix`` (same host: headers plus shared
memory), ``tcp`` (the cross-host data stream), ``memory`` (in one process, for tests) and
``datagram`` (a ``Peer`` only: signed metrics reports over UDP).
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from trainer_core.errors import KVError, WireError
from trainer_core.transport import wire

#: Given a received header and its frames' lengths: the buffer each frame should be read into
#: (``None``: anywhere). Channels that read frames into place (``caps.direct``) ask it; it may raise
#: ``ChannelClosed(violation=True)`` to refuse a message before its frames are read.
Place = Callable[[wire.Header, list[int]], Sequence[memoryview | None]]


class ChannelClosed(KVError):
    """The channel closed; ``violation`` when the peer broke the protocol (then it was closed on it)."""

    def __init__(self, reason: str, violation: bool = False) -> None:
        super().__init__(reason)
        self.violation = violation


@dataclass(frozen=True)
class Caps:
    """What a channel can carry.

    ``frames``: data frames travel (the same-host unix channel carries headers only).
    ``shared_memory``: headers may name shared-memory segments, and descriptors of a server's
    buffers can be passed (``send(..., fds=...)``, ``take_fds``): the peer shares this host's memory.
    ``direct``: frames leave the caller's arrays before ``send`` returns (no private copy needed),
    and received frames are read straight into the buffers ``place`` gives.
    ``fresh_seq``: a worker's requests to a server all travel on such channels, so the server
    accepts only increasing ``seq`` from each worker on them (replay protection).
    """

    frames: bool = True
    shared_memory: bool = False
    direct: bool = False
    fresh_seq: bool = False


class Payload:
    """One received frame: ``buffer`` holds its bytes; ``placed`` when they were read into the buffer
    ``place`` chose (the caller's array), so there is nothing to copy."""

    __slots__ = ("buffer", "placed")

    def __init__(self, buffer: memoryview, placed: bool = False) -> None:
        self.buffer = buffer
        self.placed = placed


class Peer(ABC):
    """Where a message can be sent."""

    caps: Caps = Caps()
    closed: bool = False

    @abstractmethod
    def send(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        """Send one message: ``frames`` are arrays or buffers, sent without copying; ``fds`` only where
        ``caps.shared_memory``. Once it returns the caller may change its arrays; on a stream it may
        wait for the peer to read (see ``post``). ``ChannelClosed`` when the peer is gone."""

    def post(self, header: wire.Header, frames: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        """Send one message without ever waiting for the peer to read: what cannot leave at once is
        sent, in order, by the channel (``frames`` must not change until it is). Either side of any
        channel may post while it receives: nodes that all send to each other at once cannot
        deadlock. Here: ``send``, for channels whose ``send`` never waits (ZeroMQ, memory)."""
        self.send(header, frames, fds)


@dataclass(slots=True)
class Received:
    """One received, validated message; ``reply`` answers its sender. Each frame has ``.buffer``
    (``zmq.Frame`` or ``Payload``), valid until the next message of the same source is received."""

    header: wire.Header
    frames: list[Any]
    reply: Peer


def _noop() -> None:
    return None


class Source(ABC):
    """Where messages arrive."""

    closed: bool = False
    #: a message abandoned half-way on this side (an interrupt) closed it: why (see ``ChannelClosed``)
    interrupted: str = ""

    @abstractmethod
    def pollable(self) -> Any:
        """What ``Poller`` waits on: a file descriptor, or a ZeroMQ socket."""

    @abstractmethod
    def receive(self, handle: Callable[[Received], None]) -> bool:
        """Hand the complete messages waiting to ``handle``, each before the next is read (its frames
        may live in a buffer the next one reuses); malformed ones are logged and dropped. ``False``
        once the source is closed (the peer left or broke the protocol)."""

    @abstractmethod
    def close(self, flush_s: float = 0.0) -> None:
        """Close; where messages wait to be sent (a sender thread), give them at most ``flush_s``."""

    def stop_sending(self) -> None:
        """Let queued messages go out, then send no more (``close`` waits for that)."""
        return None

    def wait(self, timeout_s: float) -> bool:
        """Whether something is waiting (a message, or the peer's close), after at most ``timeout_s``."""
        p = select.poll()
        p.register(self.pollable(), select.POLLIN)
        return bool(p.poll(int(timeout_s * 1000)))


class Channel(Peer, Source):
    """A connection to one peer: messages arrive on it and replies go back on it.

    The role sets ``place`` (where frames go, for ``caps.direct``) and ``alive`` (called between the
    0.1 s slices of a wait inside one message; raising there gives up, closing a stream channel).
    What a role records per channel (a server: the buffers a same-host peer has mapped) it keeps
    itself, keyed by the channel.
    """

    def __init__(self, caps: Caps, trace: Trace) -> None:
        self.caps = caps
        self.trace = trace
        self.headers = wire.Decoder(trace.headers.schema)  # its own peer's recent headers (docs/wire.md)
        self.place: Place | None = None
        self.alive: Callable[[], None] = _noop

    def take_fds(self, n: int) -> list[int]:
        """The next ``n`` descriptors received (the caller owns them); ``KVError`` if they did not come."""
        if n:
            raise KVError("this channel carries no file descriptors")
        return []


class Listener(ABC):
    """Accepts new channels (a server's)."""

    #: called with each accepted channel before it is watched (the role sets its ``place`` and ``alive``)
    on_accept: Callable[[Channel], None] | None = None
    handshakes: Handshakes  # its accepted connections that have not proved the secret yet

    @abstractmethod
    def pollable(self) -> Any: ...

    @abstractmethod
    def accept(self) -> list[Channel]:
        """The channels waiting to be accepted."""

    def stale(self) -> list[Channel]:
        """Accepted channels that must go (e.g. not authenticated in time): the caller closes them."""
        return []

    @abstractmethod
    def close(self) -> None: ...


HANDSHAKE_TIMEOUT_S = 10.0  # an accepted connection must prove the secret within this long
MAX_PENDING = 64  # connections still in their handshake; beyond it the oldest is closed


class Handshakes:
    """A listener's accepted connections that have not proved the secret yet.

    A peer that connects and never completes the handshake must not hold its connection (and a
    descriptor) for ever: ``stale`` gives the ones older than ``bound_s``, and the oldest beyond
    ``most`` (the ``peers`` expected at once, and ``MAX_PENDING``), for the serving loop to close.
    Every listener keeps one (docs/wire.md, "Channels"); ``backlog`` is its socket's.
    """

    def __init__(self, trace: Trace, what: str, peers: int = 0, bound_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.trace, self.what, self.bound_s = trace, what, bound_s
        self.most = peers + MAX_PENDING
        self.backlog = max(256, self.most)
        self._pending: list[tuple[float, Channel]] = []  # (accepted at, channel), oldest first

    def add(self, ch: Channel) -> None:
        self._pending.append((time.monotonic(), ch))

    def stale(self, ready: Callable[[Channel], bool]) -> list[Channel]:
        """The connections to close now; ``ready(ch)`` says whether one has proved the secret."""
        if not self._pending:  # (asked at every turn of the serving loop)
            return []
        now = time.monotonic()
        self._pending = [(t, c) for t, c in self._pending if not c.closed and not ready(c)]
        late = [c for t, c in self._pending if now - t > self.bound_s]
        if late:
            self.trace.log.warning("closed %d %s that did not authenticate in time", len(late), self.what)
        keep = [(t, c) for t, c in self._pending if now - t <= self.bound_s]
        extra = [c for _, c in keep[: max(0, len(keep) - self.most)]]
        self._pending = keep[len(extra) :]
        return [*late, *extra]

    def age(self, by_s: float) -> None:
        """Make every pending connection ``by_s`` seconds older (tests)."""
        self._pending = [(t - by_s, c) for t, c in self._pending]


class Trace:
    """What every channel of a node shares: the node's ``schema`` (its protocols; ``wire.OPAQUE``:
    any kind, no entries) with the decoder of a ROUTER's peers (a ``Channel`` has its own), and the
    logging: each message at ``PS_VERBOSE=2``, drops as warnings."""

    def __init__(self, log: logging.Logger, verbose: int = 0, schema: wire.Schema = wire.OPAQUE) -> None:
        self.log = log
        # the node's decoder (it remembers recent headers), for the protocols it speaks
        self.headers = wire.Decoder(schema)
        self.verbose = verbose
        self.on = verbose >= 2  # callers test it before ``sent``/``received``: no call per message else

    def sent(self, header: wire.Header, frames: int) -> None:
        self.log.debug(
            "send %s seq=%d entries=%d frames=%d", header.op, header.seq, len(header.entries), frames
        )

    def received(self, header: wire.Header) -> None:
        self.log.debug("recv %s seq=%d from %s", header.op, header.seq, header.src)

    def decode(self, raw: wire.Raw, headers: wire.Decoder | None = None) -> wire.Header | None:
        """The header of a received message (``headers``: a channel's decoder, else the node's), or
        ``None`` (logged: the message is dropped)."""
        try:
            header = (headers or self.headers).decode(raw)
        except WireError as exc:
            self.log.warning("dropped a malformed message: %s", exc)
            return None
        if self.on:
            self.received(header)
        return header


#: descriptors left in ZeroMQ's poll (walked in about an epoll set's second wait); beyond, in the set
FEW_FDS = 32


class Poller:
    """Waits on sources and listeners of any transport, at a cost of the ready ones per wake.

    A ``zmq.Poller`` waits on a node's ZeroMQ sockets (their descriptor signals edges, not
    readiness: pyzmq's ``zmq.FD``) and on its first ``FEW_FDS`` descriptors; past them every
    descriptor moves to one level-triggered ``epoll`` set, which hands back only the ready ones
    (a server with 1000 idle workers and one ready examines one), and ZeroMQ's poll waits on the
    set's own descriptor. ``examined``: the items the waits walked and handed back (tests).
    """

    def __init__(self) -> None:
        self._zmq = zmq.Poller()
        self._epoll: select.epoll | None = None  # once there are more than FEW_FDS descriptors
        self._sockets = 0  # ZeroMQ sockets watched; the other items are descriptors (``_fds``)
        self._closed = False
        self._sources: dict[Any, Source] = {}  # by what is polled
        self._listening: dict[Any, Listener] = {}
        self._keys: dict[int, Any] = {}  # id(item) -> what is polled
        self.examined = 0

    def add(self, item: Source | Listener) -> None:
        key = item.pollable()
        if not isinstance(key, int):
            self._sockets += 1
        if isinstance(key, int) and self._epoll is not None:
            self._epoll.register(key, select.EPOLLIN)
        else:
            self._zmq.register(key, zmq.POLLIN)
        if isinstance(item, Listener):
            self._listening[key] = item
        else:
            self._sources[key] = item
        self._keys[id(item)] = key
        if self._epoll is None and self._fds > FEW_FDS:
            self._epoll = select.epoll()
            for fd in (k for k in self._keys.values() if isinstance(k, int)):
                self._zmq.unregister(fd)
                self._epoll.register(fd, select.EPOLLIN)
            self._zmq.register(self._epoll.fileno(), zmq.POLLIN)

    def remove(self, item: Source | Listener) -> None:
        key = self._keys.pop(id(item), None)
        if key is None or (self._sources.get(key) is not item and self._listening.get(key) is not item):
            return  # not watched, or its key now belongs to another item
        self._sources.pop(key, None)
        self._listening.pop(key, None)
        if not isinstance(key, int):
            self._sockets -= 1
        elif self._epoll is not None:
            if not self._epoll.closed:
                with contextlib.suppress(OSError):  # closed: the kernel dropped it from the set
                    self._epoll.unregister(key)
            return
        self._zmq.unregister(key)

    @property
    def _fds(self) -> int:  # the descriptors watched: every item watched but the sockets
        return len(self._sources) + len(self._listening) - self._sockets

    def sources(self) -> list[Source]:
        return list(self._sources.values())

    def close(self) -> None:
        """Release the epoll set (the items stay open; the poller can still list and remove them)."""
        self._closed = True
        if self._epoll is not None:
            self._epoll.close()

    def _wait(self, timeout_s: float) -> list[Any]:
        """The keys of the ready items, after at most ``timeout_s``."""
        if self._closed:  # its owner was closed from another thread
            raise ChannelClosed("the poller was closed")
        epoll = self._epoll
        if epoll is not None and not self._sockets:
            fds = epoll.poll(timeout_s, max(1, self._fds))  # (its default: 1023 at most)
            self.examined += len(fds)
            return [fd for fd, _ in fds]
        polled = self._zmq.poll(int(timeout_s * 1000))
        if epoll is None:
            self.examined += len(self._keys) + len(polled)
            return [key for key, _ in polled]
        epfd = epoll.fileno()
        self.examined += self._sockets + 1 + len(polled)
        keys = [key for key, _ in polled if key != epfd]
        if len(keys) < len(polled):
            fds = epoll.poll(0, max(1, self._fds))
            self.examined += len(fds)
            keys.extend(fd for fd, _ in fds)
        return keys

    def poll(self, timeout_s: float) -> list[Source | Listener]:
        """The sources and listeners that are ready, after at most ``timeout_s``."""
        ready: list[Source | Listener] = []
        for key in self._wait(timeout_s):
            item = self._sources.get(key) or self._listening.get(key)
            if item is not None:
                ready.append(item)
        return ready

    def serve(
        self,
        handle: Callable[[Received], None],
        timeout_s: float,
        on_closed: Callable[[Source], None] | None = None,
    ) -> None:
        """One turn of a serving loop: close stale channels, wait at most ``timeout_s``, accept the
        channels waiting (and watch them from now on), hand every message waiting to ``handle``, and
        stop watching sources that closed (``on_closed`` is told)."""
        for listener in list(self._listening.values()):
            for ch in listener.stale():
                self.remove(ch)
                ch.close()
        sources = self._sources
        for key in self._wait(timeout_s):
            item = sources.get(key)
            if item is None:
                ready = self._listening.get(key)
                if ready is None:  # removed while an earlier ready item was served
                    continue
                for ch in ready.accept():
                    if ready.on_accept is not None:
                        ready.on_accept(ch)
                    self.add(ch)
            elif not item.receive(handle):
                self.remove(item)
                if on_closed is not None:
                    on_closed(item)
