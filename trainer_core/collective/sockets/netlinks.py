"""``NetLinks``: the collectives' ``Links`` between the worker processes of a job, over sockets.

On a joined ``node.postoffice.Postoffice``, each pair of workers gets one channel, opened by the
lower rank to the higher one's listener (same-host, the bytes in a memfd: ``channels``; else TCP).
One receiving thread matches each ``coll_data`` by (sender, tag) to its posted receive, read in
place, or keeps a copy until it is posted. Sends never wait, so a ring cannot deadlock. A peer
whose channel ends without its ``coll_bye`` died: the group fails naming it, and the scheduler is
told (``report_abort``). A live peer is waited for, with stall warnings (``handles.Recv``); the
bound of a wait is the job's liveness (``bound_s`` only when the job has no heartbeats). A wait
that ends in a failure naming another worker says so for the launcher (``failed``). In an
elastic job the links are those of one epoch: once the scheduler's next book comes (a worker left
or joined), every operation fails with ``MembershipChanged`` (``changed``), and the group is
formed again at the new epoch.
docs/collectives.md, "Over sockets" and "Slow is not dead".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dmlc_env.ending import say_peer_failed, say_waited
from trainer_core.config import NodeConfig, StallPolicy
from trainer_core.errors import KVError, NodeFailure, WireError
from trainer_core.node import protocol as node_protocol
from trainer_core.node.book import Book, scheduler_endpoint
from trainer_core.node.postoffice import Postoffice
from trainer_core.transport import wire
from trainer_core.transport.channel import Channel, ChannelClosed, Poller, Received, Source
from trainer_core.transport.tcp import TcpChannel, TcpListener
from trainer_core.transport.unix import UnixListener

from ..primitives import stall as stalls
from ..primitives.hostsegment import Local
from ..primitives.links import DEFAULT_TIMEOUT, LinkError, PeerShutDown, data_op, op_bits
from . import channels, protocol, sharesegment
from .handles import DONE, SLICE_S, Done, Recv, Wake, bytes_of

REPORT_S = 1.0  # how long a worker that saw a peer die waits for the scheduler to confirm the abort
FLUSH_S = 5.0  # how long ``close`` lets queued messages go out


class NetLinks:
    """This worker's ``Links`` to every other worker of the job (see the module's docstring).

    ``node``: the joined worker (its node decoder must know ``protocol.SCHEMA``); ``cfg``: its
    configuration (the secret, the start-up bound, ``cfg.stall``); ``timeout``: seconds a wait
    lasts at most when the job has no heartbeats (``PS_HEARTBEAT_INTERVAL=0``), which would tell a
    live peer from a dead one; ``stall``: overrides ``cfg.stall``."""

    def __init__(
        self,
        node: Postoffice,
        cfg: NodeConfig,
        timeout: float = DEFAULT_TIMEOUT,
        log: logging.Logger | None = None,
        stall: StallPolicy | None = None,
    ) -> None:
        book = node.book
        if book.role != "worker" or len(book.workers) != book.num_workers:
            raise ValueError(
                f"collective links join workers: this node is {book.name}, its book lists "
                f"{len(book.workers)} of {book.num_workers} workers"
            )
        if node.transport is None:
            raise ValueError("collective links need a joined node (its transport is closed)")
        kinds = node.transport.trace.headers.schema.kinds
        if kinds is not None and not protocol.SCHEMA.kinds <= kinds:  # type: ignore[operator]
            raise ValueError("the node was joined without the collectives' message kinds (protocol.SCHEMA)")
        listeners = [x for x in node.listeners if isinstance(x, TcpListener | UnixListener)]
        self.node = node
        self.cfg = cfg
        self.timeout = timeout
        #: how a wait for a live peer treats time (warnings; giving up, opt-in)
        self.stall = stall or cfg.stall
        #: a wait's fixed limit: only without heartbeats (else a dead peer ends the job)
        self.bound_s: float | None = None if cfg.liveness_on else timeout
        self._said_waited = False
        self.log = log or node.log
        self._rank, self._size = book.rank, book.num_workers
        self._book = book  # (the epoch's: the node's book may be a later one)
        self.elastic = cfg.env.elastic is not None
        self._trace = node.transport.trace
        self._lock = threading.Condition()
        self._chan: dict[int, Channel] = {}  # peer -> its channel (once it said hello)
        self._who: dict[Channel, int] = {}  # channel -> peer
        self._posted: dict[tuple[int, int], deque[Recv]] = {}
        self._early: dict[tuple[int, int], deque[bytes]] = {}
        self._gone: dict[int, LinkError] = {}  # peers whose channel ended
        self._left: set[int] = set()  # peers that said bye
        # peers that shut down -> the operations they took part in, by tag space (0: the whole
        # group's; a process set's id)
        self._shut: dict[int, dict[int, int]] = {}
        self._bye_sent = False
        self._dropped: set[int] = set()  # operations whose data messages are discarded (``drop``)
        self._broken: LinkError | None = None  # a peer died: every operation fails
        self._placing: Recv | None = None  # the receive the message being read goes into
        self._adds: list[Channel] = []
        self._closing = False
        self._stop = False
        self._wake = Wake()
        self._poller = Poller()
        self._poller.add(self._wake)
        self._listeners = listeners
        self._offer = sharesegment.Offer()
        self._members = [
            r for r, w in enumerate(book.workers) if w.host_key == book.workers[self._rank].host_key
        ]
        #: this host's shared-memory segment, where it has several workers (``hostsegment``; None: none)
        self.local: Local | None = None
        for listener in listeners:
            listener.on_accept = self._accepted
            self._poller.add(listener)
        self._thread = threading.Thread(target=self._run, name=f"collective-recv-{self._rank}", daemon=True)
        self._thread.start()
        try:
            self._connect(cfg.start_timeout)
            self.local = sharesegment.setup(self, self._members, self._chan, self._offer, cfg)
        except BaseException:
            self.close()
            raise

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def book(self) -> Book:
        """The book of the epoch these links were made in."""
        return self._book

    @property
    def size(self) -> int:
        return self._size

    def raise_failure(self) -> None:
        """Raise ``PeerShutDown`` when this thread's operation is one that a peer which shut down
        takes no part in; else the job's failure as the scheduler reported it, if any. (In that
        order: another waiting rank that fails first on the same peer's shutdown ends the job,
        and this rank's error, and its waited line for the launcher, still name that peer. In an
        elastic job a membership change is told before a shutdown, as the group forms again.)"""
        if self._shut and not self.elastic:
            self._raise_shut_down()
        try:
            self.node.raise_failure()
        except NodeFailure as exc:
            raise self.failed(exc) from None
        self.changed()
        if self._shut:
            self._raise_shut_down()
        stalls.watched()

    def changed(self) -> None:
        """In an elastic job: ``MembershipChanged`` once the membership has changed since this
        group's epoch. A group broken by a peer's end first waits (the heartbeat bound at most)
        for the scheduler's next book, so that every survivor fails with that one error."""
        if not self.elastic:
            return
        if self._broken is not None:
            try:
                self.node.wait_book(self._book.epoch, self.node.grace_s)
            except NodeFailure as exc:
                raise self.failed(exc) from None
        changed = self.node.changed_since(self._book.epoch)
        if changed is not None:
            raise changed

    def _raise_shut_down(self) -> None:
        at = stalls.running_slot()
        if at is None:
            return
        seq, space = at
        with self._lock:
            gone = sorted((p, s[space]) for p, s in self._shut.items() if space in s and seq >= s[space])
        if gone:
            peer, n = gone[0]
            ops = "its first operation" if n == 0 else f"its {n} operation{'s' if n > 1 else ''}"
            ops += f" of process set {space}" if space else ""
            raise self.failed(
                PeerShutDown(
                    f"collective: rank {peer} ({self.where(peer)}) shut down (closed its group) after "
                    f"{ops}, while rank {self._rank} waits for it in {stalls.current()}: every rank "
                    "makes the same operations before it shuts down",
                    peer,
                )
            )

    def health(self) -> None:
        """Raise the job's failure, or the error of the peer whose death broke the group."""
        self.raise_failure()
        if self._broken is not None:
            raise self.failed(self._broken)

    def failed(self, error: BaseException) -> BaseException:
        """``error``, which ends a wait of this thread's operation: when it names another worker
        (``worker 1``, ``rank 1``), this worker first says, once, that it waited for that worker
        in that operation (``dmlc_env.ending.say_waited``: the launcher tells what that worker did,
        e.g. exited 0 early)."""
        node = getattr(error, "node", None)
        op = stalls.running_op()
        if not self._said_waited and op is not None and isinstance(node, str):
            name = "worker " + node[len("rank ") :] if node.startswith("rank ") else node
            if name != self.node.name:
                self._said_waited = True
                say_waited(name, op)
        return error

    def warn(self, message: str) -> None:
        """A stall warning of a wait (``handles.Recv``, ``hostsegment.Local``)."""
        self.log.warning("%s", message)

    def where(self, peer: int) -> str:
        """``worker 3 on hostname``."""
        host = self._book.workers[peer].host_key.split("|")[0]
        return f"worker {peer} on {host or '?'}"

    # -- setting up ----------------------------------------------------------------------------

    def _connect(self, bound_s: float) -> None:
        """Connect to every higher rank, then wait (at most ``bound_s``) for every lower one."""
        for peer in range(self._rank + 1, self._size):
            ch = channels.open_channel(self._book.workers[peer], self.cfg, self._trace, self.log)
            self._accepted(ch)
            with self._lock:
                self._chan[peer], self._who[ch] = ch, peer
                self._adds.append(ch)
            ch.post(protocol.hello(self._rank))
            self._wake.ring()
        deadline = time.monotonic() + bound_s
        while True:
            with self._lock:
                if len(self._chan) + len(self._gone) >= self._size - 1:
                    return
                self._lock.wait(SLICE_S)
            self.node.raise_failure()
            self.changed()
            if time.monotonic() > deadline:
                missing = [p for p in range(self._rank) if p not in self._chan]
                raise KVError(
                    f"collective: rank {self._rank}: ranks {missing} did not connect in {bound_s:g} s"
                )

    def _accepted(self, ch: Channel) -> None:
        ch.place = lambda header, lens: self._place(ch, header, lens)

    # -- the receiving thread ------------------------------------------------------------------

    def _run(self) -> None:
        poller = self._poller
        while not self._stop:
            try:
                poller.serve(self._handle, 1.0, self._closed)
            except Exception:  # never leave the group without its receiver silently
                self.log.exception("collective: the receiving thread failed")
                self._fail(LinkError(f"collective: rank {self._rank}'s receiving thread failed", self._rank))
                return
            if self._adds:
                with self._lock:
                    adds, self._adds = self._adds, []
                for ch in adds:
                    poller.add(ch)

    def _place(self, ch: Channel, header: wire.Header, lens: list[int]) -> Sequence[memoryview | None]:
        """Where a message's frame goes: straight into its posted receive, when there is one."""
        peer = self._who.get(ch)
        if header.op != protocol.DATA or len(lens) != 1 or peer is None:
            return []
        try:
            key = (peer, protocol.tag_of(header))
        except WireError:
            return []
        op = self._placing = self._take_posted(key)
        return [] if op is None else [op.view]

    def _handle(self, msg: Received) -> None:
        h, ch = msg.header, msg.reply
        assert isinstance(ch, Channel)
        peer = self._who.get(ch)
        if h.op == protocol.HELLO and peer is None:
            self._hello(ch, h)
        elif h.op in (protocol.DATA, protocol.SHM) and peer is not None:
            try:
                if h.op == protocol.SHM:
                    self._offer.take(h, ch, len(self._members))
                elif ch.caps.frames:
                    self._data(peer, h, msg.frames)
                else:
                    self._data_fd(peer, h, ch)
            except (WireError, KVError, OSError) as exc:
                self.log.warning("collective: closed the channel of rank %d: %s", peer, exc)
                ch.close()
        elif h.op == protocol.BYE and peer is not None:
            ops, sets = protocol.ops_of(h), protocol.sets_of(h)
            with self._lock:
                self._left.add(peer)
                if ops is not None:
                    self._shut[peer] = {**sets, 0: ops}
        else:
            self.log.warning("collective: closed a channel that sent %s out of turn", h.op)
            ch.close()

    def _hello(self, ch: Channel, h: wire.Header) -> None:
        try:
            peer = wire.body_int(h, "rank")
        except WireError:
            peer = -1
        with self._lock:
            if not 0 <= peer < self._rank or peer in self._chan:
                self.log.warning("collective: closed a channel that said it was rank %d", peer)
                ch.close()
                return
            self._chan[peer], self._who[ch] = ch, peer
            self._lock.notify_all()

    def _data(self, peer: int, h: wire.Header, frames: list[Any]) -> None:
        op, self._placing = self._placing, None
        if op is not None:  # ``_place`` gave it this message's frame
            if frames and frames[0].placed:
                op.finish()
            else:
                op.finish(self.mismatch(op, len(frames[0].buffer) if frames else -1))
            return
        tag = protocol.tag_of(h)
        data = bytes(frames[0].buffer) if len(frames) == 1 else None
        if data is None:
            self.log.warning("collective: dropped a message of rank %d with %d frames", peer, len(frames))
            return
        self._keep((peer, tag), data)  # (or the receive posted after ``_place`` looked)

    def _data_fd(self, peer: int, h: wire.Header, ch: Channel) -> None:
        """A same-host message: its bytes are in the memfd that came with it (``channels``)."""
        key, n = (peer, protocol.tag_of(h)), wire.body_int(h, "n")
        if n < 0:
            raise WireError(f"a message of {n} bytes")
        channels.deliver(ch, key, n, self._take_posted, self._keep)

    def _take_posted(self, key: tuple[int, int]) -> Recv | None:
        """The first receive posted for ``key``, unless earlier messages for it wait."""
        with self._lock:
            queue = self._posted.get(key)
            if not queue or self._early.get(key):
                return None
            op = queue.popleft()
            if not queue:
                del self._posted[key]
            return op

    def _keep(self, key: tuple[int, int], data: bytes) -> None:
        """A message that came before its receive: kept, unless the receive was posted meanwhile
        (or its operation was dropped: ``drop``)."""
        with self._lock:
            if self._dropped and data_op(key[1]) in self._dropped:
                return
            queue = self._posted.get(key)
            if not queue or self._early.get(key):
                self._early.setdefault(key, deque()).append(data)
                return
            op = queue.popleft()
            if not queue:
                del self._posted[key]
        op.fill(data)

    def _closed(self, source: Source) -> None:
        """A channel ended: a peer that said bye left; any other died, which breaks the group."""
        if source is self._wake or not isinstance(source, Channel):
            return
        op, self._placing = self._placing, None
        with self._lock:
            peer = self._who.pop(source, None)
            if peer is None:
                return  # an accepted connection that never said who it was
            if self._chan.get(peer) is source:
                del self._chan[peer]
            left = self._closing or peer in self._left
        if left:
            err = LinkError(f"collective: rank {peer} ({self.where(peer)}) left the group", peer)
            self._fail(err, op, everyone=False)
            return
        why = f" ({source.interrupted})" if source.interrupted else ""
        err = LinkError(
            f"collective: rank {peer} ({self.where(peer)}) closed its connection to rank {self._rank}"
            f"{why}: it died or stopped, and the group is broken",
            peer,
        )
        self._peer_gone(err, op)

    def _peer_gone(self, err: LinkError, op: Recv | None = None) -> None:
        """``err.peer`` died: tell the scheduler (so the launcher names it; not once this rank said
        bye: it only waits for the others to finish, and those that waited for the peer tell) and
        break the group."""
        self.log.error("%s", err)
        if self._broken is None and not self._bye_sent:
            name = self._book.worker_name(err.peer)  # (an elastic job's worker: dropped, not ended)
            report_abort(self.node, self.cfg, name, str(err), REPORT_S, self._book.epoch)
        self._fail(err, op)

    def _fail(self, err: LinkError, op: Recv | None = None, everyone: bool = True) -> None:
        """Fail the pending receives from ``err.peer`` (``everyone``: all of them, and the group)."""
        with self._lock:
            if everyone and self._broken is None:
                self._broken = err
            self._gone.setdefault(err.peer, err)
            keys = [k for k in self._posted if everyone or k[0] == err.peer]
            failed = [o for k in keys for o in self._posted.pop(k)]
            self._lock.notify_all()
        for o in [op, *failed]:
            if o is not None:
                o.finish(err)

    # -- the Links interface -------------------------------------------------------------------

    def _check(self, peer: int) -> LinkError | None:
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"rank {self._rank}: no link to rank {peer} (group of {self._size})")
        return self._broken or self._gone.get(peer)

    def send(self, peer: int, tag: int, buffer: np.ndarray) -> Done:
        """Post a copy of ``buffer``'s bytes to ``peer``; complete at once."""
        view = bytes_of(buffer, writable=False)
        err = self._check(peer)
        ch = self._chan.get(peer)
        if err is not None:
            self.node.raise_failure()
            self.changed()
            raise err
        if ch is None:
            raise LinkError(f"collective: rank {self._rank} has no channel to rank {peer}", peer)
        try:
            if isinstance(ch, TcpChannel):  # only what the kernel does not take at once is copied
                ch.post(protocol.data(tag), [view], borrowed=True)
            elif ch.caps.frames:
                ch.post(protocol.data(tag), [np.frombuffer(view, np.uint8).copy()])
            else:
                channels.send(ch, protocol.data(tag, len(view)), view)
        except (ChannelClosed, KVError, OSError) as exc:
            self.node.raise_failure()
            self.changed()
            err, gone = self._gone.get(peer), isinstance(exc, ChannelClosed | OSError)
            if err is None:
                tail = ": it died or stopped, and the group is broken" if gone else ""
                err = LinkError(
                    f"collective: sending to rank {peer} ({self.where(peer)}) failed: {exc}{tail}", peer
                )
                if gone:  # before the receiving thread saw its channel close
                    self._peer_gone(err)
                    self.node.raise_failure()  # the job's failure naming the peer, once it came back
                    self.changed()
            raise err from None
        return DONE

    def recv(self, peer: int, tag: int, out: np.ndarray) -> Recv:
        """Post a receive from ``peer`` into ``out``; returns at once."""
        op = Recv(self, peer, tag, bytes_of(out, writable=True))
        key = (peer, tag)
        with self._lock:
            if self._dropped:  # a later operation with a dropped one's tag bits (SEQ_WRAP later)
                self._dropped.discard(data_op(tag))
            err = self._check(peer)
            if err is not None:
                op.finish(err)
                return op
            queue = self._early.get(key)
            if not queue:
                self._posted.setdefault(key, deque()).append(op)
                return op
            data = queue.popleft()
            if not queue:
                del self._early[key]
        op.fill(data)
        return op

    def drop(self, seq: int, space: int = 0) -> None:
        """Forget the data messages of operation ``seq`` of tag space ``space`` (0: the whole
        group's; a process set's: ``SubLinks``), not its control messages: its posted receives are
        withdrawn, and what came or comes for it is discarded, until a receive of a later operation
        with the same tag bits (``SEQ_WRAP`` operations later) is posted. The ranks found they
        disagree on it, and no operation runs in its slot (``collective.speculation``)."""
        bits = op_bits(seq, space)
        with self._lock:
            self._dropped.add(bits)
            for table in (self._posted, self._early):
                for key in [k for k in table if data_op(k[1]) == bits]:
                    del table[key]

    def cancel(self, op: Recv) -> bool:
        """Withdraw a pending receive; ``False`` when it was matched meanwhile."""
        with self._lock:
            queue = self._posted.get((op.peer, op.tag))
            if queue is None or op not in queue:
                return False
            queue.remove(op)
            if not queue:
                del self._posted[(op.peer, op.tag)]
            return True

    def mismatch(self, op: Recv, got: int) -> LinkError:
        return LinkError(
            f"collective: rank {op.peer} ({self.where(op.peer)}) sent {got} bytes to rank {self._rank} "
            f"(tag {op.tag:#x}), which expected {len(op.view)}; the ranks disagree on the operation",
            op.peer,
        )

    def leave(self, ops: int | None = None, sets: Mapping[int, int] | None = None) -> None:
        """Say bye to every peer (once): this rank took part in its group's operations ``0 .. ops -
        1`` (and in those of the process sets ``sets`` lists: id -> operations) and will take part
        in no other (a peer waiting for it in a later one fails at once, ``PeerShutDown``). The
        channels stay open (``close`` closes them)."""
        with self._lock:
            if self._bye_sent:
                return
            self._bye_sent = True
            chans = list(self._chan.values())
        for ch in chans:
            with contextlib.suppress(ChannelClosed, KVError, OSError):
                ch.post(protocol.bye(ops, sets))

    def close(self) -> None:
        """Say bye to every peer (unless ``leave`` did), stop the receiving thread and close the
        channels (what is queued is given ``FLUSH_S`` to go out). Peers' channels ending after this
        are not failures."""
        self.leave()
        with self._lock:
            if self._closing:
                return
            self._closing = True
            chans = list(self._chan.values())
        self._stop = True
        self._wake.ring()
        if self._thread is not threading.current_thread():
            self._thread.join()
            self._poller.close()  # (its items are still listed and removed below)
        for listener in self._listeners:
            self._poller.remove(listener)
            listener.on_accept = None
        for ch in {*chans, *(s for s in self._poller.sources() if isinstance(s, Channel))}:
            ch.close(flush_s=FLUSH_S)
        self._wake.close()
        if self.local is not None:
            self.local.close()


def report_abort(
    node: Postoffice, cfg: NodeConfig, name: str, reason: str, wait_s: float, epoch: int = 0
) -> None:
    """Tell the scheduler that node ``name`` died (unless the job failed already), so that it ends
    the job for every node naming it; wait (at most ``wait_s``) until its word comes back through
    the heartbeat thread, which the waits then raise first. On a channel of its own (the node's
    channel to the scheduler belongs to the thread that calls ``barrier`` and ``finish``)."""
    transport = node.transport
    if node.failure is not None or transport is None:
        return
    ch = transport.connect(scheduler_endpoint(cfg))
    try:
        ch.send(wire.Header(op=node_protocol.ABORT, src=node.name, body={"reason": reason, "node": name}))
        deadline = time.monotonic() + wait_s
        while not node.live.failed.wait(0.05) and node.book.epoch == epoch:  # (or its next epoch)
            if time.monotonic() > deadline:
                say_peer_failed(name)
                break  # for the launcher (the heartbeat thread says it with the abort)
    finally:
        ch.close(flush_s=0.0 if node.live.failed.is_set() else 1.0)
