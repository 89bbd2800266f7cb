"""A stand-in for a ResourceManager's YARN Service REST API, for the yarn backend's tests.

No ResourceManager can be installed on these machines (docs/backends.md, section yarn), so this
serves, on 127.0.0.1, only what the backend uses, and behaves as Hadoop's source says the real
one does (apache/hadoop, hadoop-yarn-services-api ApiServer.java, -core ServiceApiUtil.java,
AbstractClientProvider.java, AbstractProviderService.java, ProviderUtils.java,
ComponentInstance.java, ServiceScheduler.java, ServiceClient.java; hadoop-yarn-server-nodemanager
ContainerLaunch.java):

    POST   /app/v1/services           validate the spec (below); 202 + "Application ID: ..."; 400 with
                                      the reason; 500 "already taken" for a live name, or for a
                                      container larger than the cluster's maximum
    GET    /app/v1/services/NAME      the service: state, components[].containers[] (id, state,
                                      bare_host, component_instance_name, ...); once the
                                      application has finished only {name, id, state: STOPPED}
                                      (ServiceClient.getStatus: FINISHED and KILLED read STOPPED);
                                      404 when unknown or deleted
    PUT    /app/v1/services/NAME      {"state": "STOPPED"}: stop the containers (SIGTERM to their
                                      process group, SIGKILL 250 ms later, as the NodeManager);
                                      400 "already stopped"
    DELETE /app/v1/services/NAME      stop if running, then forget it (GET: 404)
    GET    /ws/v1/cluster/apps/ID     the application report: state, finalStatus, diagnostics

Every request needs ``user.name`` (simple auth with anonymous access off: 401 without it).

What POST validates (ServiceApiUtil.validateAndResolveService and the records' fields): every
object has only its documented fields (an unknown field is a 400, as Jackson's default
FAIL_ON_UNKNOWN_PROPERTIES would make it; the real RM may be laxer); types (strings, integers,
string maps); the name pattern ``[a-z][a-z0-9-]*``, no ``_``, at most 63 characters (44 for a
component: Registry DNS on); a version; at least one component; unique component names, none
equal to the service's; dependencies that exist and form no cycle; a launch_command (no Docker
artifact here); a resource with cpus > 0 and memory as a whole number of MB, no profile;
number_of_containers >= 0; restart_policy ALWAYS, ON_FAILURE or NEVER; config files: a type
from the enum, a dest_file that is one relative path element, unique, a src_file that exists
(``hdfs://HOST/PATH`` and ``hdfs:///PATH`` are read from ``hdfs_root``, ``file://`` from this
machine); no ``state`` or ``containers`` on POST; environment names a shell can export.

How a container runs (it really runs, locally, with the tree under test first on PYTHONPATH: the
nodes' admin environment, ``admin_env``): the service AM's substitutions
(``${COMPONENT_ID}``, ``${COMPONENT_INSTANCE_NAME}``, ``${USER}``, ``${DOMAIN}``, ...,
``${SCHEDULER-0_HOST}`` for dependents) in the env values, then every variable's name as a token
in the launch command (Java's replaceAll: a replacement holding ``$`` or ``\\`` fails the
launch); the AM's own variables (WORK_DIR, LOG_DIR, LANG, LC_ALL, LANGUAGE); the NodeManager's
(CONTAINER_ID, NM_HOST, USER, HOME, PWD, ...) and its expansions (``<LOG_DIR>``, ``<CPS>``,
``{{`` -> ``$``, ``}}`` -> nothing); then a ``launch_container.sh`` written line by line as the
NodeManager writes it, ``export NAME="VALUE"`` and ``exec /bin/bash -c "COMMAND 1>LOG/stdout.txt
2>LOG/stderr.txt"``, run with bash in a working directory of its own where the shipped files
are linked (STATIC) or unpacked (ARCHIVE). The process starts with PATH only (YARN passes a
whitelist, not the client's environment). Exit 0 -> SUCCEEDED, else FAILED; restart_policy is
taken as NEVER whatever it says (the backend sends NEVER).

Not emulated: queues and scheduling (containers start at once), Docker, readiness checks other
than "has an IP", flexing, upgrades, Kerberos, ZooKeeper and Registry DNS (the names do not
resolve).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NAME = 63
MAX_COMPONENT = 63 - len(str(2**63 - 1))  # ServiceApiUtil: 63 - length of Long.MAX_VALUE = 44
#: the tree under test (this file is TREE/tests/cluster/yarn_standin.py): the nodes' launchkit
TREE = Path(__file__).resolve().parents[2]

SERVICE_FIELDS = {
    "name", "version", "description", "id", "artifact", "resource", "launch_time",
    "number_of_running_containers", "lifetime", "placement_policy", "components", "configuration",
    "state", "quicklinks", "queue", "kerberos_principal", "docker_client_config",
}  # fmt: skip
COMPONENT_FIELDS = {
    "name", "state", "dependencies", "readiness_check", "artifact", "launch_command", "resource",
    "number_of_containers", "decommissioned_instances", "containers", "run_privileged_container",
    "placement_policy", "configuration", "quicklinks", "restart_policy",
}  # fmt: skip
RESOURCE_FIELDS = {"profile", "cpus", "memory", "additional"}
CONFIGURATION_FIELDS = {"properties", "env", "files"}
CONFIG_FILE_FIELDS = {"type", "dest_file", "src_file", "properties"}
CONFIG_FILE_TYPES = {
    "XML",
    "PROPERTIES",
    "JSON",
    "YAML",
    "TEMPLATE",
    "ENV",
    "HADOOP_XML",
    "STATIC",
    "ARCHIVE",
}
RESTART_POLICIES = {"ALWAYS", "ON_FAILURE", "NEVER"}
SERVICE_STATES = {
    "ACCEPTED", "STARTED", "STABLE", "STOPPED", "FAILED", "FLEX", "UPGRADING",
    "UPGRADING_AUTO_FINALIZE", "EXPRESS_UPGRADING", "SUCCEEDED", "CANCEL_UPGRADING",
}  # fmt: skip
LIFETIME_DIAG = "Application is killed by ResourceManager as it has exceeded the lifetime period."


class SpecError(ValueError):
    """A spec the RM would refuse (400), with its reason."""


# -- validation --------------------------------------------------------------------------------
def _obj(value: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a JSON object")
    for key in value:
        if key not in allowed:
            raise SpecError(f'Unrecognized field "{key}" in {where}, not marked as ignorable')
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{where}: expected a string, got {json.dumps(value)}")
    return value


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{where}: expected an integer, got {json.dumps(value)}")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected an object of strings")
    for k, v in value.items():
        _str(v, f"{where}.{k}")
    return value


def _name(name: str, limit: int, what: str) -> None:
    if not name:
        raise SpecError("Name can not be empty!")
    if "_" in name:
        raise SpecError(
            f"Invalid format: {name}, can not use '_', as DNS hostname does not allow '_'. Use '-' Instead. "
        )
    if len(name) > limit:
        raise SpecError(f"Invalid format {name}, {what} must be no more than {limit} characters ")
    if not NAME_RE.match(name):
        raise SpecError(f"Invalid format {name}: does not match [a-z][a-z0-9-]*")


def validate_service(body: Any, local_path: Any) -> None:
    """Raise SpecError unless ``body`` is a service the RM would accept for creation."""
    svc = _obj(body, "Service", SERVICE_FIELDS)
    name = _str(svc.get("name"), "Service.name") if svc.get("name") is not None else ""
    if not name:
        raise SpecError("Service name cannot be empty")
    if not svc.get("version") or not isinstance(svc.get("version"), str):
        raise SpecError(f"Version of service {name} is either empty or not provided")
    _name(name, MAX_NAME, "a service name")
    for key in ("state", "id", "launch_time", "number_of_running_containers"):
        if key in svc:
            raise SpecError(f"stand-in: {key} may not be given when creating a service")
    for key in ("description", "queue"):
        if key in svc:
            _str(svc[key], f"Service.{key}")
    if "lifetime" in svc:
        _int(svc["lifetime"], "Service.lifetime")
    if "artifact" in svc:
        raise SpecError("stand-in: artifacts (Docker, tarball, service) are not supported")
    if "configuration" in svc:
        _configuration(svc["configuration"], "Service.configuration", local_path)
    comps = svc.get("components")
    if not isinstance(comps, list) or not comps:
        raise SpecError(f"No component specified for {name}")
    names: list[str] = []
    for i, comp in enumerate(comps):
        where = f"Service.components[{i}]"
        c = _obj(comp, where, COMPONENT_FIELDS)
        cname = _str(c.get("name"), f"{where}.name")
        _name(cname, MAX_COMPONENT, "a component name")
        if cname == name:
            raise SpecError(f"Component name {cname} must not be same as service name {name}")
        if cname in names:
            raise SpecError(f"Component name collision: {cname}")
        names.append(cname)
        if "containers" in c or "state" in c:
            raise SpecError(f"{where}: containers and state are not allowed on POST")
        if "artifact" in c:
            raise SpecError("stand-in: artifacts (Docker, tarball, service) are not supported")
        if not isinstance(c.get("launch_command"), str) or not c["launch_command"]:
            raise SpecError("launch_command is not specified, this is required for non-docker components")
        res = c.get("resource")
        if res is None:
            raise SpecError(f"Resource for component {cname} is not specified")
        r = _obj(res, f"{where}.resource", RESOURCE_FIELDS)
        if r.get("profile"):
            raise SpecError("Resource profile is not supported yet")
        if not isinstance(r.get("memory"), str) or not r["memory"]:
            raise SpecError(f"Resource memory for component {cname} is not specified")
        if not r["memory"].isdigit():
            raise SpecError(f'For input string: "{r["memory"]}" (memory is a number of MB)')
        if r.get("cpus") is None:
            raise SpecError(f"Resource cpus for component {cname} is not specified")
        if _int(r["cpus"], f"{where}.resource.cpus") <= 0:
            raise SpecError(f"Resource cpus for component {cname} must be greater than zero")
        for rname, info in (r.get("additional") or {}).items():
            i_ = _obj(info, f"{where}.resource.additional.{rname}", {"value", "unit"})
            _int(i_.get("value"), f"{where}.resource.additional.{rname}.value")
            if "unit" in i_:
                _str(i_["unit"], f"{where}.resource.additional.{rname}.unit")
        n = c.get("number_of_containers")
        if n is None or _int(n, f"{where}.number_of_containers") < 0:
            raise SpecError(f"Invalid no of containers specified for component {cname}: {n}")
        if "restart_policy" in c and c["restart_policy"] not in RESTART_POLICIES:
            raise SpecError(
                f"{where}.restart_policy: {c['restart_policy']!r} is not one of {sorted(RESTART_POLICIES)}"
            )
        deps = c.get("dependencies", [])
        if not isinstance(deps, list):
            raise SpecError(f"{where}.dependencies: expected an array of strings")
        for d in deps:
            _str(d, f"{where}.dependencies[]")
        if "configuration" in c:
            _configuration(c["configuration"], f"{where}.configuration", local_path)
    for comp in comps:
        for d in comp.get("dependencies", []):
            if d not in names:
                raise SpecError(
                    f"Dependency {d} for component {comp['name']} is invalid, does not exist as a component"
                )
    dependency_order(comps)


def _configuration(value: Any, where: str, local_path: Any) -> None:
    conf = _obj(value, where, CONFIGURATION_FIELDS)
    if "properties" in conf:
        _str_map(conf["properties"], f"{where}.properties")
    if "env" in conf:
        env = _str_map(conf["env"], f"{where}.env")
        for k in env:
            if not ENV_NAME_RE.match(k):
                raise SpecError(f"{where}.env: {k!r} is not a name a launch script can export")
    dests: set[str] = set()
    files = conf.get("files", [])
    if not isinstance(files, list):
        raise SpecError(f"{where}.files: expected an array")
    for i, f in enumerate(files):
        fw = f"{where}.files[{i}]"
        cf = _obj(f, fw, CONFIG_FILE_FIELDS)
        if cf.get("type") is None:
            raise SpecError("File type is empty")
        if cf["type"] not in CONFIG_FILE_TYPES:
            raise SpecError(f"{fw}.type: {cf['type']!r} is not one of {sorted(CONFIG_FILE_TYPES)}")
        src = cf.get("src_file")
        if src:
            path = local_path(_str(src, f"{fw}.src_file"))
            if path is None or not Path(path).exists():
                raise SpecError(f"Src_file does not exist for config file: {src}")
        elif cf["type"] in ("STATIC", "ARCHIVE"):
            raise SpecError(f"{fw}: a {cf['type']} file needs a src_file")
        dest = cf.get("dest_file")
        if not dest:
            raise SpecError("Dest_file is empty.")
        _str(dest, f"{fw}.dest_file")
        if dest in dests:
            raise SpecError(f"Duplicated ConfigFile exists: {dest}")
        dests.add(dest)
        if dest.startswith("/"):
            raise SpecError(f"Dest_file {dest} must not be absolute for a component without docker")
        if len(Path(dest).parts) > 1:
            raise SpecError("Non-absolute dest_file has more than one path element")


def dependency_order(comps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    names: set[str] = set()
    while len(done) < len(comps):
        ready = [c for c in comps if c["name"] not in names and set(c.get("dependencies", [])) <= names]
        if not ready:
            raise SpecError(
                f"Invalid dependencies, a cycle may exist: {[c['name'] for c in comps if c['name'] not in names]}"
            )
        done += ready
        names |= {c["name"] for c in ready}
    return done


# -- what the AM and the NodeManager do to a container's command and environment -----------------
class LaunchError(RuntimeError):
    """The AM could not build the container's launch context."""


