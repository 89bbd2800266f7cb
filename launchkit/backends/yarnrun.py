"""Following a submitted YARN service to its end (``YarnRun``, the yarn backend's ``EngineRun``).

It polls ``GET /app/v1/services/NAME`` (fast at first, then slower), turns the containers' states
into the shim's framed start and end marks, so the supervisor sees one process per task as with
every engine, and ends the service (PUT state STOPPED, then DELETE) on a signal, a failure or the
end. When the ResourceManager stops answering for ``RM_LOST_AFTER`` seconds the job ends with
``CODE_RM_LOST``; a service that ends before its containers were seen ends with the
application's final status (docs/backends.md, section yarn).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from launchkit.backends.engine import EngineRun, Feed
from launchkit.backends.yarnrest import RmClient, YarnError, stop_argv
from launchkit.backends.yarnspec import (
    CODE_RM_LOST,
    FAST_FOR,
    KILL_WAIT,
    POLL,
    RM_LOST_AFTER,
    SERVICE_FINAL,
    SLOW_POLL,
    STOP_WAIT,
    app_code,
    app_id_of,
    container_code,
    instance_task,
)
from launchkit.core.spec import Plan
from launchkit.hostside import shim


class YarnRun(EngineRun):
    """The submitted service, followed to its end by polling its state."""

    def __init__(
        self,
        client: RmClient,
        spec: Mapping[str, Any],
        plan: Plan,
        *,
        poll: float = POLL,
        rm_lost_after: float = RM_LOST_AFTER,
        stop_wait: float = STOP_WAIT,
        kill_wait: float = KILL_WAIT,
    ) -> None:
        self.client = client
        self.spec = dict(spec)
        self.name = str(spec["name"])
        self.poll = poll
        self.rm_lost_after = rm_lost_after
        self.stop_wait = stop_wait
        self.kill_wait = kill_wait
        self.index = {(t.role, t.rank): i for i, t in enumerate(plan.tasks)}
        self.app_id: str | None = None
        self.rm_version = ""
        self.state = ""
        self.final_state = ""
        self.started: dict[int, str] = {}  # plan index -> container id
        self.ended: set[int] = set()
        self.seen: dict[int, str] = {}  # plan index -> its container's last state
        self.stopping = False  # the launcher asked for the stop
        self._give_up_at: float | None = None  # once stopping: when to stop waiting for YARN
        self._started_at = time.monotonic()
        self._destroyed = False
        self._feed: Feed = lambda _line: None
        self._ended_evt = threading.Event()
        self._code = 0
        self._lock = threading.Lock()

    # -- EngineRun ------------------------------------------------------------------------------
    def start(self, feed_out: Feed, feed_err: Feed) -> None:
        self._feed = feed_out
        answer = self.client.create(self.spec)  # YarnError (an OSError): the launch fails
        self.app_id = app_id_of(answer)
        self.note(
            f"service {self.name} submitted to {self.client.base_url}"
            + (f" (Hadoop {self.rm_version})" if self.rm_version else "")
            + (f" as {self.app_id}" if self.app_id else "")
            + "; containers' output is kept by YARN: "
            + self.logs_hint()
        )
        threading.Thread(target=self._follow, name="yarn-follow", daemon=True).start()

    def wait(self) -> int:
        self._ended_evt.wait()
        return self._code

    def signal(self, sig: int) -> None:
        with self._lock:
            first = not self.stopping
            self.stopping = True
            now = time.monotonic()
            wait = self.kill_wait if sig == signal.SIGKILL else self.stop_wait
            if self._give_up_at is None or now + wait < self._give_up_at:
                self._give_up_at = now + wait
        if sig == signal.SIGKILL:
            threading.Thread(target=self._destroy, daemon=True).start()
        elif first:
            threading.Thread(target=self._stop, daemon=True).start()

    def cleanup_commands(self) -> list[list[str]]:
        return [stop_argv(self.client.base_url, self.name, self.client.user)]

    # -- helpers --------------------------------------------------------------------------------
    def logs_hint(self, container: str | None = None) -> str:
        app = self.app_id or "APPLICATION_ID"
        return f"yarn logs -applicationId {app}" + (f" -containerId {container}" if container else "")

    def note(self, message: str) -> None:
        """A line of the launcher's own, shown as ``[yarn] ...``."""
        self._feed(message.replace("\n", " ").encode() + b"\n")

    def _stop(self) -> None:
        try:
            self.note(f"stopping service {self.name}: {self.client.stop(self.name) or 'asked'}")
        except YarnError as exc:
            self.note(f"could not stop service {self.name}: {exc}")

    def _destroy(self) -> None:
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
        try:
            self.note(f"deleting service {self.name}: {self.client.destroy(self.name) or 'done'}")
        except YarnError as exc:
            self.note(
                f"could not delete service {self.name}: {exc}; delete it with: yarn app -destroy {self.name}"
            )

    def _emit_start(self, index: int, host: str, container: str) -> None:
        self.started[index] = container
        self._feed(shim.frame_event(index, "s", 0, host or "-", self.name, "-"))
        where = f"output of this process is not streamed by YARN: {self.logs_hint(container or None)}"
        for piece in shim.frame_output(index, "e", where.encode()):
            self._feed(piece)

    def _emit_end(self, index: int, code: int, stopped: int) -> None:
        if index in self.ended:
            return
        self.ended.add(index)
        for _ in range(2):  # one end mark per stream, as the shim writes them
            self._feed(shim.frame_event(index, "x", code, stopped))

    def _end_rest(self, code: int, stopped: int) -> None:
        for index in sorted(self.index.values()):
            self._emit_end(index, code, stopped)

    def _containers(self, service: Mapping[str, Any]) -> None:
        for comp in service.get("components") or []:
            for c in (comp or {}).get("containers") or []:
                instance = str(c.get("component_instance_name") or "")
                key = instance_task(instance)
                index = self.index.get(key) if key is not None else None
                if index is None or index in self.ended:
                    continue
                state = str(c.get("state") or "")
                if index not in self.started:
                    cid = str(c.get("id") or "")
                    host = str(c.get("bare_host") or c.get("hostname") or "-")
                    self.note(f"{instance} ({cid}) on {host}: {state}")
                    self._emit_start(index, host, cid)
                elif state != self.seen.get(index):
                    self.note(f"{instance}: {state}")
                self.seen[index] = state
                ended = container_code(state, self.stopping)
                if ended is not None:
                    self._emit_end(index, *ended)

    # -- the follower ---------------------------------------------------------------------------
    def _follow(self) -> None:
        code = 1
        try:
            code = self._loop()
        except Exception as exc:  # a bug must not leave the launcher waiting forever
            self.note(f"following service {self.name} failed: {exc!r}")
        finally:
            self._code = code
            if not self._destroyed:
                self._destroy()
            self._ended_evt.set()

    def _loop(self) -> int:
        lost_since: float | None = None
        while True:
            give_up = self._give_up_at
            if give_up is not None and time.monotonic() > give_up:
                self.note(
                    f"service {self.name} was asked to stop but did not say so; delete it with: yarn app -destroy {self.name}"
                )
                self._end_rest(143, 1)
                return 143
            try:
                service = self.client.get(self.name)
            except YarnError as exc:
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    self.note(f"{exc} (retrying)")
                elif now - lost_since > self.rm_lost_after:
                    self.note(f"no answer from the ResourceManager for {self.rm_lost_after:g}s: giving up")
                    return CODE_RM_LOST
                self._sleep()
                continue
            lost_since = None
            if service is None:  # gone: deleted (by us after a SIGKILL, or by someone else)
                return self._finish("gone")
            self.app_id = self.app_id or (str(service["id"]) if service.get("id") else None)
            state = str(service.get("state") or "")
            self._containers(service)
            if state != self.state:
                self.state = state
                self.note(f"service {self.name}: {state}")
            if state in SERVICE_FINAL:
                return self._finish(state)
            self._sleep()

    def _sleep(self) -> None:
        slow = time.monotonic() - self._started_at > FAST_FOR and not self.stopping
        time.sleep(max(self.poll, SLOW_POLL) if slow else self.poll)

    def _finish(self, state: str) -> int:
        """The service ended: the end of every task not seen ending, and the engine's code."""
        self.final_state = state
        if self.stopping:
            self._end_rest(143, 1)
            return 143
        if state == "SUCCEEDED":
            self._end_rest(0, 0)
            return 0
        if state == "FAILED":
            return 1  # the tasks not seen ending are lost (code 1), with engine_end_message
        # STOPPED, or gone: the current RM shows a finished service as STOPPED whether it
        # succeeded or not (ServiceClient.getStatus): the application's final status tells.
        report = None
        with contextlib.suppress(YarnError):
            report = self.client.app(self.app_id) if self.app_id else None
        if report is None:
            self.note(f"service {self.name} ended ({state}); no application report to tell how")
            return 1
        final = str(report.get("finalStatus") or "")
        diag = str(report.get("diagnostics") or "")
        self.note(f"application {self.app_id}: {report.get('state')}, final status {final or '?'}")
        code = app_code(final, diag)
        if code == 0:
            self._end_rest(0, 0)
        return code
