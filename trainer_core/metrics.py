"""Figures a process reports to the launcher's metrics endpoint (docs/metrics.md).

A training script calls ``report(step=..., loss=..., accuracy=..., samples=..., **more)``; the
KV store and the server add their own figures as *sources* (callables read when a report goes
out). One background thread per process sends the latest figures at most
every ``INTERVAL`` seconds as one signed datagram (``transport.datagram``). Nothing here blocks
or raises into training: ``report`` stores numbers under a lock, the thread does the rest, and a
slow or gone endpoint only means dropped datagrams.

Without ``LAUNCHKIT_METRICS_ADDR`` in the environment (MXNet's launch.py, a job started by hand,
a launcher that serves no endpoint) every call here is a no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import numbers
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import dmlc_env
from trainer_core.transport import wire
from trainer_core.transport.datagram import DatagramPeer

INTERVAL = 1.0  # seconds between reports, at most one report per interval
MAX_OWN = 32  # figures a script may report by name: with the sources', a report stays under 4 KiB
METRICS = "metrics"  # the op of a report's header (it never travels as a wire.py message)

Source = Callable[[], Mapping[str, float]]


class Reporter:
    """One process's reports: the latest figures, the sources, and the thread that sends them."""

    def __init__(
        self, connect: Callable[[], DatagramPeer], role: str, rank: int, interval: float = INTERVAL
    ) -> None:
        self.role = role
        self.rank = rank
        self.interval = interval
        self._connect = connect
        self._peer: DatagramPeer | None = None
        self._figures: dict[str, float] = {}
        self._sources: list[Source] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._seq = 0
        self._last_sent = 0.0
        self._thread: threading.Thread | None = None
        self._full = False
        self.log = logging.getLogger("trainer_core")

    # -- what the process adds ----------------------------------------------------------------
    def report(self, **figures: Any) -> None:
        """Keep the latest value of each figure; ``samples`` is added to ``samples_total``. At most
        ``MAX_OWN`` names are kept (a new one beyond them is ignored, with one warning)."""
        samples = figures.pop("samples", None)
        with self._lock:
            for name, value in figures.items():
                if not _number(value):
                    continue
                if name in self._figures or len(self._figures) < MAX_OWN:
                    self._figures[name] = float(value)
                elif not self._full:
                    self._full = True
                    self.log.warning(
                        "trainer_core metrics: more than %d figures; %r and later ones are not sent",
                        MAX_OWN,
                        name,
                    )
            if _number(samples):
                self._figures["samples_total"] = self._figures.get("samples_total", 0.0) + float(samples)
        self._start()

    def add_source(self, source: Source) -> None:
        with self._lock:
            self._sources.append(source)
        self._start()

    def remove_source(self, source: Source) -> None:
        """Stop reading ``source``; its last figures stay in the reports."""
        last = _read(source)
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)
            self._figures.update(last)

    def soon(self) -> None:
        """Send a report now rather than at the next interval (still at most one per interval)."""
        self._start()
        self._wake.set()

    # -- sending ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, float]:
        with self._lock:
            figures = dict(self._figures)
            sources = list(self._sources)
        for source in sources:
            figures.update(_read(source))
        return figures

    def send(self) -> None:
        """One report now, from the calling thread (non-blocking, never raises)."""
        peer = self._peer
        if peer is None or peer.closed:
            return
        figures = self.snapshot()
        with self._send_lock:
            self._seq = max(self._seq + 1, time.time_ns() // 1000)  # grows across restarts too
            body = {"role": self.role, "rank": self.rank, "t": time.time(), "m": figures}
            with contextlib.suppress(Exception):
                peer.send(wire.Header(op=METRICS, seq=self._seq, body=body))
            self._last_sent = time.monotonic()

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="trainer_core-metrics", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        try:
            self._peer = self._connect()
        except (OSError, ValueError) as exc:
            self.log.warning("trainer_core: no metrics reports (%s)", exc)
            return
        while not self._stop.is_set():
            wait = self.interval - (time.monotonic() - self._last_sent)
            if wait > 0:
                self._wake.wait(wait)
                if self._stop.is_set():
                    break
                wait = self.interval - (time.monotonic() - self._last_sent)
                if wait > 0 and self._wake.is_set():
                    self._stop.wait(wait)  # woken early: keep to one report per interval
            self._wake.clear()
            self.send()

    def close(self) -> None:
        """A last report (the final figures), then stop the thread."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        self.send()
        if self._peer is not None:
            self._peer.close()


def _number(v: Any) -> bool:
    """A finite real number (numpy's scalars too), not a bool."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _read(source: Source) -> dict[str, float]:
    try:
        return {k: float(v) for k, v in source().items() if _number(v)}
    except Exception:  # a source is telemetry: it never breaks a report, nor training
        return {}


def from_environ(environ: Mapping[str, str] | None = None) -> Reporter | None:
    """The reporter the environment asks for, or ``None`` (no endpoint, or no job identity)."""
    e = os.environ if environ is None else environ
    addr = e.get(dmlc_env.LAUNCHKIT_METRICS_ADDR, "")
    secret = e.get(dmlc_env.LAUNCHKIT_JOB_SECRET, "")
    job = e.get(dmlc_env.LAUNCHKIT_JOB_ID, "")
    role = e.get(dmlc_env.DMLC_ROLE, "worker")
    rank = e.get(dmlc_env.LAUNCHKIT_ROLE_RANK, "0")
    if not (addr and secret and job) or not rank.isdigit():
        return None
    return Reporter(lambda: DatagramPeer(addr, secret, job), role, int(rank))


_process: list[Reporter | None] = []  # the process's reporter, once looked up
_process_lock = threading.Lock()


def reporter() -> Reporter | None:
    """This process's reporter (made on first use from the environment), or ``None``."""
    if not _process:
        with _process_lock:
            if not _process:
                r = from_environ()
                if r is not None:
                    atexit.register(r.close)
                _process.append(r)
    return _process[0]


def report(
    step: float | None = None,
    loss: float | None = None,
    accuracy: float | None = None,
    samples: float | None = None,
    **more: float,
) -> None:
    """Report the training's figures (the latest of each is sent; ``samples`` accumulates into
    ``samples_total``). Cheap, never blocks, never raises; a no-op without a metrics endpoint."""
    r = reporter()
    if r is not None:
        given = {"step": step, "loss": loss, "accuracy": accuracy, "samples": samples, **more}
        r.report(**{k: v for k, v in given.items() if v is not None})


def add_source(source: Source) -> None:
    """Read ``source`` at every report of this process (figures of a KV store, a server...)."""
    r = reporter()
    if r is not None:
        r.add_source(source)


def remove_source(source: Source) -> None:
    r = reporter()
    if r is not None:
        r.remove_source(source)


def soon() -> None:
    """Send this process's figures now (e.g. once registered), within the rate bound."""
    r = reporter()
    if r is not None:
        r.soon()


def send_now() -> None:
    """Send this process's figures now, from the caller (one datagram, never waits): the last
    report of a process that ends without running ``atexit`` (a server's ``os._exit``)."""
    r = reporter()
    if r is not None:
        r.send()