def java_replace_all(text: str, token: str, value: str) -> str:
    """``text.replaceAll(Pattern.quote(token), value)``: a replacement holding ``$`` or ``\\``
    means something to Java (group references, escapes); here it fails as it would there."""
    if token not in text:
        return text
    if "$" in value or "\\" in value:
        raise LaunchError(f"Illegal group reference: replacing {token} with {value!r}")
    return text.replace(token, value)


def substitute(text: str, tokens: dict[str, str]) -> str:
    for token, value in tokens.items():
        text = java_replace_all(text, token, value)
    return text


def nm_expand(text: str, log_dir: str) -> str:
    """ContainerLaunch.expandEnvironment on Linux."""
    text = text.replace("<LOG_DIR>", log_dir).replace("<CPS>", os.pathsep)
    return text.replace("{{", "$").replace("}}", "")


def registry_user(user: str) -> str:
    """RegistryUtils.registryUser, as the docs describe it: lowercase, ``_`` -> ``-``."""
    return user.split("@")[0].lower().replace("_", "-")


def launch_script(env: dict[str, str], command: str, log_dir: str) -> str:
    """launch_container.sh as ContainerLaunch's UnixShellScriptBuilder writes it."""
    lines = ["#!/bin/bash", ""]
    lines += [f'export {k}="{v}"' for k, v in env.items()]
    lines.append(f'exec /bin/bash -c "{command} 1>{log_dir}/stdout.txt 2>{log_dir}/stderr.txt"')
    return "\n".join(lines) + "\n"


