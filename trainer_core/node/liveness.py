"""Heartbeats: a background thread per node that keeps the node and the scheduler in touch.

The thread owns its own channel to the scheduler (a ZeroMQ DEALER), sends a heartbeat every
``interval`` seconds and watches the replies. It sets ``failed`` (with ``failure``, a
``NodeFailure`` naming the dead node) when the scheduler reports an abort, or when the
scheduler itself stays silent for ``timeout`` seconds; it sets ``terminated`` when the
scheduler ends the job normally. In an elastic job the scheduler sends each new book (the next
epoch's membership) here too: ``on_book`` gets it. It runs beside the user's code, so a long computation on a
healthy node never misses a beat. With heartbeats off (interval 0) it still sends one
heartbeat, so the scheduler can reach it, and relays aborts. What it learns is a ``Health``,
which the roles read; in-process tests use a bare ``Health`` and set it by hand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dmlc_env.ending import say_peer_failed
from trainer_core.errors import NodeFailure, WireError
from trainer_core.node import protocol
from trainer_core.node.book import Book, parse_book
from trainer_core.transport import wire
from trainer_core.transport.channel import Received
from trainer_core.transport.control import Transport


class Health:
    """What a node knows about the job's state: ``failed`` (with ``failure``) or ``terminated``.

    ``Liveness`` keeps it up to date from heartbeats; in-process tests set it by hand.
    """

    def __init__(self, node: str = "", log: logging.Logger | None = None) -> None:
        self.node = node
        self.log = log or logging.getLogger("trainer_core")
        self.on_failure: Callable[[NodeFailure], None] | None = None
        self.on_book: Callable[[Book], None] | None = None  # a new epoch's book (an elastic job)
        self.failed = threading.Event()
        self.terminated = threading.Event()
        self.failure: NodeFailure | None = None

    def fail(self, failure: NodeFailure) -> None:
        """Record the job's failure (the first one counts)."""
        if self.failure is None:
            # for the launcher: not this node's own failure (said first: once ``failure`` is set,
            # the main thread may raise it and exit before this thread writes another line)
            say_peer_failed(failure.node)
            self.failure = failure
            self.failed.set()
            self.log.error("trainer_core %s: %s", self.node, failure)
            if self.on_failure is not None:
                self.on_failure(failure)

    def stop(self) -> None:
        return None

    def heartbeat_age(self) -> float | None:
        """Seconds since the scheduler last answered a heartbeat (``None``: no heartbeats here)."""
        return None


class Liveness(Health):
    """The heartbeat thread of one node."""

    def __init__(
        self,
        transport: Transport,
        scheduler_endpoint: str,
        node: str,
        interval: float,
        timeout: float,
        log: logging.Logger,
        on_failure: Callable[[NodeFailure], None] | None = None,
        root: str = "scheduler",
    ) -> None:
        super().__init__(node, log)
        self.root = root  # the node that serves the scheduler: "worker 0" in a job without one
        self.transport = transport
        self.endpoint = scheduler_endpoint
        self.interval = interval
        self.timeout = timeout
        self.on_failure = on_failure
        self._stop = threading.Event()
        self._last_ack = 0.0
        self._thread = threading.Thread(target=self._run, name=f"trainer_core-heartbeat-{node}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread and wait until it has: it closes its own socket on the way out, so the
        caller may close the transport afterwards (never under a thread still using it). Its loop
        wakes every 0.2 s at most; from the thread itself (a failure hook) it only asks."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def heartbeat_age(self) -> float | None:
        return time.monotonic() - self._last_ack if self._last_ack else None

    def _run(self) -> None:
        sched = self.transport.connect(self.endpoint)
        on = self.interval > 0 and self.timeout > 0
        period = self.interval if on else 0.2
        self._last_ack = time.monotonic()
        next_beat = 0.0
        sent_once = False
        try:
            while not self._stop.is_set() and not self.failed.is_set():
                now = time.monotonic()
                if (on or not sent_once) and now >= next_beat:
                    sched.send(wire.Header(op=protocol.HEARTBEAT, src=self.node))
                    sent_once = True
                    next_beat = now + self.interval
                if sched.wait(min(period, 0.2)):
                    sched.receive(self._on_message)
                if on and time.monotonic() - self._last_ack > self.timeout and not self.terminated.is_set():
                    self.fail(
                        NodeFailure(
                            f"the scheduler ({self.endpoint}"
                            + ("" if self.root == "scheduler" else f", in {self.root}")
                            + f") answered no heartbeat for {self.timeout:g} s: it died or stopped; the job is over",
                            node=self.root,
                        )
                    )
        finally:
            sched.close()

    def _on_message(self, msg: Received) -> None:
        h = msg.header
        if h.op == protocol.HEARTBEAT_ACK:
            self._last_ack = time.monotonic()
        elif h.op == protocol.ABORT:
            node = h.body.get("node")
            reason = h.body.get("reason")
            self.fail(
                NodeFailure(
                    f"job aborted by the scheduler: {reason if isinstance(reason, str) else '?'}",
                    node=node if isinstance(node, str) else None,
                )
            )
        elif h.op == protocol.TERMINATE:
            self.terminated.set()
        elif h.op == protocol.BOOK and self.on_book is not None:
            try:
                new = parse_book(h, msg.frames)
            except (WireError, TypeError, KeyError, ValueError) as exc:
                self.log.warning("trainer_core %s: dropped a bad book from the scheduler: %s", self.node, exc)
                return
            self.on_book(new)
