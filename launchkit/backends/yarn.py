"""``--launcher yarn``: the job as a YARN Service, through the ResourceManager's REST API.

No Java on the client. The launcher POSTs a service spec to ``/app/v1/services`` (Hadoop 3.2+):
one component per role (``scheduler`` x1, ``server`` xS, ``worker`` xW), every container running
``PYTHON -m launchkit.hostside.shim -- COMMAND...`` with restart policy NEVER. It then polls
``GET /app/v1/services/NAME`` and turns the containers' states into the shim's framed start and
end marks, so the supervisor sees one process per task as with every engine. Containers' output
is not streamed by the Service API (YARN keeps it: ``yarn logs -applicationId``). Ctrl-C,
``launchkit kill`` and a failure stop the service (PUT state STOPPED, then DELETE).

What YARN does to a spec, from Hadoop's source (docs/backends.md, section yarn, cites it): the
service AM replaces ``${TOKEN}``s (``${COMPONENT_ID}``, ``${USER}``, ``${DOMAIN}``, and every
variable's own name) in ``configuration.env`` values and in ``launch_command``; the NodeManager
then replaces ``<LOG_DIR>``, ``<CPS>``, ``{{`` and ``}}`` and writes ``export NAME="VALUE"`` and
``exec /bin/bash -c "COMMAND 1>LOG/stdout.txt 2>LOG/stderr.txt"`` into the container's launch
script, without escaping. ``script_value`` and ``launch_command`` encode values so that they come
out of all three layers unchanged.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from launchkit.backends.engine import EngineBackend, EngineRun, Feed
from launchkit.backends.yarnspec import (
    APPS_PATH,
    CODE_RM_LOST,
    DEFAULT_MEMORY_MB,
    DEFAULT_PORT,
    FAST_FOR,
    HTTP_TIMEOUT,
    KILL_WAIT,
    POLL,
    RM_LOST_AFTER,
    SERVICE_FINAL,
    SERVICES_PATH,
    SLOW_POLL,
    STOP_WAIT,
    YarnOptions,
    app_code,
    app_id_of,
    container_code,
    instance_task,
    lifetime_for,
    memory_mb,
    parse_file,
    redacted,
    scheduler_host,
    service_name,
    service_spec,
)
from launchkit.core.spec import Host, LaunchSpec, Plan, Task
from launchkit.errors import BackendError, UsageError
from launchkit.hostside import shim


class YarnError(OSError):
    """The RM answered with an error, or could not be reached (``status`` 0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # 3xx surface as HTTPError: followed by hand, keeping the method and body


class RmClient:
    """The few calls the backend makes, with simple auth (``user.name``). A standby RM's
    redirect to the active one is followed with the same method and body."""

    def __init__(self, base_url: str, user: str, timeout: float = HTTP_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    def service_url(self, name: str | None = None) -> str:
        path = SERVICES_PATH + (f"/{urllib.parse.quote(name, safe='')}" if name else "")
        return self._with_user(self.base_url + path)

    def _with_user(self, url: str) -> str:
        if "user.name=" in url:
            return url
        return url + ("&" if "?" in url else "?") + urllib.parse.urlencode({"user.name": self.user})

    def request(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        """(status, parsed JSON or None). Raises YarnError when the RM cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        for _ in range(4):
            req = urllib.request.Request(url, data=data, method=method)
            req.add_header("Accept", "application/json")
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    return resp.status, _json(resp.read())
            except urllib.error.HTTPError as err:
                location = err.headers.get("Location") if err.headers else None
                if err.code in (301, 302, 303, 307, 308) and location:
                    url = self._with_user(urllib.parse.urljoin(url, location))
                    continue
                with contextlib.suppress(OSError):
                    return err.code, _json(err.read())
                return err.code, None
            except (OSError, ValueError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise YarnError(f"cannot reach the ResourceManager at {self.base_url}: {reason}") from None
        raise YarnError(f"{method} {url}: too many redirects")

    def create(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        status, body = self.request("POST", self.service_url(), spec)
        if status not in (200, 201, 202):
            hint = ""
            if status in (401, 403):
                hint = " (this backend authenticates with user.name only; it does not speak Kerberos/SPNEGO)"
            raise YarnError(
                f"the ResourceManager refused the service (HTTP {status}): {_diag(body)}{hint}", status
            )
        return body if isinstance(body, dict) else {}

    def get(self, name: str) -> dict[str, Any] | None:
        """The service as YARN shows it; None once it does not exist (404)."""
        status, body = self.request("GET", self.service_url(name))
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise YarnError(f"GET service {name}: HTTP {status}: {_diag(body)}", status)
        return body

    def stop(self, name: str) -> str:
        """PUT state STOPPED; the RM's message. 'already stopped' and 'not found' are no error."""
        status, body = self.request("PUT", self.service_url(name), {"state": "STOPPED"})
        if status in (200, 204) or (status in (400, 404) and _gone(body)):
            return _diag(body)
        raise YarnError(f"stop service {name}: HTTP {status}: {_diag(body)}", status)

    def destroy(self, name: str) -> str:
        """DELETE (stops it first if it runs); a service already gone is no error."""
        status, body = self.request("DELETE", self.service_url(name))
        if status in (200, 204, 404) or (status == 400 and _gone(body)):
            return _diag(body)
        raise YarnError(f"delete service {name}: HTTP {status}: {_diag(body)}", status)

    def app(self, app_id: str) -> dict[str, Any] | None:
        """The RM's report of the application (``/ws/v1/cluster/apps/ID``), or None."""
        url = self._with_user(f"{self.base_url}{APPS_PATH}/{urllib.parse.quote(app_id, safe='')}")
        status, body = self.request("GET", url)
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("app"), dict):
            return None
        app: dict[str, Any] = body["app"]
        return app


def _json(data: bytes) -> Any:
    if not data.strip():
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"diagnostics": data.decode(errors="replace").strip()[:500]}


def _diag(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("diagnostics") or body.get("message") or json.dumps(body))[:500]
    return "" if body is None else str(body)[:500]


def _gone(body: Any) -> bool:
    text = _diag(body).lower()
    return any(w in text for w in ("already stopped", "not found", "doesn't exist", "does not exist"))


# -- following the service ---------------------------------------------------------------------
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


def check_rm(client: RmClient) -> str:
    """``GET /app/v1/services/version``: the RM's Hadoop version, or BackendError (exit 1)."""
    url = client.service_url("version")
    try:
        status, body = client.request("GET", url)
    except YarnError as exc:
        raise BackendError("yarn", f"{exc}; nothing started") from None
    if status in (401, 403):
        raise BackendError(
            "yarn",
            f"the ResourceManager at {client.base_url} refused user {client.user!r} (HTTP {status}): "
            "this backend authenticates with user.name only (no Kerberos/SPNEGO)",
        )
    if status != 200:
        raise BackendError(
            "yarn",
            f"the ResourceManager at {client.base_url} has no YARN Service API (GET {SERVICES_PATH}/version: "
            f"HTTP {status}); it needs Hadoop 3.2+ with yarn.webapp.api-service.enable=true",
        )
    return str(body.get("hadoop_version") or "") if isinstance(body, dict) else ""


def stop_argv(rm_url: str, service: str, user: str) -> list[str]:
    """What the reaper runs (no shell) to end the service if the launcher dies."""
    return [sys.executable, "-m", "launchkit.backends.yarn", "stop", rm_url, service, "--user", user]


# -- the backend -------------------------------------------------------------------------------
class YarnBackend(EngineBackend):
    name = "yarn"
    engine_label = "yarn"

    def __init__(
        self,
        *,
        yarn: YarnOptions | None = None,
        node_python: str | None = None,
        console: object = None,
    ) -> None:
        super().__init__(console)
        base = yarn or YarnOptions()
        self.opts = replace(base, python=node_python or base.python)
        self.check_options(self.opts)
        self.client = RmClient(self.opts.base_url, self.opts.user_name)
        self.time_limit: float | None = None
        self.grace = 5.0
        self.gpus_per_worker: int | None = None
        self.yarn_run: YarnRun | None = None
        self.rm_version = ""

    @staticmethod
    def check_options(opts: YarnOptions) -> None:
        url = urllib.parse.urlsplit(opts.base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise UsageError(f"--yarn-rm {opts.base_url!r}: expected http://HOST:PORT of the ResourceManager")
        for flag, cpus in (
            ("--cpus-per-server", opts.cpus_per_server),
            ("--cpus-per-worker", opts.cpus_per_worker),
        ):
            if cpus is not None and cpus < 1:
                raise UsageError(f"{flag} must be at least 1, got {cpus}")
        memory_mb(opts.mem_per_server, DEFAULT_MEMORY_MB, "--mem-per-server")
        memory_mb(opts.mem_per_worker, DEFAULT_MEMORY_MB, "--mem-per-worker")
        names = [parse_file(f).dest for f in opts.files]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise UsageError(f"--yarn-file: two files named {sorted(dup)[0]!r} in the container")
        if opts.domain is not None and not re.match(
            r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$", opts.domain
        ):
            raise UsageError(f"--yarn-domain {opts.domain!r}: expected a DNS domain")

    def _learn(self, spec: LaunchSpec) -> None:
        self.time_limit = spec.time_limit
        self.grace = spec.grace_period
        self.gpus_per_worker = spec.gpus_per_worker

    # -- Backend hooks --------------------------------------------------------------------------
    def connect(self, spec: LaunchSpec) -> str | None:
        """Fail fast, before anything is planned or recorded: is the RM there, with its Service
        API on (``yarn.webapp.api-service.enable``), and does it let us in?"""
        self._learn(spec)
        self.rm_version = check_rm(self.client)
        return None

    def finds_scheduler_address(self) -> bool:
        return True  # the scheduler's container is placed by YARN: its name, a fixed port

    def scheduler_summary(self, root_uri: str, port: int) -> str:
        if self.plan is None:
            return "scheduler in its own container"
        name = service_name(self.plan.job_id)
        return f"scheduler {scheduler_host(name, self.opts.domain)}:{port or DEFAULT_PORT} (its container)"

    def node_hosts(self, spec: LaunchSpec) -> dict[Host, str] | None:
        self._learn(spec)
        return dict.fromkeys(spec.hosts, "")  # each task's shim finds its node's address

    def engine_runs(self, task: Task) -> bool:
        return True  # the scheduler is a container too

    def node_unknown(self, task: Task) -> bool:
        return True  # YARN places every container; the start mark names its node

    def spec_for(self, plan: Plan) -> dict[str, Any]:
        return service_spec(
            plan,
            self.opts,
            lifetime=lifetime_for(self.time_limit, self.grace),
            gpus_per_worker=self.gpus_per_worker,
        )

    def describe(self, task: Task) -> list[str]:
        return [self.opts.python, "-m", "launchkit.hostside.shim", "--", *task.argv]

    def describe_job(self, plan: Plan) -> list[list[str]]:
        url = self.client.service_url()
        return [
            [
                "curl",
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@SERVICE.json",
                url,
            ]
        ]

    def notes(self, plan: Plan) -> list[str]:
        spec = self.spec_for(plan)
        host = scheduler_host(spec["name"], self.opts.domain)
        port = plan.root_port or DEFAULT_PORT
        return [
            f"submitted as the YARN service {spec['name']} through the ResourceManager's REST API "
            "(the launcher uses urllib; the curl line is the equivalent); SERVICE.json is below",
            f"scheduler: {host}:{port} (the scheduler container's Registry DNS name; YARN fills in "
            "${USER} and ${DOMAIN})",
            "the job's variables, secret included, travel in the service spec (YARN has no "
            "pass-by-name): YARN stores it and shows it to whoever may view the service",
            "containers' output is not streamed: yarn logs -applicationId APPLICATION_ID",
            "SERVICE.json (secret hidden): " + json.dumps(redacted(spec), separators=(",", ":")),
        ]

    def record_info(self) -> dict[str, Any] | None:
        if self.plan is None:
            return None
        return {"engine": "yarn", "service": service_name(self.plan.job_id), "rm_url": self.opts.base_url}

    def make_run(self, plan: Plan) -> EngineRun:
        self.yarn_run = YarnRun(self.client, self.spec_for(plan), plan)
        self.yarn_run.rm_version = self.rm_version
        return self.yarn_run

    def engine_end_message(self, code: int) -> str:
        run = self.yarn_run
        if run is None:
            return super().engine_end_message(code)
        how = run.final_state or f"exit {code}"
        return (
            f"the YARN service {run.name} ended ({how}) before this container's end was seen; "
            f"its output: {run.logs_hint()}"
        )


# -- python -m launchkit.backends.yarn stop URL SERVICE [--user USER] ----------------------------
def main(argv: list[str]) -> int:
    """The reaper's cleanup: stop the service, then delete it (a service already gone is fine)."""
    args = list(argv)
    user = None
    if "--user" in args:
        at = args.index("--user")
        user = args[at + 1] if at + 1 < len(args) else None
        del args[at : at + 2]
    if len(args) != 3 or args[0] != "stop":
        sys.stderr.write("usage: python -m launchkit.backends.yarn stop RM_URL SERVICE [--user USER]\n")
        return 2
    client = RmClient(args[1], user or YarnOptions().user_name, timeout=8.0)
    ok = True
    for step in (client.stop, client.destroy):
        try:
            step(args[2])
        except YarnError as exc:
            sys.stderr.write(f"{exc}\n")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