# -- the model ---------------------------------------------------------------------------------
@dataclass
class Container:
    id: str
    component: str
    index: int
    workdir: Path
    logdir: Path
    launched: float
    state: str = "RUNNING_BUT_UNREADY"
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    killed: bool = False  # ended by a stop (PUT STOPPED, DELETE, lifetime)
    diagnostics: str = ""
    env: dict[str, str] = field(default_factory=dict)  # after YARN's substitutions
    command: str = ""

    @property
    def instance(self) -> str:
        return f"{self.component}-{self.index}"

    def view(self, bare_host: str, hostname: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "launch_time": int(self.launched * 1000),
            "ip": "127.0.0.1",
            "hostname": hostname,
            "bare_host": bare_host,
            "state": self.state,
            "component_instance_name": self.instance,
        }


@dataclass
class Service:
    name: str
    app_id: str
    user: str
    spec: dict[str, Any]
    submitted: float
    state: str = "ACCEPTED"
    app_state: str = "ACCEPTED"  # YarnApplicationState
    final_status: str = "UNDEFINED"
    diagnostics: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    destroyed: bool = False
    stop_requested: bool = False
    containers: dict[str, list[Container]] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.app_state in ("ACCEPTED", "RUNNING")

    def all_containers(self) -> list[Container]:
        return [c for cs in self.containers.values() for c in cs]


