"""The job's metrics endpoint: a UDP socket that takes signed reports from the job's processes,
and a sampler of the launcher's own host; both fill one ``JobMetrics`` (docs/metrics.md).

``Telemetry`` binds the address the job's hosts reach the launcher at (``address``, given to
every process as ``LAUNCHKIT_METRICS_ADDR``), on a port the OS picks. Its receiver thread keeps
only datagrams signed with the job's secret, for this job, newer than the last one of the same
sender (``dmlc_env.telemetry``); everything else is counted in ``dropped`` and forgotten. The
local sampler (``watch_local``) reads this host and the job's processes on it every second with
the code the ssh hosts' watchdogs run (``hostside.hoststat``); remote hosts' figures arrive with
their watchdogs' heartbeats through ``host_report``. It lives as long as the job (across restart
attempts: the same secret), and ``close`` ends both threads.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dmlc_env import telemetry as wire
from launchkit.backends.base import Backend
from launchkit.hostside import hoststat, procscan
from launchkit.telemetry.model import JobMetrics

SAMPLE_EVERY = 1.0


class Telemetry:
    def __init__(self, job_id: str, secret: str, bind_host: str, model: JobMetrics | None = None) -> None:
        self.job_id = job_id
        self.model = model or JobMetrics()
        self.received = 0
        self.dropped = 0
        self._key = wire.metrics_key(secret)
        self._fresh = wire.Fresh()
        family, _, _, _, where = socket.getaddrinfo(bind_host, 0, type=socket.SOCK_DGRAM)[0]
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self._sock.bind(where)
        except OSError:
            self._sock.close()
            raise
        self._sock.settimeout(0.2)
        host, port = self._sock.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._receive, name="metrics-endpoint", daemon=True)]
        self._threads[0].start()
        self._known: dict[tuple[int, int], bool] = {}  # (pid, start) of a group leader -> in this job

    # -- reports from the job's processes -------------------------------------------------
    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(wire.MAX_DATAGRAM + 1)
            except TimeoutError:
                continue
            except OSError:
                return
            self.accept(data)

    def accept(self, data: bytes) -> bool:
        """Take one datagram: into the model if it is a fresh report of this job, else dropped."""
        report = wire.decode(self._key, self.job_id, data)
        if report is None or not self._fresh(report):
            self.dropped += 1
            return False
        self.received += 1
        self.model.node_report(report.role, report.rank, time.time(), report.figures)
        return True

    # -- hosts ------------------------------------------------------------------------------
    def host_report(
        self, host: str, figures: Mapping[str, Any], procs: Mapping[int, tuple[float | None, int]]
    ) -> None:
        """A host's figures and its job processes' usage (an ssh host's watchdog heartbeat)."""
        self.model.host_report(host, time.time(), figures, procs)

    def watch_local(self, host: str, groups: Callable[[], Iterable[int]] | None = None) -> None:
        """Sample this host every second as ``host``: its figures and the job's processes on it
        (``groups``: their process groups; by default every group whose leader carries this job's
        id in its environment). Once: a later call changes nothing."""
        if len(self._threads) > 1:
            return  # already sampling (a restart attempt of the same job)
        thread = threading.Thread(
            target=self._sample, args=(host, groups), name="metrics-sampler", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _sample(self, host: str, groups: Callable[[], Iterable[int]] | None) -> None:
        sampler = hoststat.Sampler()
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # best effort: a failed sample leaves the last one
                stats = hoststat.all_stats()
                wanted = set(groups()) if groups is not None else self.job_groups(stats)
                figures, procs = sampler.sample(wanted, stats)
                self.host_report(host, figures, procs)
            self._stop.wait(SAMPLE_EVERY)

    def job_groups(self, stats: list[hoststat.ProcStat]) -> set[int]:
        """The process groups of this host led by a process of this job (each job process leads
        one); a leader's environment is read once."""
        own_ns = procscan.pid_namespace("self")
        found = set()
        live = set()
        for st in stats:
            if st.pgrp != st.pid or st.pid == os.getpid():
                continue
            key = (st.pid, st.start)
            live.add(key)
            if key not in self._known:
                self._known[key] = (
                    self.job_id in procscan.job_ids_of(st.pid) and procscan.pid_namespace(st.pid) == own_ns
                )
            if self._known[key]:
                found.add(st.pid)
        self._known = {k: v for k, v in self._known.items() if k in live}
        return found

    def close(self) -> None:
        """End both threads; the reports already waiting in the socket are taken first."""
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        self._sock.setblocking(False)
        with contextlib.suppress(OSError):
            while True:
                self.accept(self._sock.recv(wire.MAX_DATAGRAM + 1))
        self._sock.close()


def serve(job_id: str, secret: str, bind_host: str, backend: Backend) -> Telemetry | None:
    """The job's endpoint on ``bind_host`` (the address its hosts reach the launcher at), with
    the backend's host figures (an ssh backend's ``set_host_sink``) going into its model; ``None``
    when there is no such address (a batch job finds its own) or it cannot be bound here: then
    ``LAUNCHKIT_METRICS_ADDR`` stays unset and the processes report nothing."""
    if not bind_host:
        return None
    try:
        telemetry = Telemetry(job_id, secret, bind_host)
    except OSError:
        return None
    backend.set_host_sink(telemetry.host_report)
    return telemetry