class StandinRM:
    """The stand-in: ``rm = StandinRM(tmp_path).start()``; ``rm.url``; ``rm.log``; ``rm.stop()``."""

    def __init__(
        self,
        root: Path,
        *,
        domain: str = "standin.test",
        hdfs_root: Path | None = None,
        accept_delay: float = 0.05,
        ready_delay: float = 0.05,
        am_linger: float = 0.3,
        kill_delay: float = 0.25,
        max_memory_mb: int = 8192,
        max_vcores: int = 8,
        api_enabled: bool = True,
        admin_env: dict[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        # yarn.nodemanager.admin-env: what the nodes' administrator sets in every container (by
        # default here: the tree under test first on PYTHONPATH, as on a cluster whose nodes have
        # this launchkit installed; the shim was the machine's installed launchkit's, whatever tree
        # the test ran from, and an older one could not read the current task tables)
        self.admin_env = {"PYTHONPATH": str(TREE)} if admin_env is None else dict(admin_env)
        self.root.mkdir(parents=True, exist_ok=True)
        self.domain = domain
        self.hdfs_root = Path(hdfs_root) if hdfs_root else self.root / "hdfs"
        self.hdfs_root.mkdir(parents=True, exist_ok=True)
        self.accept_delay = accept_delay
        self.ready_delay = ready_delay
        self.am_linger = am_linger
        self.kill_delay = kill_delay
        self.max_memory_mb = max_memory_mb
        self.max_vcores = max_vcores
        self.api_enabled = api_enabled  # yarn.webapp.api-service.enable (false by default in Hadoop)
        self.cluster_ts = int(time.time() * 1000)
        self.services: dict[str, Service] = {}
        self.apps: dict[str, Service] = {}
        self.log: list[tuple[str, str, Any]] = []  # (method, path, JSON body)
        self.errors: list[str] = []
        self.lock = threading.RLock()
        self._seq = 0
        self._cseq = 1
        self._stop = threading.Event()
        self.host = socket.gethostname()
        self.server: ThreadingHTTPServer | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> StandinRM:
        rm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                rm._handle(self, "GET")

            def do_POST(self) -> None:
                rm._handle(self, "POST")

            def do_PUT(self) -> None:
                rm._handle(self, "PUT")

            def do_DELETE(self) -> None:
                rm._handle(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._am_loop, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            for svc in self.services.values():
                self._kill_all(svc)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def requests(self, method: str | None = None) -> list[tuple[str, str, Any]]:
        with self.lock:
            return [r for r in self.log if method is None or r[0] == method]

    def service(self, name: str | None = None) -> Service:
        """The service called ``name`` (default: the only one submitted)."""
        with self.lock:
            if name is None:
                (name,) = list(self.services)
            return self.services[name]

    # -- HTTP ---------------------------------------------------------------------------------
    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        h.send_response(status)
        if body is not None:
            h.send_header("Content-Type", "application/json;charset=utf-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                self._log(method, url.path, raw.decode(errors="replace"))
                return self._reply(h, 400, {"diagnostics": f"malformed JSON: {exc}"})
        self._log(method, url.path, body)
        user = (query.get("user.name") or [""])[0]
        if not user:
            return self._reply(h, 401, {"diagnostics": "Authentication required (user.name)"})
        if method in ("POST", "PUT") and not (h.headers.get("Content-Type") or "").startswith(
            "application/json"
        ):
            return self._reply(h, 415, {"diagnostics": "Unsupported Media Type"})
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        try:
            if parts[:3] == ["app", "v1", "services"] and self.api_enabled:
                if len(parts) == 3 and method == "POST":
                    return self._create(h, user, body)
                if len(parts) == 4 and parts[3] == "version" and method == "GET":
                    return self._reply(h, 200, {"hadoop_version": "3.3.6 (launchkit stand-in)"})
                if len(parts) == 4:
                    return self._service_call(h, method, parts[3], body)
            if parts[:4] == ["ws", "v1", "cluster", "apps"] and len(parts) == 5 and method == "GET":
                return self._app(h, parts[4])
        except SpecError as exc:
            return self._reply(h, 400, {"diagnostics": str(exc)})
        return self._reply(h, 404, {"diagnostics": f"no such endpoint: {method} {url.path}"})

    def _log(self, method: str, path: str, body: Any) -> None:
        with self.lock:
            self.log.append((method, path, body))

    def local_path(self, src: str) -> Path | None:
        u = urllib.parse.urlsplit(src)
        if u.scheme == "hdfs":
            return self.hdfs_root / u.path.lstrip("/")
        if u.scheme == "file":
            return Path(u.path)
        raise SpecError(f'No FileSystem for scheme "{u.scheme}"')

    def _create(self, h: BaseHTTPRequestHandler, user: str, body: Any) -> None:
        validate_service(body, self.local_path)
        for comp in body["components"]:  # ServiceApiUtil.validateCompResourceSize, in actionCreate
            mem, cpus = int(comp["resource"]["memory"]), comp["resource"]["cpus"]
            if mem > self.max_memory_mb or cpus > self.max_vcores:
                what = (
                    f"specified memory size ({mem}) is larger than configured max container memory size "
                    f"({self.max_memory_mb})"
                    if mem > self.max_memory_mb
                    else f"specified number of virtual core ({cpus}) is larger than configured max virtual "
                    f"core size ({self.max_vcores})"
                )
                return self._reply(h, 500, {"diagnostics": f"Component {comp['name']}: {what}"})
        with self.lock:
            name = body["name"]
            old = self.services.get(name)
            if old is not None and not old.destroyed:
                return self._reply(h, 500, {"diagnostics": f"Service name {name} is already taken."})
            self._seq += 1
            app_id = f"application_{self.cluster_ts}_{self._seq:04d}"
            svc = Service(name, app_id, user, json.loads(json.dumps(body)), time.monotonic())
            self.services[name] = svc
            self.apps[app_id] = svc
        self._reply(
            h,
            202,
            {
                "uri": f"/app/v1/services/{name}",
                "diagnostics": f"Application ID: {app_id}",
                "state": "ACCEPTED",
            },
        )

    def _service_call(self, h: BaseHTTPRequestHandler, method: str, name: str, body: Any) -> None:
        with self.lock:
            svc = self.services.get(name)
            if svc is None or svc.destroyed:
                return self._reply(h, 404, {"diagnostics": f"Service {name} not found", "code": 404})
            if method == "GET":
                return self._reply(h, 200, self.view(svc))
            if method == "PUT":
                update = _obj(body, "Service", SERVICE_FIELDS)
                if update.get("state") not in SERVICE_STATES:
                    raise SpecError(f"Service.state: {update.get('state')!r} is not a ServiceState")
                if update["state"] != "STOPPED":
                    raise SpecError(f"stand-in: only state STOPPED is implemented, not {update['state']}")
                if not svc.running:
                    return self._reply(h, 400, {"diagnostics": f"Service {name} is already stopped"})
                self._stop_service(svc, "ENDED", "stopped by PUT state STOPPED")
                return self._reply(h, 200, {"diagnostics": f"Successfully stopped service {name}"})
            if method == "DELETE":
                if svc.running:
                    self._stop_service(svc, "ENDED", "stopped by DELETE")
                svc.destroyed = True
                return self._reply(h, 200, {"diagnostics": f"Successfully destroyed service {name}"})
        self._reply(h, 405, {"diagnostics": f"{method} not allowed"})

    def _app(self, h: BaseHTTPRequestHandler, app_id: str) -> None:
        with self.lock:
            svc = self.apps.get(app_id)
            if svc is None:
                return self._reply(
                    h, 404, {"RemoteException": {"message": f"app with id: {app_id} not found"}}
                )
            app = {
                "id": app_id,
                "user": svc.user,
                "name": svc.name,
                "queue": svc.spec.get("queue", "default"),
                "state": "RUNNING" if svc.app_state == "RUNNING" else svc.app_state,
                "finalStatus": svc.final_status,
                "diagnostics": svc.diagnostics,
                "applicationType": "yarn-service",
            }
        self._reply(h, 200, {"app": app})

    def view(self, svc: Service) -> dict[str, Any]:
        """GET's answer: the AM's view while the application runs, else ServiceClient's stub."""
        if not svc.running:
            return {
                "name": svc.name,
                "id": svc.app_id,
                "state": "FAILED" if svc.app_state == "FAILED" else "STOPPED",
            }
        comps = []
        for comp in svc.spec["components"]:
            cs = svc.containers.get(comp["name"], [])
            user = registry_user(svc.user)
            comps.append(
                {
                    **{k: v for k, v in comp.items() if k != "configuration"},
                    "configuration": comp.get("configuration", {}),
                    "state": _component_state(comp, cs),
                    "containers": [
                        c.view(self.host, f"{c.instance}.{svc.name}.{user}.{self.domain}") for c in cs
                    ],
                }
            )
        return {
            "name": svc.name,
            "id": svc.app_id,
            "version": svc.spec["version"],
            "state": svc.state,
            "lifetime": svc.spec.get("lifetime", -1),
            "queue": svc.spec.get("queue", "default"),
            "components": comps,
            "configuration": svc.spec.get("configuration", {"properties": {}, "env": {}, "files": []}),
            "number_of_running_containers": sum(1 for c in svc.all_containers() if c.exit_code is None),
        }

    # -- the service AM -----------------------------------------------------------------------
    def _am_loop(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                for svc in list(self.services.values()):
                    try:
                        self._step(svc)
                    except Exception as exc:  # a stand-in bug: kept for the tests to show
                        self.errors.append(f"{svc.name}: {exc!r}")
            time.sleep(0.02)

    def _step(self, svc: Service) -> None:
        now = time.monotonic()
        if not svc.running:
            return
        if svc.state == "ACCEPTED":
            if now - svc.submitted < self.accept_delay:
                return
            svc.state, svc.app_state, svc.started_at = "STARTED", "RUNNING", now
        if svc.finished_at is not None:  # the AM has set its final state and is exiting
            if now - svc.finished_at >= self.am_linger:
                svc.app_state = "FINISHED"
            return
        lifetime = svc.spec.get("lifetime")
        if lifetime and svc.started_at is not None and now - svc.started_at > lifetime:
            self._stop_service(svc, "KILLED", LIFETIME_DIAG, app_state="KILLED")
            return
        comps = dependency_order(svc.spec["components"])
        for comp in comps:
            cname = comp["name"]
            if cname in svc.containers:
                continue
            deps = comp.get("dependencies", [])
            if all(self._ready_for_downstream(svc, d) for d in deps):
                svc.containers[cname] = [
                    self._launch(svc, comp, i) for i in range(comp["number_of_containers"])
                ]
        for c in svc.all_containers():
            if c.exit_code is None and c.proc is not None and c.proc.poll() is not None:
                rc = c.proc.returncode
                c.exit_code = rc
                c.state = "SUCCEEDED" if rc == 0 else "FAILED"
            elif c.state == "RUNNING_BUT_UNREADY" and now - c.launched >= self.ready_delay:
                c.state = "READY"
        launched = all(comp["name"] in svc.containers for comp in comps)
        everything = svc.all_containers()
        if launched and all(c.state in ("SUCCEEDED", "FAILED") for c in everything):
            failed = any(c.state == "FAILED" for c in everything)
            svc.state = "FAILED" if failed else "SUCCEEDED"
            svc.final_status = svc.state
            svc.finished_at = now
        elif launched and everything and all(c.state == "READY" for c in everything):
            svc.state = "STABLE"

    def _ready_for_downstream(self, svc: Service, name: str) -> bool:
        cs = svc.containers.get(name)
        if cs is None:
            return False
        return all(c.state in ("READY", "SUCCEEDED", "FAILED") for c in cs)

    def _launch(self, svc: Service, comp: dict[str, Any], index: int) -> Container:
        self._cseq += 1
        app_seq = svc.app_id.rsplit("_", 1)[1]
        cid = f"container_{self.cluster_ts}_{app_seq}_01_{self._cseq:06d}"
        base = self.root / svc.app_id / cid
        workdir, logdir = base / "work", base / "logs"
        workdir.mkdir(parents=True)
        logdir.mkdir(parents=True)
        c = Container(cid, comp["name"], index, workdir, logdir, time.monotonic())
        try:
            self._start_container(svc, comp, c)
        except (LaunchError, OSError) as exc:
            c.state, c.exit_code, c.diagnostics = "FAILED", -1, f"failed before launch: {exc}"
        return c

    def _start_container(self, svc: Service, comp: dict[str, Any], c: Container) -> None:
        user = registry_user(svc.user)
        tokens = {
            "${SERVICE_NAME}": svc.name,
            "${SERVICE_NAME_LC}": svc.name.lower(),
            "${USER}": user,
            "${DOMAIN}": self.domain,
            "${CLUSTER_FS_URI}": "hdfs://standin",
            "${COMPONENT_NAME}": comp["name"],
            "${COMPONENT_NAME_LC}": comp["name"].lower(),
            "${COMPONENT_INSTANCE_NAME}": c.instance,
            "${CONTAINER_ID}": c.id,
            "${COMPONENT_ID}": str(c.index),
        }
        for dep in comp.get("dependencies", []):
            for d in svc.containers.get(dep, []):
                tokens[f"${{{d.instance.upper()}_HOST}}"] = self.host
                tokens[f"${{{d.instance.upper()}_IP}}"] = "127.0.0.1"
        conf_env = {
            **svc.spec.get("configuration", {}).get("env", {}),
            **comp.get("configuration", {}).get("env", {}),
        }
        env = {k: substitute(v, tokens) for k, v in conf_env.items()}  # ServiceUtils.buildEnvMap
        env.update(
            {
                "WORK_DIR": "$PWD",
                "LOG_DIR": "<LOG_DIR>",
                "LANG": "en_US.UTF-8",
                "LC_ALL": "en_US.UTF-8",
                "LANGUAGE": "en_US.UTF-8",
            }
        )
        command_tokens = {**tokens, **{f"${{{k}}}": v for k, v in env.items()}}
        command = substitute(comp["launch_command"], command_tokens)
        env.update(
            {
                "CONTAINER_ID": c.id,
                "NM_HOST": self.host,
                "NM_PORT": "45454",
                "NM_HTTP_PORT": "8042",
                "LOCAL_DIRS": str(c.workdir.parent),
                "LOCAL_USER_DIRS": str(c.workdir.parent),
                "LOG_DIRS": str(c.logdir),
                "USER": svc.user,
                "LOGNAME": svc.user,
                "HOME": "/home/",
                "PWD": str(c.workdir),
                "JVM_PID": "$$",
            }
        )
        for k, v in self.admin_env.items():
            env.setdefault(k, v)
        env = {k: nm_expand(v, str(c.logdir)) for k, v in env.items()}
        command = nm_expand(command, str(c.logdir))
        c.env, c.command = env, command
        for f in comp.get("configuration", {}).get("files", []):
            src = self.local_path(f["src_file"])
            assert src is not None
            dest = c.workdir / f["dest_file"]
            if f["type"] == "ARCHIVE":
                shutil.unpack_archive(str(src), str(dest))
            else:
                dest.symlink_to(src)
        script = c.workdir.parent / "launch_container.sh"
        script.write_text(launch_script(env, command, str(c.logdir)))
        with open(c.logdir / "prelaunch.out", "wb") as out, open(c.logdir / "prelaunch.err", "wb") as err:
            c.proc = subprocess.Popen(
                ["bash", str(script)],
                cwd=c.workdir,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def _stop_service(
        self, svc: Service, final_status: str, diagnostics: str, app_state: str = "FINISHED"
    ) -> None:
        svc.stop_requested = True
        self._kill_all(svc)
        svc.state = "STOPPED"
        svc.final_status = final_status
        svc.diagnostics = diagnostics
        svc.app_state = app_state

    def _kill_all(self, svc: Service) -> None:
        """As the NodeManager: SIGTERM to each container's process group, SIGKILL after a delay."""
        live = [c for c in svc.all_containers() if c.proc is not None and c.proc.poll() is None]
        for c in live:
            c.killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
        if live:
            time.sleep(self.kill_delay)
        for c in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(5)  # type: ignore[union-attr]
            c.exit_code = c.proc.returncode  # type: ignore[union-attr]
            c.state = "STOPPED"


def _component_state(comp: dict[str, Any], cs: list[Container]) -> str:
    if not cs:
        return "INIT"
    if all(c.state == "SUCCEEDED" for c in cs):
        return "SUCCEEDED"
    if all(c.state in ("SUCCEEDED", "FAILED") for c in cs):
        return "FAILED"
    if len(cs) == comp["number_of_containers"] and all(c.state == "READY" for c in cs):
        return "STABLE"
    return "FLEXING"
